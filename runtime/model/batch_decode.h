// Decode steps of several generations at once (job serve's batch, docs/serve.md "Batching"): one
// forward over the next token of every running request, each request with its own KV cache.
// Each row attends over its own cache alone, and with the stored-type weights of the CPU backend
// (model.weights = "native", the default) the projections and the LM head take every request's
// row in one product, which gives each row the bits it gets alone (a decode pass's products are
// row-independent: tests/kernels "whatever batch, offset and threads"). Where that is not known
// (fp32 weights, generated models, other backends) each row runs its own pass. Either way a
// request's logits are the bits `decode_step` gives it on its cache alone
// (tests/model/test_batch_decode.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/generate.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/model/sampling.h"

namespace infoflow {

// Whether every product of the model gives a row the same bits whatever rows share its call, in
// every pass: the stored-type products of the CPU backend (model.weights = "native") do
// (docs/design.md §6.4, tests/kernels "whatever batch"); fp32 weights (model.weights = "f32",
// generated models: no test holds them to it) and other backends are not known to. Decode
// steps then share one product (decode_batch), and job serve cuts long prefills into pieces.
bool products_row_independent(Model& model);

// One request's row of a batched decode step.
struct DecodeRow {
    KvCache* cache = nullptr;  // the request's own cache; the step appends one slot to it
    int32_t token = 0;
    int32_t pos = 0;
    int32_t group = -1;  // visibility group of the row (-1 none), as decode_step's
};

// Appends each row's token at its position to its own cache and returns the logits after it,
// row i for rows[i] ([n, n_vocab]). A decode pass (Model::DecodeScope) whatever the caller.
// No cache may appear twice.
std::vector<float> decode_batch(Model& model, const std::vector<DecodeRow>& rows)
    /*[n, n_vocab]*/;

// One generation as `generate` runs it, a step at a time, so that a caller can advance many
// together (decode_batch): sample() picks the next token from the current logits and says
// whether a decode step over it is needed; after the step, set_logits() hands back its row.
// The sampler, the stop tokens, on_token and max_new_tokens act exactly as in `generate`.
class Generator {
  public:
    // `first_logits` ([n_vocab]) follow the last prompt token at next_pos - 1.
    Generator(const Model& model, std::vector<float> first_logits, int32_t next_pos,
              GenerateOptions opt);

    // Samples the next token. Returns true when the generation goes on: the caller then runs a
    // decode step over token() at pos() and calls set_logits(); false when it ended (a stop
    // token, on_token returned false, max_new_tokens reached), result() then final.
    bool sample();
    int32_t token() const { return token_; }
    int32_t pos() const { return next_pos_; }
    int32_t group() const { return opt_.group; }
    // The logits of the step over token() ([n_vocab]); the next position follows.
    void set_logits(const float* row /*[n_vocab]*/);

    bool done() const { return done_; }
    const GenerateResult& result() const { return result_; }

  private:
    GenerateOptions opt_;
    Sampler sampler_;
    int n_vocab_ = 0;
    int n_ctx_ = 0;
    std::vector<float> logits_;
    int32_t next_pos_ = 0;
    int32_t token_ = -1;
    int step_ = 0;
    bool done_ = false;
    GenerateResult result_;
};

}  // namespace infoflow
