// The compute backend: a small interface with coarse ops (docs/style.md point 4). The CPU backend is always
// built and is the reference every other backend is tested against; a CUDA backend implements
// the same ops on device buffers and a stream. Shapes are row-major, outermost first, written on
// every parameter. Numerics: fp32 accumulation; attention returns fp32 output and the
// natural-log LSE.
//
// Where the arguments of an op live:
//  - float tensors (activations, norms, biases, KV) are backend memory (`Backend::alloc`);
//  - weight matrices of `matmul` and the table of `embed` come from `load_matrix` or
//    `random_matrix` (the backend's weight storage: fp32 on the CPU, bf16 on a GPU); the CPU
//    backend also takes any host fp32 matrix in place;
//  - int32 index arrays (embed ids, rope positions, AttnParams/ScoreParams q_pos, k_pos,
//    q_group, k_group) are HOST memory for every backend: they are small, built on the host
//    (KvCache keeps its slot metadata there), and a device backend stages them into device
//    scratch itself, one copy per op call. The host array may be reused once the call returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace infoflow {

class Backend;

// Storage type of K/V rows (the KV cache, AttnParams / ScoreParams `kv_dtype`). f32 is the exact
// reference; f16 and bf16 halve the cache and the K/V bytes exchanged between ranks, and every
// op reading them widens to fp32 and accumulates in fp32.
enum class KvDtype { f32, f16, bf16 };
inline size_t kv_dtype_size(KvDtype t) { return t == KvDtype::f32 ? 4 : 2; }
inline const char* kv_dtype_name(KvDtype t) {
    return t == KvDtype::f32 ? "f32" : t == KvDtype::f16 ? "f16" : "bf16";
}
// n fp32 values <-> KV storage type t (round to nearest even; f32 copies), HOST memory. What
// Backend::narrow_kv / widen_kv do by default, and the host side of K/V moved to or from files.
void kv_narrow(KvDtype t, const float* src /*[n]*/, size_t n, void* dst /*[n]*/);
void kv_widen(KvDtype t, const void* src /*[n]*/, size_t n, float* dst /*[n]*/);

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
// docs/design.md §5.2 (a negative key group = visible to every query). GQA: query head h reads KV head
// h / (n_head / n_head_kv). A query with no visible key gets out = 0 and lse = -inf.
// q, k, v, out, lse: backend memory; q_pos, k_pos, q_group, k_group: host memory.
struct AttnParams {
    const float* q = nullptr;          // [n_q, n_head, head_dim]
    const float* k = nullptr;          // [n_kv, kv_stride] (kv head hk at offset hk*head_dim)
    const float* v = nullptr;          // [n_kv, kv_stride]
    const int32_t* q_pos = nullptr;    // [n_q] host
    const int32_t* k_pos = nullptr;    // [n_kv] host
    const int32_t* q_group = nullptr;  // [n_q] or nullptr, host
    const int32_t* k_group = nullptr;  // [n_kv] or nullptr, host
    int n_q = 0;
    int n_kv = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    int kv_stride = 0;     // floats between consecutive tokens of k and v; 0 = n_head_kv*head_dim
    float scale = 0.0f;    // 0 = 1/sqrt(head_dim)
    float* out = nullptr;  // [n_q, n_head, head_dim]
    float* lse = nullptr;  // [n_q, n_head] natural log; optional
    // K/V stored as 16-bit values (kv_dtype f16 or bf16): k16/v16 replace k/v, which stay
    // nullptr; kv_stride then counts 16-bit elements.
    KvDtype kv_dtype = KvDtype::f32;
    const uint16_t* k16 = nullptr;  // [n_kv, kv_stride]
    const uint16_t* v16 = nullptr;  // [n_kv, kv_stride]
};

// Attention-probability column scores for the InfoFlow criterion (docs/design.md §3.3), without
// materializing [n_head, n_q, n_cols]: with P[h,i,j] = exp(scale * q_i.k_j - lse[i,h]) for a
// visible key j (0 otherwise, same rule as AttnParams),
//   aggregate "norm": col[j] += sum_i (mean_h P[h,i,j])^2
//   aggregate "sum" : col[j] += sum_i sum_h P[h,i,j]
// for columns j in [0, n_cols) (the first n_cols keys). `lse` is the full softmax normalizer of
// each row (from `attention`, or merged across ranks), so partial key sets score exactly.
// Index arrays are host memory, as in AttnParams.
struct ScoreParams {
    const float* q = nullptr;          // [n_q, n_head, head_dim]
    const float* k = nullptr;          // [n_cols, kv_stride]
    const float* lse = nullptr;        // [n_q, n_head]
    const int32_t* q_pos = nullptr;    // [n_q] host
    const int32_t* k_pos = nullptr;    // [n_cols] host
    const int32_t* q_group = nullptr;  // [n_q] or nullptr, host
    const int32_t* k_group = nullptr;  // [n_cols] or nullptr, host
    int n_q = 0;
    int n_cols = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    int kv_stride = 0;
    float scale = 0.0f;
    bool aggregate_sum = false;  // false: "norm", true: "sum"
    float* col = nullptr;        // [n_cols], accumulated into
    KvDtype kv_dtype = KvDtype::f32;  // f16 / bf16: k16 replaces k (as in AttnParams)
    const uint16_t* k16 = nullptr;    // [n_cols, kv_stride]
};

