// Teacher-forced fidelity of a method to the exact run (job `sweep`, output.logits_file): a
// reference continuation (`full`'s greedy answer, or a gold answer) is fed token by token over a
// finished run's cache, and the run's next-token distribution at every step is compared with
// `full`'s at the same step: KL(full || method) per token, the log-likelihood of the reference
// under the method, and argmax agreement along the whole answer. The full-vocabulary first-token
// log-probs can be dumped as a raw float32 file (layout in docs/results-schema.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model/generate.h"  // teacher_forced_logits
#include "runtime/model/model.h"
#include "runtime/model/sampling.h"  // log_softmax

namespace infoflow {

// A method's teacher-forced rows against the reference (`full`) rows on the same tokens.
struct Fidelity {
    int steps = 0;           // rows compared: max(1, |ref|)
    std::vector<double> kl;  // [steps] KL(full || method), nats
    double mean_kl = 0.0;    // mean over steps
    double max_kl = 0.0;
    double ref_logprob = 0.0;  // sum over ref tokens of log p_method(ref[t]) (0 when |ref| = 0)
    double ref_logprob_full = 0.0;  // the same under `full`
    double argmax_agree = 0.0;      // fraction of steps where argmax method == argmax full
    double ref_hit = 0.0;           // fraction of ref tokens that are the method's argmax
    bool all_hit = false;           // every ref token is the argmax: greedy reproduces `ref`
    int first_miss = -1;            // first step whose argmax differs from full's; -1 none
};
Fidelity compare_teacher_forced(const std::vector<float>& full_rows /*[steps, n_vocab]*/,
                                const std::vector<float>& rows /*[steps, n_vocab]*/,
                                const std::vector<int32_t>& ref, int n_vocab);

// Writes log_softmax(logits) as n_vocab little-endian float32 values, nothing else (atomically:
// a temporary file renamed into place). Errors name the path.
void write_logprobs_file(const std::string& path, const std::vector<float>& logits /*[n_vocab]*/);
// Reads such a file back (its size must be a multiple of 4 bytes).
std::vector<float> read_logprobs_file(const std::string& path);

}  // namespace infoflow
