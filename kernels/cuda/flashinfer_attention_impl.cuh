// Private to the flashinfer_attention*.cu files: the launch of FlashInfer's FA2 single-prefill
// kernel (SinglePrefillWithKVCacheKernel) for one head dim and mask mode, with bf16 q/k/v, fp32
// output and FlashInfer's log2-based LSE. The launcher is ours rather than FlashInfer's
// SinglePrefillWithKVCacheDispatched because that one (a) instantiates every tile shape it might
// pick (about 16 kernels per call site, minutes of nvcc each on a 2-core box) and (b) cannot be
// compiled with an fp32 output: its split-KV merge is instantiated for head dim 512 too, where
// fp32 vectors exceed the 256-bit copy. Here two tile shapes are instantiated (CTA_TILE_Q 128 for
// many query rows, 16 for few) with NUM_MMA_KV 2 or 4, chosen at run time from the device's
// shared memory like FlashInfer does; the split-KV partials are merged by our own kernel
// (flashinfer_attention.cu), which also converts the LSE to natural log.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>

#include "kernels/cuda/flashinfer_attention_launch.h"
#include "kernels/cuda/flashinfer_smem.h"

namespace infoflow {
namespace flashinfer_detail {

using Params = flashinfer::SinglePrefillParams<__nv_bfloat16, __nv_bfloat16, float>;

template <uint32_t HEAD_DIM, flashinfer::MaskMode MODE, uint32_t CTA_TILE_Q, uint32_t NUM_MMA_KV>
struct Kernel {
    static constexpr uint32_t NUM_WARPS_Q = flashinfer::get_num_warps_q(CTA_TILE_Q);
    static constexpr uint32_t NUM_WARPS_KV = flashinfer::get_num_warps_kv(CTA_TILE_Q);
    static constexpr uint32_t NUM_MMA_Q = flashinfer::get_num_mma_q(CTA_TILE_Q);
    using Variant = flashinfer::DefaultAttention<MODE == flashinfer::MaskMode::kCustom,
                                                 /*use_sliding_window=*/false,
                                                 /*use_logits_soft_cap=*/false,
                                                 /*use_alibi=*/false>;
    using Traits = flashinfer::KernelTraits<
        MODE, CTA_TILE_Q, NUM_MMA_Q, NUM_MMA_KV, HEAD_DIM / 16, HEAD_DIM / 16, NUM_WARPS_Q,
        NUM_WARPS_KV, flashinfer::PosEncodingMode::kNone, __nv_bfloat16, __nv_bfloat16, float,
        float, int32_t, Variant, flashinfer::kPrefillLauncherRepacksFp4>;
    static_assert(!Traits::IsInvalid(), "tile shape FlashInfer cannot run");
    static_assert(!Traits::USE_SINGLE_PREFILL_SOFTMAX_VO_SPLIT, "bf16 KV takes the plain path");
    using Storage = typename Traits::SharedStorage;
    static_assert(sizeof(Storage) == flashinfer_smem_bytes(CTA_TILE_Q, NUM_MMA_KV, HEAD_DIM),
                  "flashinfer_smem.h no longer matches FlashInfer's SharedStorage");

    static const void* fn() {
        return reinterpret_cast<const void*>(
            &flashinfer::SinglePrefillWithKVCacheKernel<Traits, Params>);
    }
    static size_t smem() { return sizeof(Storage); }