// Seeded synthetic weights (random: models, docs/design.md §7), counter-based so that any backend
// produces the same values: element i of a tensor is `random_weight(key, i)`
// (kernels/random_init.h) with key = seed ^ hash(tensor name).
struct RandomMatrixSpec {
    uint64_t key = 0;
    float scale = 0.0f;  // multiplies the centred Irwin-Hall sum (kernels/random_init.h)
};

// How a product with stored-type weights meets its activations. Every pass but decode steps
// (prefill, scoring, recompute, suffix) takes `exact`: fp32 activations and one fixed order of
// fp32 operations per output element (kernels/cpu/gemm_exact.h), so a token's result does not
// depend on which rank computes it or how many rows share its call. Decode steps, one token at a
// time, take the fused dot products: 8-bit activations for quantized weights (`decode`, as
// llama.cpp does), fp32 ones where the rounding of x is not affordable (`decode_fp32`: the LM
// head, whose outputs are the logits).
enum class NativePass { exact, decode, decode_fp32 };

// A weight matrix kept in its stored GGUF type (model.weights = "native"): rows of `cols`
// elements, each row `row_bytes` bytes of blocks (docs/formats.md §3), host memory. Types:
// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q6_K (kernels/cpu/quant_dot.h).
struct NativeMatrix {
    uint32_t type = 0;  // ggml type id
    int rows = 0;
    int cols = 0;
    size_t row_bytes = 0;
    const uint8_t* data = nullptr;  // [rows, row_bytes]
    // 1: plain rows; kRowGroup (kernels/cpu/quant_dot.h): rows block-interleaved in groups of 4.
    int row_group = 1;
    // Which product (docs/design.md §6.4): a property of the pass, never of the row count.
    NativePass pass = NativePass::exact;
};

// The pool of freed buffers (Backend::set_buffer_pool): its limit, the bytes it holds, and how
// many allocations it has served.
struct BufferPoolStats {
    size_t limit = 0;
    size_t held = 0;
    uint64_t reused = 0;
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;  // "cpu" or "cuda"
    // The device it runs on, for summaries: "cpu", "cuda:0 NVIDIA H200 (cc 9.0, 139 GiB)".
    virtual std::string device() const { return name(); }
    virtual void set_threads(int n_threads) = 0;
    // Nominal rate of dense products in 1e9 multiply-adds per second, for cost models that weigh
    // compute against bytes (runtime/parallel/recompute_balance.h); 0 = unknown.
    virtual double nominal_gmacs() const { return 0.0; }
    // The backend's stream (a cudaStream_t for CUDA), so a device communicator can enqueue on it
    // in order with the ops; nullptr for the CPU.
    virtual void* stream() { return nullptr; }

    // ---- memory ----
    virtual Buffer alloc(size_t bytes) = 0;
    Buffer alloc_floats(size_t n) { return alloc(n * sizeof(float)); }
    virtual void release(void* ptr) = 0;  // called by Buffer
    // Freed buffers kept for reuse, up to `bytes` (CPU: kernels/cpu/buffer_pool.h; job serve);
    // 0 = none (the default). A backend without a pool ignores it.
    virtual void set_buffer_pool(size_t bytes) { (void)bytes; }
    // Frees the pooled buffers unused for `seconds`.
    virtual void release_idle_buffers(double seconds) { (void)seconds; }
    virtual BufferPoolStats buffer_pool() const { return {}; }
    virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
    virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
    // Within the backend (a device backend also accepts host pointers on either side).
    virtual void copy(void* dst, const void* src, size_t bytes) = 0;
    // Waits until every op issued so far is done (download does it itself).
    virtual void synchronize() = 0;
    // The KV cache's conversions, both buffers in backend memory: dst = src in storage type t
    // (round to nearest even; f32 copies), and back (exact). The defaults convert in place on
    // the host (kv_narrow / kv_widen): right for a backend whose memory is host memory; a device
    // backend converts on the device.
    virtual void narrow_kv(KvDtype t, const float* src /*[n]*/, size_t n, void* dst /*[n]*/);
    virtual void widen_kv(KvDtype t, const void* src /*[n]*/, size_t n, float* dst /*[n]*/);

