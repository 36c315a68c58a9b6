// Device construction of the bit-packed visibility mask (see attn_mask.h): one thread per mask
// byte, the same attn_mask_byte() as the host version.
#include <cuda_runtime.h>

#include "kernels/cuda/attn_mask.h"
#include "kernels/cuda/launch_plan.h"
#include "runtime/core/error.h"

namespace infoflow {

namespace {

__global__ void attn_mask_kernel(MaskSpec s, uint8_t* bits, size_t n_bytes) {
    const size_t b = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    if (b < n_bytes) bits[b] = attn_mask_byte(s, b);
}

}  // namespace

void launch_attn_mask_build(const MaskSpec& s, uint8_t* bits, void* stream) {
    IF_CHECK(s.n_q >= 0 && s.n_kv >= 0,
             "launch_attn_mask_build: negative size n_q=" << s.n_q << " n_kv=" << s.n_kv);
    IF_CHECK(s.k_group == nullptr || s.q_group != nullptr,
             "launch_attn_mask_build: key groups given without query groups");
    const size_t n_bytes = attn_mask_bytes(s.n_q, s.n_kv);
    if (n_bytes == 0) return;
    IF_CHECK(s.q_pos && s.k_pos && bits, "launch_attn_mask_build: null positions or mask");
    const LaunchDims l = plan_mask_build(s.n_q, s.n_kv);
    attn_mask_kernel<<<unsigned(l.grid[0]), l.block[0], 0, static_cast<cudaStream_t>(stream)>>>(
        s, bits, n_bytes);
    const cudaError_t e = cudaGetLastError();
    IF_CHECK(e == cudaSuccess, "launch_attn_mask_build (n_q=" << s.n_q << " n_kv=" << s.n_kv
                                                              << "): " << cudaGetErrorString(e));
}

}  // namespace infoflow
