// The transformer forward pass on a Backend, exposed per layer so that the method code can run
// chunk prefill, selective recompute (new K/V written into existing cache slots), scoring
// passes with early exit, and decode steps with the same code (docs/design.md §3).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kernels/backend.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/weights.h"

namespace infoflow {

// Observes a layer during `layer_forward` (scoring, state taps): called after the rows'
// attention, with their post-RoPE queries, the LSE of that attention and the cache they attended
// over (their own new K/V included).
class LayerTap {
  public:
    virtual ~LayerTap() = default;
    virtual bool wants(int layer) const = 0;
    virtual void on_attention(int layer, const float* q /*[n, n_head, head_dim]*/,
                              const float* lse /*[n, n_head]*/, int n, const int32_t* pos /*[n]*/,
                              const int32_t* group /*[n] or nullptr*/, const KvCache& cache) = 0;
};

class Model {
  public:
    // Keeps a reference to `weights`. The CPU backend reads host weights in place; any other
    // backend (or a generated model) gets every tensor once, here, in its own storage.
    Model(Backend& backend, const ModelWeights& weights);
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const ModelConfig& config() const { return weights_.config; }
    const ModelWeights& weights() const { return weights_; }
    Backend& backend() { return backend_; }
    const std::vector<float>& inv_freq() const { return inv_freq_host_; }

    // Caches store K/V as `kv_dtype()` (model.kv_dtype; f32 unless set).
    KvCache make_cache(int capacity) { return KvCache(backend_, config(), capacity, kv_dtype_); }
    void set_kv_dtype(KvDtype t) { kv_dtype_ = t; }
    KvDtype kv_dtype() const { return kv_dtype_; }

    // hidden[i, :] = embedding of ids[i]
    void embed(const int32_t* ids /*[n]*/, int n, float* hidden /*[n, n_embd]*/);

    // Runs layer `l` in place on `hidden`. The rows' K/V (RoPE at `pos`) are written into cache
    // slots `slots` first, then the rows attend over cache slots [0, cache.size()) under the
    // visibility rule (key_pos <= query_pos, plus groups when `group` is given).
    void layer_forward(int l, float* hidden /*[n, n_embd]*/, int n, const int32_t* pos /*[n]*/,
                       const int32_t* group /*[n] or nullptr*/, const int32_t* slots /*[n]*/,
                       KvCache& cache, LayerTap* tap = nullptr);
    // layer_forward (no tap) with the rows' attention and MLP cut into piece_ranges(n) after the
    // K/V of all rows are written, each piece reported to piece_done as rows / n_layer: job
    // serve's decode steps can then come between them (runtime/core/pieces.h). The same bits
    // as layer_forward where piece_rows() splits at all (row-independent products, pieces of at
    // least kMinPieceRows rows); outside a PieceScope it is layer_forward plus one report.
    void layer_forward_pieces(int l, float* hidden, int n, const int32_t* pos, const int32_t* group,
                              const int32_t* slots, KvCache& cache);

    // K and V of layer `l` for the rows (RoPE at `pos`), without attention or cache writes.
    void layer_kv(int l, const float* hidden /*[n, n_embd]*/, int n, const int32_t* pos /*[n]*/,
                  float* k_out /*[n, n_head_kv*head_dim]*/,
                  float* v_out /*[n, n_head_kv*head_dim]*/);

    // The two halves of `layer_forward`, for callers that compute attention themselves
    // (distributed attention, docs/design.md §5): layer_qkv = RMSNorm, projections (+ q/k norm), RoPE at
    // `pos`; layer_post = hidden += attn Wo^T, then hidden += MLP(RMSNorm(hidden)).
    void layer_qkv(int l, const float* hidden /*[n, n_embd]*/, int n, const int32_t* pos /*[n]*/,
                   float* q_out /*[n, n_head*head_dim]*/, float* k_out /*[n, n_head_kv*head_dim]*/,
                   float* v_out /*[n, n_head_kv*head_dim]*/);
    void layer_post(int l, float* hidden /*[n, n_embd]*/,
                    const float* attn /*[n, n_head*head_dim]*/, int n);

    // Final RMSNorm and LM head: out = logits of each row.
    void logits(const float* hidden /*[n, n_embd]*/, int n, float* out /*[n, n_vocab]*/);

    // Rotates keys by per-token deltas (global - local position), docs/design.md §3.2.
    void rerotate_keys(float* k /*[n, n_head_kv, head_dim]*/, int n, const int32_t* delta /*[n]*/);

    // Decode steps (one new token per step, docs/design.md §3.6) multiply quantized weights by
    // 8-bit activations, as llama.cpp does; every other pass keeps fp32 activations and the
    // fixed-order product of docs/design.md §6.4. A DecodeScope marks the steps of a generation
    // loop on the calling thread (per thread, not per Model: the emulated ranks of
    // bench.emulate_timing share one Model from their own threads); it is a property of the
    // pass, never of how many rows a call carries.
    class DecodeScope {
      public:
        explicit DecodeScope(Model&) { ++decode_depth(); }
        ~DecodeScope() { --decode_depth(); }
        DecodeScope(const DecodeScope&) = delete;
        DecodeScope& operator=(const DecodeScope&) = delete;
    };
    static bool decoding() { return decode_depth() > 0; }

    // Convenience: appends `tokens` at `pos` (groups optional) to the cache, runs all layers, and
    // returns the logits of the last row ([n_vocab]) or of every row ([n, n_vocab]).
    std::vector<float> forward(KvCache& cache, const std::vector<int32_t>& tokens,
                               const std::vector<int32_t>& pos, bool all_logits = false,
                               const std::vector<int32_t>* group = nullptr);

  private:
    void layer_forward_rows(int l, float* hidden, int n, const int32_t* pos, const int32_t* group,
                            const int32_t* slots, KvCache& cache, LayerTap* tap, bool pieces);
    struct Scratch {
        int n = 0;
        Buffer xn, q, k, v, attn, lse, gate, up, qkv;
    };
    void ensure_scratch(int n);
    void qkv(int l, const float* xn, int n, const int32_t* pos, float* q, float* k, float* v);
    void load_weights();  // every tensor into backend storage (not the CPU in-place path)
    void stack_qkv();     // CPU in place: wq, wk, wv stacked per layer
    const float* w(const std::vector<float>& v);  // weight pointer in backend memory
    // out = x W^T with W in fp32 (w32) or, when `stored` is not empty, in its stored type.
    void mm(const float* x /*[n, k]*/, const std::vector<float>& w32, const StoredMatrix& stored,
            const float* bias /*[m] or nullptr*/, int n, int k, int m, float* out /*[n, m]*/,
            bool accumulate, bool lm_head = false);
    const std::vector<float>& lm_head() const;

    Backend& backend_;
    const ModelWeights& weights_;
    bool host_weights_ = true;
    // Backend copy of each tensor of `weights_`, by the address of its host vector.
    std::unordered_map<const std::vector<float>*, Buffer> device_;
    // CPU in place only. Per layer: wq, wk, wv stacked into one [(n_head + 2*n_head_kv)*head_dim,
    // n_embd] matrix (and their biases), so the three projections run as one wide GEMM.
    std::vector<std::vector<float>> wqkv_, bqkv_;
    std::vector<float> inv_freq_host_;
    Buffer inv_freq_;
    Buffer pos_buf_;
    Scratch s_;
    KvDtype kv_dtype_ = KvDtype::f32;
    static int& decode_depth() {
        static thread_local int depth = 0;  // DecodeScopes open on this thread
        return depth;
    }
};

}  // namespace infoflow
