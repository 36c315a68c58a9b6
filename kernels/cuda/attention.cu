// Plain attention kernels of the CUDA backend under the full visibility rule of AttnParams
// (docs/design.md §5.2): the GPU-side oracle and fallback for the library kernels, and the InfoFlow
// column scores. Written for obvious correctness, not speed; the CPU backend is the reference.
// K/V come in the cache's storage type (fp32, f16 or bf16) and are widened per element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_plan.h"

namespace infoflow::cuda {
namespace {

constexpr int kDimsPerThread = kMaxHeadDim / kAttnThreads;

// One K/V element as fp32, from the storage type's bits.
__device__ inline float kv_load(const float* p, size_t i) { return p[i]; }
struct Bf16Bits {
    const uint16_t* p;
};
struct F16Bits {
    const uint16_t* p;
};
__device__ inline float kv_load(Bf16Bits b, size_t i) {
    return __bfloat162float(__ushort_as_bfloat16(b.p[i]));
}
__device__ inline float kv_load(F16Bits b, size_t i) {
    return __half2float(__ushort_as_half(b.p[i]));
}

__device__ inline bool visible(int32_t kp, int32_t kg, int32_t qp, int32_t qg, bool groups) {
    return kp <= qp && (!groups || kg < 0 || kg == qg);
}

// Block-wide max / sum over kAttnThreads values (every thread gets the result).
__device__ float block_max(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = kAttnThreads / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    const float r = red[0];
    __syncthreads();
    return r;
}
__device__ float block_sum(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = kAttnThreads / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    const float r = red[0];
    __syncthreads();
    return r;
}

// Block (query i, head h). Thread t scores key j0 + t of each tile and owns output dims
// t, t + kAttnThreads, ...; the tile's probabilities pass through shared memory. K and V are
// read through kv_load (KV: const float*, Bf16Bits or F16Bits).
template <class KV>
__global__ void attention_kernel(AttnParams p, KV k, KV v) {
    __shared__ float q_s[kMaxHeadDim];
    __shared__ float p_s[kAttnThreads];
    __shared__ float red[kAttnThreads];
    const int D = p.head_dim;
    const int i = blockIdx.x / p.n_head;
    const int h = blockIdx.x % p.n_head;
    const int hk = h / (p.n_head / p.n_head_kv);
    const int tid = threadIdx.x;
    const float* qi = p.q + (size_t(i) * p.n_head + h) * D;
    for (int d = tid; d < D; d += kAttnThreads) q_s[d] = qi[d] * p.scale;
    __syncthreads();
    const int32_t qp = p.q_pos[i];
    const int32_t qg = p.q_group ? p.q_group[i] : 0;
    const bool groups = p.k_group != nullptr;

    float m = -INFINITY;  // running max
    float l = 0.0f;       // running sum of exp(s - m)
    float o[kDimsPerThread];
    for (int r = 0; r < kDimsPerThread; ++r) o[r] = 0.0f;

    for (int j0 = 0; j0 < p.n_kv; j0 += kAttnThreads) {
        const int j = j0 + tid;
        float s = -INFINITY;
        if (j < p.n_kv && visible(p.k_pos[j], groups ? p.k_group[j] : -1, qp, qg, groups)) {
            const size_t kj = size_t(j) * p.kv_stride + size_t(hk) * D;
            float dot = 0.0f;
            for (int d = 0; d < D; ++d) dot += q_s[d] * kv_load(k, kj + d);
            s = dot;
        }
        const float tile_max = block_max(s, red);
        if (tile_max == -INFINITY) continue;  // uniform across the block: no visible key here
        const float m_new = fmaxf(m, tile_max);
        const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
        const float pj = s == -INFINITY ? 0.0f : expf(s - m_new);
        p_s[tid] = pj;
        const float tile_sum = block_sum(pj, red);  // its barriers also publish p_s
        l = l * alpha + tile_sum;
        const int nk = min(kAttnThreads, p.n_kv - j0);
        for (int r = 0; r < kDimsPerThread; ++r) {
            const int d = tid + r * kAttnThreads;
            if (d >= D) break;
            float acc = o[r] * alpha;
            for (int jj = 0; jj < nk; ++jj) {
                const float w = p_s[jj];
                if (w != 0.0f) {
                    acc += w * kv_load(v, size_t(j0 + jj) * p.kv_stride + size_t(hk) * D + d);
                }
            }
            o[r] = acc;
        }
        m = m_new;
        __syncthreads();  // p_s is rewritten by the next tile
    }

    float* out = p.out + (size_t(i) * p.n_head + h) * D;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int r = 0; r < kDimsPerThread; ++r) {
        const int d = tid + r * kAttnThreads;
        if (d < D) out[d] = o[r] * inv;
    }
    if (p.lse && tid == 0) p.lse[size_t(i) * p.n_head + h] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// Thread = column j. For each query row i (its scaled q and lse staged in shared memory), the
// head-sum A = sum_h P[h, i, j] is formed and added ("sum") or squared after the head mean
// ("norm"). Keys are read through kv_load, as in attention_kernel.
template <class KV>
__global__ void attention_scores_kernel(ScoreParams p, KV k) {
    extern __shared__ float smem[];
    const int H = p.n_head;
    const int D = p.head_dim;
    float* q_s = smem;            // [H * D]
    float* lse_s = smem + H * D;  // [H]
    const int j = blockIdx.x * kScoreThreads + threadIdx.x;
    const bool active = j < p.n_cols;
    const int g = H / p.n_head_kv;
    const bool groups = p.k_group != nullptr;
    const int32_t kp = active ? p.k_pos[j] : 0;
    const int32_t kg = active && groups ? p.k_group[j] : -1;
    double col = 0.0;
    for (int i = 0; i < p.n_q; ++i) {
        __syncthreads();  // the previous row's q_s is no longer read
        for (int e = threadIdx.x; e < H * D; e += kScoreThreads) {
            q_s[e] = p.q[size_t(i) * H * D + e] * p.scale;
        }
        for (int e = threadIdx.x; e < H; e += kScoreThreads) lse_s[e] = p.lse[size_t(i) * H + e];
        __syncthreads();
        if (!active) continue;
        const int32_t qp = p.q_pos[i];
        const int32_t qg = p.q_group ? p.q_group[i] : 0;
        if (!visible(kp, kg, qp, qg, groups)) continue;
        float a = 0.0f;
        for (int h = 0; h < H; ++h) {
            const float lse = lse_s[h];
            if (lse == -INFINITY) continue;
            const size_t kj = size_t(j) * p.kv_stride + size_t(h / g) * D;
            const float* qh = q_s + h * D;
            float dot = 0.0f;
            for (int d = 0; d < D; ++d) dot += qh[d] * kv_load(k, kj + d);
            const float x = dot - lse;
            a += x < -87.0f ? 0.0f : expf(x);
        }
        if (p.aggregate_sum) {
            col += a;
        } else {
            const double mean = double(a) / H;
            col += mean * mean;
        }
    }
    if (active) p.col[j] += float(col);
}

}  // namespace

void launch_attention(const AttnParams& p, void* stream) {
    if (p.n_q == 0) return;
    const LaunchDims l = plan_attention_own(p.n_q, p.n_head);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    const unsigned blocks = unsigned(l.grid[0]), threads = l.block[0];
    switch (p.kv_dtype) {
        case KvDtype::f32:
            attention_kernel<<<blocks, threads, 0, s>>>(p, p.k, p.v);
            break;
        case KvDtype::bf16:
            attention_kernel<<<blocks, threads, 0, s>>>(p, Bf16Bits{p.k16}, Bf16Bits{p.v16});
            break;
        case KvDtype::f16:
            attention_kernel<<<blocks, threads, 0, s>>>(p, F16Bits{p.k16}, F16Bits{p.v16});
            break;
    }
    IF_CUDA_LAUNCH_CHECK("attention");
}

void launch_attention_scores(const ScoreParams& p, void* stream) {
    if (p.n_q == 0 || p.n_cols == 0) return;
    const LaunchDims l = plan_attention_scores(p.n_cols, p.n_head, p.head_dim);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    const unsigned blocks = unsigned(l.grid[0]), threads = l.block[0];
    switch (p.kv_dtype) {
        case KvDtype::f32:
            attention_scores_kernel<<<blocks, threads, l.dyn_smem, s>>>(p, p.k);
            break;
        case KvDtype::bf16:
            attention_scores_kernel<<<blocks, threads, l.dyn_smem, s>>>(p, Bf16Bits{p.k16});
            break;
        case KvDtype::f16:
            attention_scores_kernel<<<blocks, threads, l.dyn_smem, s>>>(p, F16Bits{p.k16});
            break;
    }
    IF_CUDA_LAUNCH_CHECK("attention_scores");
}

}  // namespace infoflow::cuda
