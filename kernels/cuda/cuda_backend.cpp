// The CUDA backend: device buffers, one stream, cuBLAS GEMMs (bf16 in, fp32 compute and out)
// and the kernels behind kernels/cuda/launch.h. Weights are bf16 on the device; activations and
// every accumulation fp32; the KV cache in model.kv_dtype (f32, f16 or bf16: narrow_kv /
// widen_kv convert on the device). Host index arrays are staged into device scratch per op,
// through a small ring of pinned buffers so the host never waits for the device to stage
// (docs/design.md §5, kernels/backend.h).
//
// Attention: every call FlashInfer computes exactly (attn_dispatch.h: dense causal, decode,
// custom mask) goes to FlashInfer's kernels, with q cast to bf16 into scratch and K/V read in
// place when they are bf16 rows (a bf16 cache), else cast to packed bf16 rows first (f32, f16);
// the rest goes to the backend's own kernel (attention.cu: K/V in their storage type, fp32
// arithmetic), which is also the oracle the GPU tests compare FlashInfer against. The
// environment variable INFOFLOW_CUDA_ATTENTION, read when the backend is made, chooses: "auto"
// (default, as above), "own" (the own kernel for every call) or "flashinfer" (FlashInfer where
// attn_dispatch allows it, an error naming the reason where it does not: for tests and
// benchmarks that must measure FlashInfer).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/attn_dispatch.h"
#include "kernels/cuda/attn_mask.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flashinfer_attention.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_plan.h"
#include "kernels/device_plan.h"
#include "runtime/core/half.h"

namespace infoflow {
namespace {

// Pinned host staging buffers, reused round-robin; a slot is rewritten only after the copy
// that last read it (recorded as an event on the stream) has finished.
class PinnedRing {
  public:
    static constexpr int kSlots = 8;
    PinnedRing() = default;
    PinnedRing(const PinnedRing&) = delete;
    PinnedRing& operator=(const PinnedRing&) = delete;
    ~PinnedRing() {
        for (Slot& s : slots_) {
            if (s.done) cudaEventDestroy(s.done);
            if (s.host) cudaFreeHost(s.host);
        }
    }

    // A host buffer of at least `bytes` that no pending copy reads.
    void* acquire(size_t bytes) {
        Slot& s = slots_[next_];
        if (s.done) IF_CUDA_CHECK(cudaEventSynchronize(s.done));
        if (s.bytes < bytes) {
            if (s.host) IF_CUDA_CHECK(cudaFreeHost(s.host));
            s.host = nullptr;
            s.bytes = 0;
            IF_CUDA_CHECK(cudaMallocHost(&s.host, bytes));
            s.bytes = bytes;
        }
        if (!s.done) IF_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
        return s.host;
    }
    // Marks the slot handed out by the last acquire() as read by work queued on `stream`.
    void release(cudaStream_t stream) {
        IF_CUDA_CHECK(cudaEventRecord(slots_[next_].done, stream));
        next_ = (next_ + 1) % kSlots;
    }

