// Element-wise and per-row kernels of the CUDA backend: bf16 cast and random fill, the KV
// cache's f16/bf16 conversions, embedding gather, RMSNorm, RoPE, SwiGLU, add, bias, LSE merge.
// Written plainly (grid-stride loops, one block per row where a row is reduced); the CPU backend
// is the reference for each. Grids come from launch_plan.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_plan.h"
#include "kernels/random_init.h"

namespace infoflow::cuda {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Blocks of a grid-stride loop over n elements (launch_plan.h: capped, the loop covers the rest).
unsigned grid_for(size_t n) { return unsigned(plan_grid_stride("", n).grid[0]); }

__device__ inline uint16_t to_bf16_bits(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ inline float from_bf16_bits(uint16_t b) {
    return __bfloat162float(__ushort_as_bfloat16(b));
}
__device__ inline uint16_t to_f16_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ inline float from_f16_bits(uint16_t b) { return __half2float(__ushort_as_half(b)); }

__global__ void cast_bf16_kernel(const float* x, uint16_t* out, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        out[i] = to_bf16_bits(x[i]);
    }
}

__global__ void cast_rows_bf16_kernel(const float* x, size_t x_stride, uint16_t* out, size_t rows,
                                      size_t cols) {
    const size_t n = rows * cols;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        out[i] = to_bf16_bits(x[(i / cols) * x_stride + i % cols]);
    }
}

// 16-bit rows: f16 widened (exact) and rounded to bf16; bf16 copied.
__global__ void cast_rows16_bf16_kernel(const uint16_t* x, bool f16, size_t x_stride, uint16_t* out,
                                        size_t rows, size_t cols) {
    const size_t n = rows * cols;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const uint16_t b = x[(i / cols) * x_stride + i % cols];
        out[i] = f16 ? to_bf16_bits(from_f16_bits(b)) : b;
    }
}

__global__ void kv_narrow_kernel(const float* src, bool f16, size_t n, uint16_t* dst) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        dst[i] = f16 ? to_f16_bits(src[i]) : to_bf16_bits(src[i]);
    }
}

__global__ void kv_widen_kernel(const uint16_t* src, bool f16, size_t n, float* dst) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        dst[i] = f16 ? from_f16_bits(src[i]) : from_bf16_bits(src[i]);
    }
}

__global__ void fill_random_bf16_kernel(uint16_t* out, size_t n, uint64_t key, float scale) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        out[i] = to_bf16_bits(random_weight(key, i, scale));
    }
}

__global__ void embed_kernel(const uint16_t* table, const int32_t* ids, int n, int n_embd,
                             float* out) {
    const size_t total = size_t(n) * n_embd;
    for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < total;
         e += size_t(gridDim.x) * blockDim.x) {
        const size_t i = e / n_embd;
        const size_t j = e % n_embd;
        out[e] = from_bf16_bits(table[size_t(ids[i]) * n_embd + j]);
    }
}

// One block per row: sum of squares reduced in shared memory, then every element scaled.
__global__ void rms_norm_kernel(const float* x, const float* w, int d, float eps, float* out) {
    __shared__ float partial[kThreads];
    const float* xi = x + size_t(blockIdx.x) * d;
    float* oi = out + size_t(blockIdx.x) * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) ss += xi[j] * xi[j];
    partial[threadIdx.x] = ss;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    const float r = 1.0f / sqrtf(partial[0] / float(d) + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) oi[j] = w[j] * (xi[j] * r);
}

// One thread per rotated pair (token t, head h, i < half).
__global__ void rope_kernel(float* x, const int32_t* pos, int n, int n_head, int head_dim,
                            const float* inv_freq) {
    const int half = head_dim / 2;
    const size_t total = size_t(n) * n_head * half;
    for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < total;
         e += size_t(gridDim.x) * blockDim.x) {
        const int i = int(e % half);
        const size_t th = e / half;  // t * n_head + h
        const size_t t = th / n_head;
        const float theta = float(pos[t]) * inv_freq[i];
        const float c = cosf(theta);
        const float s = sinf(theta);
        float* v = x + th * head_dim;
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

__global__ void swiglu_kernel(const float* gate, const float* up, size_t n, float* out) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void add_kernel(float* y, const float* x, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        y[i] += x[i];
    }
}

__global__ void add_bias_kernel(float* out, const float* bias, int n, int m) {
    const size_t total = size_t(n) * m;
    for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < total;
         e += size_t(gridDim.x) * blockDim.x) {
        out[e] += bias[e % m];
    }
}

// One thread per row: the overflow-free merge of docs/design.md §5.3, as the CPU backend does it.
__global__ void lse_merge_kernel(float* o_a, float* lse_a, const float* o_b, const float* lse_b,
                                 int rows, int head_dim) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float a = lse_a[r];
    const float b = lse_b[r];
    if (b == -INFINITY) return;  // empty partial: nothing to merge
    float* oa = o_a + size_t(r) * head_dim;
    const float* ob = o_b + size_t(r) * head_dim;
    if (a == -INFINITY) {
        for (int d = 0; d < head_dim; ++d) oa[d] = ob[d];
        lse_a[r] = b;
        return;
    }
    const float e = expf(-fabsf(a - b));
    const float lse = fmaxf(a, b) + log1pf(e);
    const float w_hi = 1.0f / (1.0f + e);
    const float w_lo = e * w_hi;
    const float wa = a >= b ? w_hi : w_lo;
    const float wb = a >= b ? w_lo : w_hi;
    for (int d = 0; d < head_dim; ++d) oa[d] = wa * oa[d] + wb * ob[d];
    lse_a[r] = lse;
}

}  // namespace

