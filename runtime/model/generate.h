// Answer generation after a prefill (docs/design.md §3.6): sample from the last logits, then decode
// one token at a time over the cache until a stop token or the token budget.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/model/model.h"
#include "runtime/model/sampling.h"

namespace infoflow {

// Sees each answer token as soon as it is sampled (not the stop token); returning false ends the
// generation after that token (a server's client went away, a stop string matched, a deadline
// passed). In a distributed decode only rank 0 calls it, and its decision reaches every rank.
using TokenCallback = std::function<bool(int32_t token)>;

struct GenerateOptions {
    int max_new_tokens = 32;
    std::vector<int32_t> stop_ids;
    SamplingParams sampling;
    int32_t group = -1;      // visibility group of decode rows (docs/design.md §5.2); -1 = none
    TokenCallback on_token;  // optional
};

struct GenerateResult {
    std::vector<int32_t> tokens;  // generated ids, without the stop token
    bool stopped = false;         // ended on a stop token
    bool cancelled = false;       // ended because on_token returned false
    double decode_ms = 0.0;       // time of the decode steps after the first token
};

// `first_logits` are the logits after the last prompt token, whose position is next_pos - 1.
// The cache needs room for max_new_tokens more slots.
GenerateResult generate(Model& model, KvCache& cache, const std::vector<float>& first_logits,
                        int32_t next_pos, const GenerateOptions& opt);

// One decode step: appends `token` at `pos` and returns the logits after it.
std::vector<float> decode_step(Model& model, KvCache& cache, int32_t token, int32_t pos,
                               int32_t group = -1);

// The logits of every step of `ref` under teacher forcing over `cache`, whose first `slots`
// slots hold a finished prompt of `prompt` positions (0..prompt-1; slots = -1: `prompt`, the
// single-rank cache; fewer on a rank of a distributed run): row 0 is `first_logits` (the
// prediction of ref[0]), row t >= 1 the prediction of ref[t] after ref[0..t-1] were fed at
// positions prompt.. . The cache is cut back to `slots` slots before and after. Rows:
// max(1, ref.size()). `group` is the visibility group of the fed rows (-1 none). Used by job
// `sweep` (runtime/jobs/fidelity.h) and the sequence-parallel pipeline's teacher forcing.
std::vector<float> teacher_forced_logits(Model& model, KvCache& cache, int prompt,
                                         const std::vector<float>& first_logits /*[n_vocab]*/,
                                         const std::vector<int32_t>& ref, int32_t group = -1,
                                         int slots = -1) /*[rows, n_vocab]*/;

}  // namespace infoflow
