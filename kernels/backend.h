// The compute backend: a small interface with coarse ops (STYLE §4). The CPU backend is always
// built and is the reference every other backend is tested against; a CUDA backend implements
// the same ops on device buffers and a stream. Every pointer an op takes lives in the backend's
// memory (`Backend::alloc`). Shapes are row-major, outermost first, written on every parameter.
// Numerics: fp32 accumulation; attention returns fp32 output and the natural-log LSE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace infoflow {

class Backend;

// Move-only owned buffer of floats (or ints, via `as_int`) in a backend's memory.
class Buffer {
  public:
    Buffer() = default;
    Buffer(Backend* owner, void* ptr, size_t bytes) : owner_(owner), ptr_(ptr), bytes_(bytes) {}
    ~Buffer();
    Buffer(Buffer&& o) noexcept { swap(o); }
    Buffer& operator=(Buffer&& o) noexcept {
        Buffer tmp(std::move(o));
        swap(tmp);
        return *this;
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;

    float* data() { return static_cast<float*>(ptr_); }
    const float* data() const { return static_cast<const float*>(ptr_); }
    int32_t* as_int() { return static_cast<int32_t*>(ptr_); }
    const int32_t* as_int() const { return static_cast<const int32_t*>(ptr_); }
    size_t bytes() const { return bytes_; }
    bool empty() const { return ptr_ == nullptr; }

  private:
    void swap(Buffer& o) noexcept {
        std::swap(owner_, o.owner_);
        std::swap(ptr_, o.ptr_);
        std::swap(bytes_, o.bytes_);
    }
    Backend* owner_ = nullptr;
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

// Attention of queries over keys with arbitrary per-token positions and a visibility rule:
// key j is visible to query i iff k_pos[j] <= q_pos[i] and (k_group == nullptr or
// k_group[j] < 0 or q_group[i] == k_group[j]). Groups express the shard/selection visibility of
// DESIGN §5.2 (a negative key group = visible to every query). GQA: query head h reads KV head
// h / (n_head / n_head_kv). A query with no visible key gets out = 0 and lse = -inf.
struct AttnParams {
    const float* q = nullptr;          // [n_q, n_head, head_dim]
    const float* k = nullptr;          // [n_kv, kv_stride] (kv head hk at offset hk*head_dim)
    const float* v = nullptr;          // [n_kv, kv_stride]
    const int32_t* q_pos = nullptr;    // [n_q]
    const int32_t* k_pos = nullptr;    // [n_kv]
    const int32_t* q_group = nullptr;  // [n_q] or nullptr
    const int32_t* k_group = nullptr;  // [n_kv] or nullptr
    int n_q = 0;
    int n_kv = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    int kv_stride = 0;     // floats between consecutive tokens of k and v; 0 = n_head_kv*head_dim
    float scale = 0.0f;    // 0 = 1/sqrt(head_dim)
    float* out = nullptr;  // [n_q, n_head, head_dim]
    float* lse = nullptr;  // [n_q, n_head] natural log; optional
};

// Attention-probability column scores for the InfoFlow criterion (DESIGN §3.3), without
// materializing [n_head, n_q, n_cols]: with P[h,i,j] = exp(scale * q_i.k_j - lse[i,h]) for a
// visible key j (0 otherwise, same rule as AttnParams),
//   aggregate "norm": col[j] += sum_i (mean_h P[h,i,j])^2
//   aggregate "sum" : col[j] += sum_i sum_h P[h,i,j]
// for columns j in [0, n_cols) (the first n_cols keys). `lse` is the full softmax normalizer of
// each row (from `attention`, or merged across ranks), so partial key sets score exactly.
struct ScoreParams {
    const float* q = nullptr;        // [n_q, n_head, head_dim]
    const float* k = nullptr;        // [n_cols, kv_stride]
    const float* lse = nullptr;      // [n_q, n_head]
    const int32_t* q_pos = nullptr;  // [n_q]
    const int32_t* k_pos = nullptr;  // [n_cols]
    const int32_t* q_group = nullptr;
    const int32_t* k_group = nullptr;
    int n_q = 0;
    int n_cols = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    int kv_stride = 0;
    float scale = 0.0f;
    bool aggregate_sum = false;  // false: "norm", true: "sum"
    float* col = nullptr;        // [n_cols], accumulated into
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    virtual void set_threads(int n_threads) = 0;

    // ---- memory ----
    virtual Buffer alloc(size_t bytes) = 0;
    Buffer alloc_floats(size_t n) { return alloc(n * sizeof(float)); }
    virtual void release(void* ptr) = 0;  // called by Buffer
    virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
    virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
    virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // within the backend
    virtual void synchronize() = 0;

    // ---- ops ----
    // out[i, :] = table[ids[i], :]
    virtual void embed(const float* table /*[n_vocab, n_embd]*/, const int32_t* ids /*[n]*/, int n,
                       int n_embd, float* out /*[n, n_embd]*/) = 0;
    // out = x * rsqrt(mean(x^2) + eps) * w, per row; out may alias x.
    virtual void rms_norm(const float* x /*[n, d]*/, const float* w /*[d]*/, int n, int d,
                          float eps, float* out /*[n, d]*/) = 0;
    // out = x W^T (+ bias) (+ out when accumulate).
    virtual void matmul(const float* x /*[n, k]*/, const float* w /*[m, k]*/,
                        const float* bias /*[m] or nullptr*/, int n, int k, int m,
                        float* out /*[n, m]*/, bool accumulate) = 0;
    // In-place half-split RoPE: pair (i, i + head_dim/2) rotated by pos[t] * inv_freq[i].
    // Positions may be negative (re-rotation by a delta). Angles computed in fp32 as HF does.
    virtual void rope(float* x /*[n, n_head, head_dim]*/, const int32_t* pos /*[n]*/, int n,
                      int n_head, int head_dim, const float* inv_freq /*[head_dim/2]*/) = 0;
    virtual void attention(const AttnParams& p) = 0;
    virtual void attention_scores(const ScoreParams& p) = 0;
    // out = silu(gate) * up
    virtual void swiglu(const float* gate /*[n]*/, const float* up /*[n]*/, size_t n,
                        float* out /*[n]*/) = 0;
    // y += x
    virtual void add(float* y /*[n]*/, const float* x /*[n]*/, size_t n) = 0;
    // Merge a partial attention state (o_b, lse_b) into (o_a, lse_a), DESIGN §5.3. Rows of
    // width head_dim, one lse per row; an empty state (lse = -inf) merges without NaN.
    virtual void lse_merge(float* o_a /*[rows, head_dim]*/, float* lse_a /*[rows]*/,
                           const float* o_b /*[rows, head_dim]*/, const float* lse_b /*[rows]*/,
                           int rows, int head_dim) = 0;
};

// The CPU backend (always built). `n_threads` <= 0 means the OpenMP default.
std::unique_ptr<Backend> make_cpu_backend(int n_threads);
// A backend by name: "cpu" or "cuda" (errors name the backend when it was not built or no
// device is present).
std::unique_ptr<Backend> make_backend(const std::string& name, int n_threads);

}  // namespace infoflow