    // ---- weights ----
    // A host fp32 matrix in the backend's weight storage (CPU: an fp32 copy; CUDA: bf16 on the
    // device, rounded to nearest even). The result's data() is what `matmul` and `embed` take.
    virtual Buffer load_matrix(const float* host /*[rows, cols]*/, int rows, int cols) = 0;
    // A seeded random matrix generated by the backend itself (never materialized on the host
    // for a device backend); the same values as `random_weight` computes on the host, stored as
    // `load_matrix` would store them.
    virtual Buffer random_matrix(int rows, int cols, const RandomMatrixSpec& spec) = 0;

    // ---- ops ----
    // out[i, :] = table[ids[i], :] (fp32 out). `table` is weight storage (load_matrix), `ids`
    // host memory, each in [0, n_vocab) (the caller checks).
    virtual void embed(const float* table /*[n_vocab, n_embd]*/, const int32_t* ids /*[n]*/, int n,
                       int n_embd, float* out /*[n, n_embd]*/) = 0;
    // out = x * rsqrt(mean(x^2) + eps) * w, per row; out may alias x.
    virtual void rms_norm(const float* x /*[n, d]*/, const float* w /*[d]*/, int n, int d,
                          float eps, float* out /*[n, d]*/) = 0;
    // out = x W^T (+ bias) (+ out when accumulate). `w` is weight storage (load_matrix); x,
    // bias and out are fp32 backend memory. A device backend rounds x to bf16 and accumulates
    // in fp32.
    virtual void matmul(const float* x /*[n, k]*/, const float* w /*[m, k]*/,
                        const float* bias /*[m] or nullptr*/, int n, int k, int m,
                        float* out /*[n, m]*/, bool accumulate) = 0;
    // The same two ops on a matrix in its stored type. Backends that keep fp32 (or bf16) weight
    // storage do not take them (supports_native_weights() false): the model then loads fp32.
    virtual bool supports_native_weights() const { return false; }
    virtual void matmul_native(const float* x /*[n, k]*/, const NativeMatrix& w /*[m, k]*/,
                               const float* bias /*[m] or nullptr*/, int n, float* out /*[n, m]*/,
                               bool accumulate);
    virtual void embed_native(const NativeMatrix& table /*[n_vocab, n_embd]*/,
                              const int32_t* ids /*[n]*/, int n, float* out /*[n, n_embd]*/);
    // In-place half-split RoPE: pair (i, i + head_dim/2) rotated by pos[t] * inv_freq[i].
    // Positions may be negative (re-rotation by a delta). Angles computed in fp32 as HF does.
    // `pos` is host memory; `inv_freq` backend memory (llama3 scaling already applied).
    virtual void rope(float* x /*[n, n_head, head_dim]*/, const int32_t* pos /*[n]*/, int n,
                      int n_head, int head_dim, const float* inv_freq /*[head_dim/2]*/) = 0;
    virtual void attention(const AttnParams& p) = 0;
    virtual void attention_scores(const ScoreParams& p) = 0;
    // out = silu(gate) * up
    virtual void swiglu(const float* gate /*[n]*/, const float* up /*[n]*/, size_t n,
                        float* out /*[n]*/) = 0;
    // y += x
    virtual void add(float* y /*[n]*/, const float* x /*[n]*/, size_t n) = 0;
    // Merge a partial attention state (o_b, lse_b) into (o_a, lse_a), docs/design.md §5.3. Rows of
    // width head_dim, one lse per row; an empty state (lse = -inf) merges without NaN.
    virtual void lse_merge(float* o_a /*[rows, head_dim]*/, float* lse_a /*[rows]*/,
                           const float* o_b /*[rows, head_dim]*/, const float* lse_b /*[rows]*/,
                           int rows, int head_dim) = 0;
};

// The CPU backend (always built). `n_threads` <= 0 means the OpenMP default.
std::unique_ptr<Backend> make_cpu_backend(int n_threads);
// A backend by name: "cpu" or "cuda" (errors name the backend when it was not built or no
// device is present). `local_rank` is the node-local rank: a device backend runs on device
// local_rank % (visible devices).
std::unique_ptr<Backend> make_backend(const std::string& name, int n_threads, int local_rank = 0);
// Visible CUDA devices: 0 when the CUDA backend was not built, or no driver or device is present.
int cuda_device_count();

}  // namespace infoflow