    static cudaError_t launch(const Launch& l, cudaStream_t stream) {
        const FlashAttnParams& p = *l.p;
        const uint32_t kv_stride =
            p.kv_stride > 0 ? uint32_t(p.kv_stride) : uint32_t(p.n_head_kv) * HEAD_DIM;
        const float scale = p.scale > 0.0f ? p.scale : 1.0f / sqrtf(float(HEAD_DIM));
        Params params(static_cast<__nv_bfloat16*>(const_cast<void*>(p.q)),
                      static_cast<__nv_bfloat16*>(const_cast<void*>(p.k)),
                      static_cast<__nv_bfloat16*>(const_cast<void*>(p.v)),
                      const_cast<uint8_t*>(p.mask), l.o, l.lse2, /*maybe_alibi_slopes=*/nullptr,
                      uint32_t(p.n_head), uint32_t(p.n_head_kv), uint32_t(p.n_q), uint32_t(p.n_kv),
                      /*q_stride_n=*/uint32_t(p.n_head) * HEAD_DIM,
                      /*q_stride_h=*/HEAD_DIM, /*kv_stride_n=*/kv_stride,
                      /*kv_stride_h=*/HEAD_DIM, HEAD_DIM, /*window_left=*/-1,
                      /*logits_soft_cap=*/0.0f, scale, /*rope_scale=*/1.0f, /*rope_theta=*/1e4f);
        params.partition_kv = l.num_chunks > 1;
        // The plan's dimensions must be this kernel's: its threads, its tiles, its storage.
        const uint32_t packed = uint32_t(p.n_q) * uint32_t(p.n_head / p.n_head_kv);
        if (l.smem != smem() || l.block[0] != 32 || l.block[1] != NUM_WARPS_Q ||
            l.block[2] != NUM_WARPS_KV || l.grid[0] != (packed + CTA_TILE_Q - 1) / CTA_TILE_Q ||
            l.grid[1] != l.num_chunks || l.grid[2] != uint32_t(p.n_head_kv)) {
            return cudaErrorInvalidConfiguration;
        }
        cudaError_t e =
            cudaFuncSetAttribute(fn(), cudaFuncAttributeMaxDynamicSharedMemorySize, int(l.smem));
        if (e != cudaSuccess) return e;
        const dim3 blocks(l.grid[0], l.grid[1], l.grid[2]);
        const dim3 threads(l.block[0], l.block[1], l.block[2]);
        void* args[] = {static_cast<void*>(&params)};
        return cudaLaunchKernel(fn(), blocks, threads, args, l.smem, stream);
    }

    static int blocks_per_sm() {
        int n = 0;
        if (cudaFuncSetAttribute(fn(), cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem())) !=
                cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn(), int(Traits::NUM_THREADS),
                                                          smem()) != cudaSuccess) {
            return 1;
        }
        return n > 0 ? n : 1;
    }
};

// The entry points each flashinfer_attention_hd<D>_<mask>.cu instantiates.
template <uint32_t HEAD_DIM, flashinfer::MaskMode MODE>
cudaError_t launch(const Launch& l, const Tile& t, cudaStream_t stream) {
    if (t.cta_tile_q == 16) {
        return t.num_mma_kv == 4 ? Kernel<HEAD_DIM, MODE, 16, 4>::launch(l, stream)
                                 : Kernel<HEAD_DIM, MODE, 16, 2>::launch(l, stream);
    }
    return t.num_mma_kv == 4 ? Kernel<HEAD_DIM, MODE, 128, 4>::launch(l, stream)
                             : Kernel<HEAD_DIM, MODE, 128, 2>::launch(l, stream);
}

template <uint32_t HEAD_DIM, flashinfer::MaskMode MODE>
int blocks_per_sm(const Tile& t) {
    if (t.cta_tile_q == 16) {
        return t.num_mma_kv == 4 ? Kernel<HEAD_DIM, MODE, 16, 4>::blocks_per_sm()
                                 : Kernel<HEAD_DIM, MODE, 16, 2>::blocks_per_sm();
    }
    return t.num_mma_kv == 4 ? Kernel<HEAD_DIM, MODE, 128, 4>::blocks_per_sm()
                             : Kernel<HEAD_DIM, MODE, 128, 2>::blocks_per_sm();
}

#define INFOFLOW_FLASHINFER_INSTANTIATE(HD, MODE)                                    \
    template cudaError_t launch<HD, MODE>(const Launch&, const Tile&, cudaStream_t); \
    template int blocks_per_sm<HD, MODE>(const Tile&);

}  // namespace flashinfer_detail
}  // namespace infoflow
