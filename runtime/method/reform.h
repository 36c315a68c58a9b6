// REFORM and its baselines (docs/design.md §4.1, docs/reform.md): inputs far longer than the
// model's window.
//   Phase 1, compress: the context is fed in chunks (reform.chunk_size); after each chunk the
//   cache is compressed to reform.budget tokens (kv_evict.h: H2O heavy hitters + recent window,
//   or StreamingLLM sinks + recent window), kept tokens re-positioned contiguously. REFORM also
//   saves the pre-RoPE Q/K/V state of chosen heads (reform.heads) of every input token, each
//   head L2-normalized and concatenated, and stops after the deepest chosen layer (early exit).
//   Phase 2, gather: the question is embedded the same way over the final cache; a token scores
//   its maximum cosine similarity over the question tokens, max-pooled over reform.pool tokens;
//   the top reform.gather tokens plus the first and last reform.keep_ends are kept, in order.
//   Phase 3, recompute: the gathered token ids run through the full model as a new contiguous
//   sequence (positions 0..n-1), then the suffix and the answer.
// `h2o` and `streamingllm` run phase 1 over all layers and answer from the compressed cache.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/config/config.h"
#include "runtime/method/pipeline.h"
#include "runtime/method/request.h"
#include "runtime/model/model.h"

namespace infoflow {

// True for reform, h2o and streamingllm.
bool is_long_context_method(Config::Method m);

// Per-token retrieval embeddings: `heads` blocks of head_dim floats per token, each block a unit
// vector (or zero when the state is zero).
struct Embeddings {
    int heads = 0;
    int head_dim = 0;
    std::vector<float> data;  // [n, heads * head_dim]
    int dim() const { return heads * head_dim; }
    int size() const { return dim() > 0 ? int(data.size() / size_t(dim())) : 0; }
    const float* row(int i) const { return data.data() + size_t(i) * dim(); }
};

struct RecurrentSpec {
    bool streaming = false;  // true: sinks + recent (streamingllm); false: H2O heavy hitters
    int chunk = 1024;
    int budget = 2048;
    int recent = 256;
    int sink = 4;
    int n_layers = 0;  // layers run per step (early exit below the model's depth)
    std::vector<Config::ReformHead> heads;  // states saved as embeddings
};

// The spec of cfg.method.name for `model` (checks the heads against the model's shape and the
// cache against its positions).
RecurrentSpec recurrent_spec(const Config& cfg, const ModelConfig& mc);

// The recurrent chunked forward of phase 1 over one cache.
class RecurrentForward {
  public:
    // Room for budget + max(chunk, extra) slots.
    RecurrentForward(Model& model, const RecurrentSpec& spec, int extra = 0);
    ~RecurrentForward();
    RecurrentForward(const RecurrentForward&) = delete;
    RecurrentForward& operator=(const RecurrentForward&) = delete;

    // Feeds `tokens` in chunks, compressing after each; their embeddings appended to *emb.
    void feed_context(const std::vector<int32_t>& tokens, Embeddings* emb);
    // Appends rows without compression (the question or suffix); returns the logits of the last
    // row when spec.n_layers is the model's depth and `want_logits`, else {}.
    std::vector<float> feed_rows(const std::vector<int32_t>& tokens, Embeddings* emb,
                                 bool want_logits);

    KvCache& cache();
    int peak_slots() const { return peak_; }  // the most cache slots in use so far
    int compressions() const { return compressions_; }
    // Accumulated attention of each slot of `layer` (H2O statistics).
    const std::vector<double>& accumulated(int layer) const;

  private:
    class Tap;
    void step(const int32_t* tokens, int n, Embeddings* emb, bool accumulate);
    void compress();

    Model& model_;
    RecurrentSpec spec_;
    KvCache cache_;
    std::vector<std::vector<double>> acc_;  // [layer][slot]
    Buffer hidden_;
    int hidden_rows_ = 0;
    int peak_ = 0;
    int compressions_ = 0;
};

// Phase 2 pieces, pure functions on host vectors.
// score[j] = max over question rows i of cos(q_i, ctx_j) (the mean of the per-head cosines).
std::vector<float> retrieval_scores(const Embeddings& ctx, const Embeddings& question);
// out[j] = max of s over [j - window/2, j + window/2] inside the vector (window odd).
std::vector<float> max_pool(const std::vector<float>& s, int window);
// The `gather` indices with the largest score over the whole vector (ties: the lower index),
// united with the first and last `keep_ends`; sorted. At most gather + 2 keep_ends: top
// indices inside the ends are not replaced by lower-scoring ones.
std::vector<int> gather_indices(const std::vector<float>& pooled, int gather, int keep_ends);

// Phase 1 shards on P ranks (docs/design.md §5.1): contiguous, token-balanced; shard s covers
// [bounds[s], bounds[s+1]) of the context and lives on rank P-1-s (rank 0 holds the last).
std::vector<int> shard_bounds(int T, int P);

// Phase 1 of REFORM over context tokens [begin, end): their embeddings, and when `question` is
// given the question rows' embeddings over the final cache (the suffix is fed whole; its
// question rows are kept). `peak` (optional) gets the most cache slots used.
Embeddings reform_compress(Model& model, const PreparedRequest& req, const RecurrentSpec& spec,
                           int begin, int end, Embeddings* question, int* peak = nullptr);

// Phase 3 on one rank: the gathered context tokens (indices into the context sequence) as a
// new sequence, then the suffix and the decode; fills the result's answer fields and times
// "recompute", "suffix_prefill" and "decode" into r.phases.
void reform_answer(Model& model, const PreparedRequest& req, const Config& cfg,
                   const std::vector<int32_t>& stop_ids, const std::vector<int>& gathered,
                   MethodResult& r);

// The whole method on one rank (with parallel.emulate_ranks = P, REFORM's phase 1 runs the P
// shards one after another, the oracle of the distributed run).
MethodResult run_long_context(Model& model, const PreparedRequest& req, const Config& cfg,
                              const std::vector<int32_t>& stop_ids);

}  // namespace infoflow