void launch_cast_bf16(const CastBf16Params& p, void* stream) {
    if (p.n == 0) return;
    cast_bf16_kernel<<<grid_for(p.n), kThreads, 0, as_stream(stream)>>>(p.x, p.out, p.n);
    IF_CUDA_LAUNCH_CHECK("cast_bf16");
}

void launch_cast_rows_bf16(const CastRowsBf16Params& p, void* stream) {
    if (p.rows == 0 || p.cols == 0) return;
    IF_CHECK(p.x_stride >= p.cols,
             "cast_rows_bf16: row stride " << p.x_stride << " < " << p.cols << " columns");
    const unsigned blocks = grid_for(p.rows * p.cols);
    if (p.x16 != nullptr) {
        IF_CHECK(p.x_dtype != KvDtype::f32, "cast_rows_bf16: 16-bit rows given as f32");
        cast_rows16_bf16_kernel<<<blocks, kThreads, 0, as_stream(stream)>>>(
            p.x16, p.x_dtype == KvDtype::f16, p.x_stride, p.out, p.rows, p.cols);
    } else {
        cast_rows_bf16_kernel<<<blocks, kThreads, 0, as_stream(stream)>>>(p.x, p.x_stride, p.out,
                                                                          p.rows, p.cols);
    }
    IF_CUDA_LAUNCH_CHECK("cast_rows_bf16");
}

void launch_kv_narrow(const KvConvertParams& p, void* stream) {
    if (p.n == 0) return;
    IF_CHECK(p.t != KvDtype::f32, "kv_narrow: f32 is a copy, not a conversion");
    kv_narrow_kernel<<<grid_for(p.n), kThreads, 0, as_stream(stream)>>>(p.src, p.t == KvDtype::f16,
                                                                        p.n, p.dst);
    IF_CUDA_LAUNCH_CHECK("kv_narrow");
}

void launch_kv_widen(const KvConvertParams& p, void* stream) {
    if (p.n == 0) return;
    IF_CHECK(p.t != KvDtype::f32, "kv_widen: f32 is a copy, not a conversion");
    kv_widen_kernel<<<grid_for(p.n), kThreads, 0, as_stream(stream)>>>(p.src16, p.t == KvDtype::f16,
                                                                       p.n, p.dst32);
    IF_CUDA_LAUNCH_CHECK("kv_widen");
}

void launch_fill_random_bf16(const FillRandomParams& p, void* stream) {
    if (p.n == 0) return;
    fill_random_bf16_kernel<<<grid_for(p.n), kThreads, 0, as_stream(stream)>>>(p.out, p.n, p.key,
                                                                               p.scale);
    IF_CUDA_LAUNCH_CHECK("fill_random_bf16");
}

void launch_embed(const EmbedParams& p, void* stream) {
    const size_t total = size_t(p.n) * p.n_embd;
    if (total == 0) return;
    embed_kernel<<<grid_for(total), kThreads, 0, as_stream(stream)>>>(p.table, p.ids, p.n, p.n_embd,
                                                                      p.out);
    IF_CUDA_LAUNCH_CHECK("embed");
}

void launch_rms_norm(const RmsNormParams& p, void* stream) {
    if (p.n == 0 || p.d == 0) return;
    const LaunchDims l = plan_rms_norm(p.n);
    rms_norm_kernel<<<unsigned(l.grid[0]), l.block[0], 0, as_stream(stream)>>>(p.x, p.w, p.d, p.eps,
                                                                               p.out);
    IF_CUDA_LAUNCH_CHECK("rms_norm");
}

void launch_rope(const RopeParams& p, void* stream) {
    const size_t total = size_t(p.n) * p.n_head * (p.head_dim / 2);
    if (total == 0) return;
    rope_kernel<<<grid_for(total), kThreads, 0, as_stream(stream)>>>(p.x, p.pos, p.n, p.n_head,
                                                                     p.head_dim, p.inv_freq);
    IF_CUDA_LAUNCH_CHECK("rope");
}

void launch_swiglu(const SwigluParams& p, void* stream) {
    if (p.n == 0) return;
    swiglu_kernel<<<grid_for(p.n), kThreads, 0, as_stream(stream)>>>(p.gate, p.up, p.n, p.out);
    IF_CUDA_LAUNCH_CHECK("swiglu");
}

void launch_add(const AddParams& p, void* stream) {
    if (p.n == 0) return;
    add_kernel<<<grid_for(p.n), kThreads, 0, as_stream(stream)>>>(p.y, p.x, p.n);
    IF_CUDA_LAUNCH_CHECK("add");
}

void launch_add_bias(const AddBiasParams& p, void* stream) {
    const size_t total = size_t(p.n) * p.m;
    if (total == 0) return;
    add_bias_kernel<<<grid_for(total), kThreads, 0, as_stream(stream)>>>(p.out, p.bias, p.n, p.m);
    IF_CUDA_LAUNCH_CHECK("add_bias");
}

void launch_lse_merge(const LseMergeParams& p, void* stream) {
    if (p.rows == 0) return;
    const LaunchDims l = plan_lse_merge(p.rows);
    lse_merge_kernel<<<unsigned(l.grid[0]), l.block[0], 0, as_stream(stream)>>>(
        p.o_a, p.lse_a, p.o_b, p.lse_b, p.rows, p.head_dim);
    IF_CUDA_LAUNCH_CHECK("lse_merge");
}

}  // namespace infoflow::cuda
