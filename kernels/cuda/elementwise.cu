// Element-wise and per-row kernels of the CUDA backend: bf16 cast and random fill, embedding
// gather, RMSNorm, RoPE, SwiGLU, add, bias, LSE merge. Written plainly (grid-stride loops, one
// block per row where a row is reduced); the CPU backend is the reference for each.
#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/random_init.h"

namespace infoflow::cuda {
namespace {

constexpr int kThreads = 256;

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Enough blocks for a grid-stride loop over n elements, capped (the loop covers the rest).
unsigned grid_for(size_t n) {
    const size_t blocks = (n + kThreads - 1) / kThreads;
    return unsigned(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

__device__ inline uint16_t to_bf16_bits(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ inline float from_bf16_bits(uint16_t b) {
    return __bfloat162float(__ushort_as_bfloat16(b));
}

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
    cast_rows_bf16_kernel<<<grid_for(p.rows * p.cols), kThreads, 0, as_stream(stream)>>>(
        p.x, p.x_stride, p.out, p.rows, p.cols);
    IF_CUDA_LAUNCH_CHECK("cast_rows_bf16");
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
    rms_norm_kernel<<<unsigned(p.n), kThreads, 0, as_stream(stream)>>>(p.x, p.w, p.d, p.eps, p.out);
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
    const unsigned blocks = unsigned((p.rows + kThreads - 1) / kThreads);
    lse_merge_kernel<<<blocks, kThreads, 0, as_stream(stream)>>>(p.o_a, p.lse_a, p.o_b, p.lse_b,
                                                                 p.rows, p.head_dim);
    IF_CUDA_LAUNCH_CHECK("lse_merge");
}

}  // namespace infoflow::cuda
