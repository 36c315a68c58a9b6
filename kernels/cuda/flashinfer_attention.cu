// Launches of the FlashInfer attention kernels (see flashinfer_attention.h): argument checks,
// tile and split-KV choice, and our two small epilogue kernels — the merge of split-KV partials
// and the log2 -> natural-log LSE conversion. The FlashInfer kernels themselves are instantiated
// in flashinfer_attention_hd<D>_<mask>.cu.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <exception>

#include "kernels/cuda/flashinfer_attention.h"
#include "kernels/cuda/flashinfer_attention_launch.h"
#include "kernels/cuda/launch_plan.h"
#include "runtime/core/error.h"

namespace infoflow {

namespace {

using flashinfer::MaskMode;
using flashinfer_detail::Launch;
using flashinfer_detail::Tile;

#define FI_CUDA_CHECK(call, what)                                                  \
    do {                                                                           \
        const cudaError_t fi_e_ = (call);                                          \
        IF_CHECK(fi_e_ == cudaSuccess, what << ": " << cudaGetErrorString(fi_e_)); \
    } while (0)

constexpr float kLn2 = 0.69314718055994530942f;

// lse[i] (log2) -> natural log, in place; -inf stays -inf.
__global__ void lse_log2_to_ln(float* lse, size_t n) {
    const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    if (i < n) lse[i] *= kLn2;
}

__global__ void fill_empty(float* lse, size_t n) {
    const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    if (i < n) lse[i] = -INFINITY;
}

// Merge of the split-KV partials of one (query, head) row per block, one thread per output
// element: o = sum_c w_c o_c / sum_c w_c with w_c = 2^(lse2_c - max), lse = ln 2 * (max +
// log2 sum_c w_c) (docs/design.md §5.3). Empty chunks (lse2 = -inf) weigh 0; a row with every chunk
// empty is the empty state (0, -inf).
__global__ void merge_chunks(const float* part_o /*[n_q, n_chunks, n_head, head_dim]*/,
                             const float* part_lse2 /*[n_q, n_chunks, n_head]*/, int n_chunks,
                             int n_head, int head_dim, float* out /*[n_q, n_head, head_dim]*/,
                             float* lse /*[n_q, n_head] or nullptr*/) {
    const int row = blockIdx.x;  // q * n_head + h
    const int q = row / n_head, h = row % n_head;
    float m = -INFINITY;
    for (int c = 0; c < n_chunks; ++c) {
        m = fmaxf(m, part_lse2[(size_t(q) * n_chunks + c) * n_head + h]);
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f, wsum = 0.0f;
        if (m != -INFINITY) {
            for (int c = 0; c < n_chunks; ++c) {
                const float l = part_lse2[(size_t(q) * n_chunks + c) * n_head + h];
                const float w = exp2f(l - m);
                wsum += w;
                acc += w * part_o[((size_t(q) * n_chunks + c) * n_head + h) * head_dim + d];
            }
        }
        out[size_t(row) * head_dim + d] = wsum > 0.0f ? acc / wsum : 0.0f;
        if (d == 0 && lse) lse[row] = wsum > 0.0f ? (m + log2f(wsum)) * kLn2 : -INFINITY;
    }
}

// The current device's limits (shared memory, SMs) for flashinfer_tile and flashinfer_plan.
DeviceLimits current_device() {
    DeviceLimits d;
    int dev = 0;
    FI_CUDA_CHECK(cudaGetDevice(&dev), "FlashInfer attention: cudaGetDevice");
    FI_CUDA_CHECK(
        cudaDeviceGetAttribute(&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev),
        "FlashInfer attention: device attribute");
    FI_CUDA_CHECK(
        cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
        "FlashInfer attention: device attribute");
    FI_CUDA_CHECK(cudaDeviceGetAttribute(&d.num_sm, cudaDevAttrMultiProcessorCount, dev),
                  "FlashInfer attention: device attribute");
    return d;
}

template <MaskMode MODE>
int blocks_per_sm(int head_dim, const Tile& t) {
    return head_dim == 64 ? flashinfer_detail::blocks_per_sm<64, MODE>(t)
                          : flashinfer_detail::blocks_per_sm<128, MODE>(t);
}

template <MaskMode MODE>
cudaError_t launch_hd(int head_dim, const Launch& l, const Tile& t, cudaStream_t s) {
    return head_dim == 64 ? flashinfer_detail::launch<64, MODE>(l, t, s)
                          : flashinfer_detail::launch<128, MODE>(l, t, s);
}

// The launch plan (launch_plan.h): the tile as FlashInfer would pick it, the split from the
// tile kernel's occupancy on this device.
template <MaskMode MODE>
FlashPlan plan(int n_q, int n_kv, int n_head, int n_head_kv, int head_dim) {
    const DeviceLimits dev = current_device();
    const int packed = n_q * (n_head / n_head_kv);
    const FlashTile ft = flashinfer_tile(packed, head_dim, dev.smem_per_sm, dev.smem_optin);
    IF_CHECK(ft.num_mma_kv > 0, "FlashInfer attention: head_dim "
                                    << head_dim << " needs more "
                                    << "shared memory than this device has (" << dev.smem_optin
                                    << " bytes per block)");
    const Tile t{uint32_t(ft.cta_tile_q), uint32_t(ft.num_mma_kv)};
    return flashinfer_plan(n_q, n_kv, n_head, n_head_kv, head_dim, ft,
                           blocks_per_sm<MODE>(head_dim, t) * dev.num_sm);
}

void check_params(const FlashAttnParams& p, const char* what) {
    IF_CHECK(p.n_q >= 0 && p.n_kv >= 0,
             what << ": negative size n_q=" << p.n_q << " n_kv=" << p.n_kv);
    IF_CHECK(p.head_dim == 64 || p.head_dim == 128,
             what << ": head_dim " << p.head_dim << " not built (64, 128)");
    IF_CHECK(p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0,
             what << ": n_head " << p.n_head << " not a multiple of n_head_kv " << p.n_head_kv);
    const int kv_stride = p.kv_stride > 0 ? p.kv_stride : p.n_head_kv * p.head_dim;
    IF_CHECK(kv_stride >= p.n_head_kv * p.head_dim && kv_stride % 8 == 0,
             what << ": kv_stride " << kv_stride << " must be >= n_head_kv*head_dim and a "
                  << "multiple of 8");
    IF_CHECK(p.out != nullptr, what << ": out is null");
    if (p.n_q > 0 && p.n_kv > 0) {
        IF_CHECK(p.q && p.k && p.v, what << ": q, k or v is null");
        const auto misaligned = [](const void* x) {
            return reinterpret_cast<uintptr_t>(x) % 16 != 0;
        };
        IF_CHECK(!misaligned(p.q) && !misaligned(p.k) && !misaligned(p.v),
                 what << ": q, k and v must be 16-byte aligned");
    }
}

template <MaskMode MODE>
void run(const FlashAttnParams& p, cudaStream_t stream, const char* what) {
    check_params(p, what);
    if (p.n_q == 0) return;
    const size_t rows = size_t(p.n_q) * p.n_head;
    if (p.n_kv == 0) {  // no key at all: every row is the empty state
        FI_CUDA_CHECK(cudaMemsetAsync(p.out, 0, rows * p.head_dim * sizeof(float), stream), what);
        if (p.lse) fill_empty<<<unsigned((rows + 255) / 256), 256, 0, stream>>>(p.lse, rows);
        FI_CUDA_CHECK(cudaGetLastError(), what);
        return;
    }
    FlashPlan pl = plan<MODE>(p.n_q, p.n_kv, p.n_head, p.n_head_kv, p.head_dim);
    if (pl.num_chunks > 1 && (p.workspace == nullptr || p.workspace_bytes < pl.workspace)) {
        // No room for the split partials: the same tile, one chunk.
        pl = flashinfer_plan(p.n_q, p.n_kv, p.n_head, p.n_head_kv, p.head_dim, pl.tile, 0);
    }
    const std::string overflow = flashinfer_index_violation(p.n_q, p.n_kv, p.n_head, p.n_head_kv,
                                                            p.head_dim, p.kv_stride, pl.num_chunks);
    IF_CHECK(overflow.empty(), what << ": " << overflow);
    Launch l{&p, p.out, p.lse, uint32_t(pl.num_chunks)};
    for (int i = 0; i < 3; ++i) {
        l.grid[i] = uint32_t(pl.attn.grid[i]);
        l.block[i] = pl.attn.block[i];
    }
    l.smem = pl.attn.dyn_smem;
    const Tile tile{uint32_t(pl.tile.cta_tile_q), uint32_t(pl.tile.num_mma_kv)};
    const auto grid = [](const LaunchDims& d) { return unsigned(d.grid[0]); };
    cudaError_t e;
    try {
        if (pl.num_chunks == 1) {
            e = launch_hd<MODE>(p.head_dim, l, tile, stream);
            if (e == cudaSuccess && p.lse) {
                lse_log2_to_ln<<<grid(pl.epilogue), pl.epilogue.block[0], 0, stream>>>(p.lse, rows);
                e = cudaGetLastError();
            }
        } else {
            float* part_o = static_cast<float*>(p.workspace);
            float* part_lse2 = part_o + size_t(pl.num_chunks) * rows * p.head_dim;
            l.o = part_o;
            l.lse2 = part_lse2;
            e = launch_hd<MODE>(p.head_dim, l, tile, stream);
            if (e == cudaSuccess) {
                merge_chunks<<<grid(pl.epilogue), pl.epilogue.block[0], 0, stream>>>(
                    part_o, part_lse2, pl.num_chunks, p.n_head, p.head_dim, p.out, p.lse);
                e = cudaGetLastError();
            }
        }
    } catch (const std::exception& ex) {  // FlashInfer's own checks throw flashinfer::Error
        IF_FAIL(what << ": " << ex.what());
    }
    IF_CHECK(e == cudaSuccess, what << " (n_q=" << p.n_q << " n_kv=" << p.n_kv
                                    << " n_head=" << p.n_head << "/" << p.n_head_kv
                                    << " head_dim=" << p.head_dim << " tile " << pl.tile.cta_tile_q
                                    << "x" << pl.tile.num_mma_kv << " chunks " << pl.num_chunks
                                    << "): " << cudaGetErrorString(e));
}

}  // namespace

size_t flashinfer_workspace_bytes(int n_q, int n_kv, int n_head, int n_head_kv, int head_dim) {
    if (n_q <= 0 || n_kv <= 0 || (head_dim != 64 && head_dim != 128) || n_head_kv <= 0 ||
        n_head % n_head_kv != 0) {
        return 0;
    }
    // The causal and masked kernels share tile shapes and occupancy; one plan covers both.
    return plan<MaskMode::kCausal>(n_q, n_kv, n_head, n_head_kv, head_dim).workspace;
}

void launch_flashinfer_prefill(const FlashAttnParams& p, void* stream) {
    IF_CHECK(p.n_kv >= p.n_q, "launch_flashinfer_prefill: causal needs n_kv >= n_q, got n_kv="
                                  << p.n_kv << " n_q=" << p.n_q);
    run<MaskMode::kCausal>(p, static_cast<cudaStream_t>(stream), "launch_flashinfer_prefill");
}

void launch_flashinfer_masked(const FlashAttnParams& p, void* stream) {
    IF_CHECK(p.mask != nullptr || p.n_q == 0 || p.n_kv == 0,
             "launch_flashinfer_masked: mask is null");
    run<MaskMode::kCustom>(p, static_cast<cudaStream_t>(stream), "launch_flashinfer_masked");
}

}  // namespace infoflow