  private:
    struct Slot {
        void* host = nullptr;
        size_t bytes = 0;
        cudaEvent_t done = nullptr;
    };
    Slot slots_[kSlots];
    int next_ = 0;
};

// Which attention kernels the backend may use (INFOFLOW_CUDA_ATTENTION).
enum class AttnMode { kAuto, kOwn, kFlashInfer };

AttnMode attn_mode_from_env() {
    const char* v = std::getenv("INFOFLOW_CUDA_ATTENTION");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return AttnMode::kAuto;
    if (std::strcmp(v, "own") == 0) return AttnMode::kOwn;
    if (std::strcmp(v, "flashinfer") == 0) {
        IF_CHECK(flashinfer_built(),
                 "INFOFLOW_CUDA_ATTENTION=flashinfer but FlashInfer attention was not built into "
                 "this binary (run launch/setup.sh, then configure again)");
        return AttnMode::kFlashInfer;
    }
    IF_FAIL("INFOFLOW_CUDA_ATTENTION='" << v << "' is not one of auto, own, flashinfer");
}

class CudaBackend final : public Backend {
  public:
    CudaBackend(int n_threads, int local_rank) : attn_mode_(attn_mode_from_env()) {
        // Device selection comes before any other CUDA call (docs/formats.md §9.2 of the design notes).
        int count = 0;
        const cudaError_t err = cudaGetDeviceCount(&count);
        IF_CHECK(err == cudaSuccess && count > 0,
                 "backend 'cuda': no CUDA device visible (cudaGetDeviceCount: "
                     << (err == cudaSuccess ? "0 devices" : cudaGetErrorString(err)) << ")");
        device_ = count == 1 ? 0 : local_rank % count;
        IF_CUDA_CHECK(cudaSetDevice(device_));
        cudaDeviceProp prop{};
        IF_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
        std::ostringstream os;
        os << "cuda:" << device_ << " " << prop.name << " (cc " << prop.major << "." << prop.minor
           << ", " << prop.totalGlobalMem / (size_t(1) << 30) << " GiB)";
        device_name_ = os.str();
        IF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        IF_CUBLAS_CHECK(cuda::cublas().create(&blas_));
        IF_CUBLAS_CHECK(cuda::cublas().set_stream(blas_, stream_));
        set_threads(n_threads);
    }
    ~CudaBackend() override {
        // Destructors must not throw: report and carry on.
        report(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        for (void* p : {static_cast<void*>(x_bf16_), static_cast<void*>(idx_dev_), attn_scratch_}) {
            if (p) report(cudaFree(p), "cudaFree");
        }
        if (blas_) cuda::cublas().destroy(blas_);
        if (stream_) report(cudaStreamDestroy(stream_), "cudaStreamDestroy");
    }

    std::string name() const override { return "cuda"; }
    std::string device() const override { return device_name_; }
    void set_threads(int n_threads) override { n_threads_ = n_threads; }
    void* stream() override { return stream_; }

    // ---- memory ----
    Buffer alloc(size_t bytes) override {
        if (bytes == 0) return Buffer();
        void* p = nullptr;
        const cudaError_t err = cudaMalloc(&p, bytes);
        IF_CHECK(err == cudaSuccess, "cudaMalloc of " << bytes << " bytes on " << device_name_
                                                      << " failed: " << cudaGetErrorString(err));
        return Buffer(this, p, bytes);
    }
    void release(void* ptr) override { report(cudaFree(ptr), "cudaFree"); }
    void upload(void* dst, const void* host_src, size_t bytes) override {
        if (bytes == 0) return;
        // The host buffer may be pageable and reused at once: wait for the copy.
        IF_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
        IF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void download(void* host_dst, const void* src, size_t bytes) override {
        if (bytes == 0) return;
        IF_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
        IF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void copy(void* dst, const void* src, size_t bytes) override {
        if (bytes == 0) return;
        IF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
        // A host side may be pageable memory the caller reuses: such copies complete here.
        if (is_host(dst) || is_host(src)) IF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void synchronize() override { IF_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
    void narrow_kv(KvDtype t, const float* src, size_t n, void* dst) override {
        if (t == KvDtype::f32) return copy(dst, src, n * sizeof(float));
        cuda::KvConvertParams p;
        p.t = t;
        p.n = n;
        p.src = src;
        p.dst = static_cast<uint16_t*>(dst);
        cuda::launch_kv_narrow(p, stream_);
    }
    void widen_kv(KvDtype t, const void* src, size_t n, float* dst) override {
        if (t == KvDtype::f32) return copy(dst, src, n * sizeof(float));
        cuda::KvConvertParams p;
        p.t = t;
        p.n = n;
        p.src16 = static_cast<const uint16_t*>(src);
        p.dst32 = dst;
        cuda::launch_kv_widen(p, stream_);
    }

    // ---- weights ----
    Buffer load_matrix(const float* host, int rows, int cols) override {
        const size_t n = size_t(rows) * cols;
        std::vector<uint16_t> bf(n);
        for (size_t i = 0; i < n; ++i) bf[i] = fp32_to_bf16(host[i]);
        Buffer b = alloc(n * sizeof(uint16_t));
        upload(b.data(), bf.data(), n * sizeof(uint16_t));
        return b;
    }
    Buffer random_matrix(int rows, int cols, const RandomMatrixSpec& spec) override {
        const size_t n = size_t(rows) * cols;
        Buffer b = alloc(n * sizeof(uint16_t));
        cuda::FillRandomParams p;
        p.out = reinterpret_cast<uint16_t*>(b.data());
        p.n = n;
        p.key = spec.key;
        p.scale = spec.scale;
        cuda::launch_fill_random_bf16(p, stream_);
        return b;
    }

    // ---- ops ----
    void embed(const float* table, const int32_t* ids, int n, int n_embd, float* out) override {
        if (n == 0) return;
        const std::vector<const int32_t*> dev = stage({{ids, size_t(n)}});
        cuda::EmbedParams p;
        p.table = reinterpret_cast<const uint16_t*>(table);
        p.ids = dev[0];
        p.n = n;
        p.n_embd = n_embd;
        p.out = out;
        cuda::launch_embed(p, stream_);
    }

    void rms_norm(const float* x, const float* w, int n, int d, float eps, float* out) override {
        cuda::RmsNormParams p;
        p.x = x;
        p.w = w;
        p.n = n;
        p.d = d;
        p.eps = eps;
        p.out = out;
        cuda::launch_rms_norm(p, stream_);
    }

    void matmul(const float* x, const float* w, const float* bias, int n, int k, int m, float* out,
                bool accumulate) override {
        if (n == 0 || m == 0) return;
        const GemmPlan g = plan_row_major_matmul(n, k, m);
        uint16_t* xb = bf16_scratch(size_t(n) * k);
        cuda::CastBf16Params c;
        c.x = x;
        c.out = xb;
        c.n = size_t(n) * k;
        cuda::launch_cast_bf16(c, stream_);
        const float alpha = 1.0f;
        const float beta = accumulate ? 1.0f : 0.0f;
        IF_CUBLAS_CHECK(cuda::cublas().gemm_ex(blas_, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.M, g.N, g.K, &alpha,
                                     w, CUDA_R_16BF, g.lda, xb, CUDA_R_16BF, g.ldb, &beta, out,
                                     CUDA_R_32F, g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        if (bias) {
            cuda::AddBiasParams b;
            b.out = out;
            b.bias = bias;
            b.n = n;
            b.m = m;
            cuda::launch_add_bias(b, stream_);
        }
    }

    void rope(float* x, const int32_t* pos, int n, int n_head, int head_dim,
              const float* inv_freq) override {
        if (n == 0) return;
        const std::vector<const int32_t*> dev = stage({{pos, size_t(n)}});
        cuda::RopeParams p;
        p.x = x;
        p.pos = dev[0];
        p.n = n;
        p.n_head = n_head;
        p.head_dim = head_dim;
        p.inv_freq = inv_freq;
        cuda::launch_rope(p, stream_);
    }

    void attention(const AttnParams& p) override {
        const AttnShape s = check_attention_args(p, cuda::kMaxHeadDim);
        if (p.n_q == 0) return;
        if (attn_mode_ != AttnMode::kOwn) {
            AttnDispatchInput in;
            in.q_pos = p.q_pos;
            in.k_pos = p.k_pos;
            in.q_group = p.q_group;
            in.k_group = p.k_group;
            in.n_q = p.n_q;
            in.n_kv = p.n_kv;
            in.n_head = p.n_head;
            in.n_head_kv = p.n_head_kv;
            in.head_dim = p.head_dim;
            in.flashinfer_built = flashinfer_built();
            const AttnDispatch d = attn_dispatch(in);
            if (d.kernel != AttnKernel::kOwn) {
                flash_attention(p, s, d);
                return;
            }
            // No key at all is no attention to measure: the own kernel writes the empty state.
            IF_CHECK(attn_mode_ != AttnMode::kFlashInfer || p.n_kv == 0,
                     "attention on cuda with INFOFLOW_CUDA_ATTENTION=flashinfer: FlashInfer "
                     "cannot compute this call ("
                         << d.reason << "; n_q=" << p.n_q << " n_kv=" << p.n_kv << " heads "
                         << p.n_head << "/" << p.n_head_kv << " head_dim " << p.head_dim << ")");
        }
        const std::vector<const int32_t*> dev =
            stage({{p.q_pos, size_t(p.n_q)},
                   {p.n_kv ? p.k_pos : nullptr, size_t(p.n_kv)},
                   {p.q_group, size_t(p.n_q)},
                   {p.n_kv ? p.k_group : nullptr, size_t(p.n_kv)}});
        AttnParams d = p;
        d.q_pos = dev[0];
        d.k_pos = dev[1];
        d.q_group = dev[2];
        d.k_group = dev[3];
        d.kv_stride = s.stride;
        d.scale = s.scale;
        cuda::launch_attention(d, stream_);
    }

    void attention_scores(const ScoreParams& p) override {
        const AttnShape s = check_score_args(p, cuda::kMaxHeadDim);
        if (p.n_q == 0 || p.n_cols == 0) return;
        IF_CHECK(size_t(p.n_head) * (p.head_dim + 1) <= size_t(cuda::kMaxScoreSharedFloats),
                 "attention_scores on cuda: n_head * (head_dim + 1) = "
                     << p.n_head * (p.head_dim + 1) << " > " << cuda::kMaxScoreSharedFloats
                     << " is not implemented yet");
        const std::vector<const int32_t*> dev = stage({{p.q_pos, size_t(p.n_q)},
                                                       {p.k_pos, size_t(p.n_cols)},
                                                       {p.q_group, size_t(p.n_q)},
                                                       {p.k_group, size_t(p.n_cols)}});
        ScoreParams d = p;
        d.q_pos = dev[0];
        d.k_pos = dev[1];
        d.q_group = dev[2];
        d.k_group = dev[3];
        d.kv_stride = s.stride;
        d.scale = s.scale;
        cuda::launch_attention_scores(d, stream_);
    }

    void swiglu(const float* gate, const float* up, size_t n, float* out) override {
        cuda::SwigluParams p;
        p.gate = gate;
        p.up = up;
        p.n = n;
        p.out = out;
        cuda::launch_swiglu(p, stream_);
    }

    void add(float* y, const float* x, size_t n) override {
        cuda::AddParams p;
        p.y = y;
        p.x = x;
        p.n = n;
        cuda::launch_add(p, stream_);
    }

    void lse_merge(float* o_a, float* lse_a, const float* o_b, const float* lse_b, int rows,
                   int head_dim) override {
        cuda::LseMergeParams p;
        p.o_a = o_a;
        p.lse_a = lse_a;
        p.o_b = o_b;
        p.lse_b = lse_b;
        p.rows = rows;
        p.head_dim = head_dim;
        cuda::launch_lse_merge(p, stream_);
    }

  private:
    // FlashInfer attention (attn_dispatch chose `d`): q cast to bf16 and, unless FlashInfer can
    // read them in place (flash_kv_in_place: bf16 rows), the k/v rows of the cache slice cast to
    // packed bf16, into one scratch block (launch_plan.h, plan_flash_scratch); then, for a custom
    // mask, the mask built on the device from the staged positions and groups, and the split-KV
    // workspace where FlashInfer wants one. All in stream order, nothing waits.
    void flash_attention(const AttnParams& p, const AttnShape& s, const AttnDispatch& d) {
        const bool wide = p.kv_dtype == KvDtype::f32;
        const void* k_in = wide ? static_cast<const void*>(p.k) : p.k16;
        const void* v_in = wide ? static_cast<const void*>(p.v) : p.v16;
        const bool in_place = flash_kv_in_place(p.kv_dtype, k_in, v_in, s.stride);
        const bool masked = d.kernel == AttnKernel::kFlashMasked;
        const size_t ws_bytes =
            flashinfer_workspace_bytes(p.n_q, p.n_kv, p.n_head, p.n_head_kv, p.head_dim);
        const FlashScratch sc = plan_flash_scratch(p.n_q, p.n_kv, p.n_head, p.n_head_kv, p.head_dim,
                                                   in_place, masked, ws_bytes);
        // Staging goes first: stage() may wait for the stream, grow() below as well.
        std::vector<const int32_t*> idx;
        if (masked) {
            idx = stage({{p.q_pos, size_t(p.n_q)},
                         {p.k_pos, size_t(p.n_kv)},
                         {p.q_group, size_t(p.n_q)},
                         {p.k_group, size_t(p.n_kv)}});
        }
        grow(&attn_scratch_, &attn_scratch_cap_, sc.total, stream_);
        char* base = static_cast<char*>(attn_scratch_);
        uint16_t* qb = reinterpret_cast<uint16_t*>(base + sc.q);

        cuda::CastBf16Params cq;
        cq.x = p.q;
        cq.out = qb;
        cq.n = size_t(p.n_q) * p.n_head * p.head_dim;
        cuda::launch_cast_bf16(cq, stream_);

        FlashAttnParams f;
        f.q = qb;
        if (in_place) {
            f.k = k_in;
            f.v = v_in;
            f.kv_stride = s.stride;
        } else {
            uint16_t* kb = reinterpret_cast<uint16_t*>(base + sc.k);
            uint16_t* vb = reinterpret_cast<uint16_t*>(base + sc.v);
            cuda::CastRowsBf16Params ck;
            ck.x_stride = size_t(s.stride);
            ck.rows = size_t(p.n_kv);
            ck.cols = size_t(p.n_head_kv) * p.head_dim;
            ck.x_dtype = p.kv_dtype;
            ck.x = p.k;
            ck.x16 = p.k16;
            ck.out = kb;
            cuda::launch_cast_rows_bf16(ck, stream_);
            ck.x = p.v;
            ck.x16 = p.v16;
            ck.out = vb;
            cuda::launch_cast_rows_bf16(ck, stream_);
            f.k = kb;
            f.v = vb;
            f.kv_stride = p.n_head_kv * p.head_dim;
        }
        f.n_q = p.n_q;
        f.n_kv = p.n_kv;
        f.n_head = p.n_head;
        f.n_head_kv = p.n_head_kv;
        f.head_dim = p.head_dim;
        f.scale = s.scale;
        f.out = p.out;
        f.lse = p.lse;
        f.workspace = ws_bytes ? base + sc.workspace : nullptr;
        f.workspace_bytes = ws_bytes;
        if (masked) {
            uint8_t* mask = reinterpret_cast<uint8_t*>(base + sc.mask);
            MaskSpec m;
            m.q_pos = idx[0];
            m.k_pos = idx[1];
            // The mask rule reads query groups only together with key groups.
            m.q_group = idx[3] ? idx[2] : nullptr;
            m.k_group = idx[3];
            m.n_q = p.n_q;
            m.n_kv = p.n_kv;
            launch_attn_mask_build(m, mask, stream_);
            f.mask = mask;
            launch_flashinfer_masked(f, stream_);
        } else {
            launch_flashinfer_prefill(f, stream_);
        }
    }

    static void report(cudaError_t err, const char* what) {
        if (err != cudaSuccess) {
            std::fprintf(stderr, "warning: %s failed: %s\n", what, cudaGetErrorString(err));
        }
    }

    static bool is_host(const void* p) {
        cudaPointerAttributes a{};
        if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
            cudaGetLastError();  // an unregistered host pointer on old drivers: clear it
            return true;
        }
        return a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged;
    }

    // Device scratch of at least `bytes`; growing waits for queued work that may still read it.
    static void grow(void** buf, size_t* cap, size_t bytes, cudaStream_t stream) {
        if (*cap >= bytes) return;
        IF_CUDA_CHECK(cudaStreamSynchronize(stream));
        if (*buf) IF_CUDA_CHECK(cudaFree(*buf));
        *buf = nullptr;
        *cap = 0;
        IF_CUDA_CHECK(cudaMalloc(buf, bytes));
        *cap = bytes;
    }

    uint16_t* bf16_scratch(size_t n) {
        grow(reinterpret_cast<void**>(&x_bf16_), &x_bf16_cap_, n * sizeof(uint16_t), stream_);
        return x_bf16_;
    }

    // Copies host index arrays to device scratch with one host-to-device copy; returns their
    // device addresses (nullptr for absent arrays). Valid until the next stage() call, which
    // stream order makes safe for the op that uses them.
    std::vector<const int32_t*> stage(const std::vector<IndexArray>& arrays) {
        const IndexPack plan = plan_index_pack(arrays);
        std::vector<const int32_t*> dev(arrays.size(), nullptr);
        if (plan.total == 0) return dev;
        const size_t bytes = plan.total * sizeof(int32_t);
        grow(reinterpret_cast<void**>(&idx_dev_), &idx_cap_, bytes, stream_);
        int32_t* host = static_cast<int32_t*>(pinned_.acquire(bytes));
        pack_indices(arrays, plan, host);
        IF_CUDA_CHECK(cudaMemcpyAsync(idx_dev_, host, bytes, cudaMemcpyHostToDevice, stream_));
        pinned_.release(stream_);
        for (size_t i = 0; i < arrays.size(); ++i) {
            if (plan.offset[i] != SIZE_MAX) dev[i] = idx_dev_ + plan.offset[i];
        }
        return dev;
    }

    int device_ = 0;
    std::string device_name_;
    int n_threads_ = 1;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t blas_ = nullptr;
    uint16_t* x_bf16_ = nullptr;
    size_t x_bf16_cap_ = 0;
    int32_t* idx_dev_ = nullptr;
    size_t idx_cap_ = 0;
    AttnMode attn_mode_ = AttnMode::kAuto;
    void* attn_scratch_ = nullptr;  // flash_attention: bf16 q/k/v, mask, split-KV workspace
    size_t attn_scratch_cap_ = 0;
    PinnedRing pinned_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int n_threads, int local_rank) {
    return std::make_unique<CudaBackend>(n_threads, local_rank);
}

int cuda_visible_devices() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

}  // namespace infoflow
