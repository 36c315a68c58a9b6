// Launch plans of the CUDA backend (see launch_plan.h).
#include "kernels/cuda/launch_plan.h"

#include <algorithm>
#include <sstream>

#include "kernels/cuda/attn_mask.h"
#include "kernels/cuda/flashinfer_smem.h"
#include "kernels/cuda/launch.h"

namespace infoflow {

namespace {

constexpr unsigned kGridStrideThreads = cuda::kThreads;
constexpr uint64_t kGridStrideMaxBlocks = 65536;
constexpr unsigned kAttnThreads = cuda::kAttnThreads;
constexpr unsigned kScoreThreads = cuda::kScoreThreads;
constexpr uint64_t kU32 = uint64_t(1) << 32;

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

LaunchDims dims(const char* kernel, uint64_t blocks, unsigned threads) {
    LaunchDims l;
    l.kernel = kernel;
    l.grid[0] = blocks;
    l.block[0] = threads;
    return l;
}

}  // namespace

DeviceLimits h200_limits() {
    DeviceLimits d;
    d.smem_optin = 232448;   // 227 KiB
    d.smem_per_sm = 233472;  // 228 KiB
    d.num_sm = 132;
    return d;
}

std::string launch_violation(const LaunchDims& l, const DeviceLimits& d) {
    std::ostringstream os;
    const uint64_t smem = l.dyn_smem + l.static_smem;
    if (l.grid[0] < 1 || l.grid[1] < 1 || l.grid[2] < 1) {
        os << "empty grid";
    } else if (l.grid[0] > uint64_t(d.max_grid_x)) {
        os << "grid.x " << l.grid[0] << " > " << d.max_grid_x;
    } else if (l.grid[1] > uint64_t(d.max_grid_yz) || l.grid[2] > uint64_t(d.max_grid_yz)) {
        os << "grid.y/z " << l.grid[1] << "/" << l.grid[2] << " > " << d.max_grid_yz;
    } else if (l.threads() < 1 || l.threads() > uint64_t(d.max_threads_per_block)) {
        os << l.threads() << " threads per block outside [1, " << d.max_threads_per_block << "]";
    } else if (smem > uint64_t(d.smem_optin)) {
        os << smem << " bytes of shared memory > the " << d.smem_optin << " a block can have";
    } else if (smem > uint64_t(d.smem_default) && !l.opt_in) {
        os << smem << " bytes of shared memory > " << d.smem_default << " without opting in";
    }
    const std::string why = os.str();
    return why.empty() ? why : std::string(l.kernel) + ": " + why;
}

LaunchDims plan_grid_stride(const char* kernel, size_t n) {
    const uint64_t blocks = ceil_div(n, kGridStrideThreads);
    return dims(kernel, std::max<uint64_t>(1, std::min(blocks, kGridStrideMaxBlocks)),
                kGridStrideThreads);
}

LaunchDims plan_rms_norm(int rows) {
    LaunchDims l = dims("rms_norm", uint64_t(rows), kGridStrideThreads);
    l.static_smem = kGridStrideThreads * sizeof(float);
    return l;
}

LaunchDims plan_lse_merge(int rows) {
    return dims("lse_merge", ceil_div(uint64_t(rows), kGridStrideThreads), kGridStrideThreads);
}

LaunchDims plan_attention_own(int n_q, int n_head) {
    LaunchDims l = dims("attention", uint64_t(n_q) * uint64_t(n_head), kAttnThreads);
    l.static_smem = (cuda::kMaxHeadDim + 2 * kAttnThreads) * sizeof(float);
    return l;
}

LaunchDims plan_attention_scores(int n_cols, int n_head, int head_dim) {
    LaunchDims l =
        dims("attention_scores", ceil_div(uint64_t(n_cols), kScoreThreads), kScoreThreads);
    l.dyn_smem = size_t(n_head) * (size_t(head_dim) + 1) * sizeof(float);
    return l;
}

LaunchDims plan_mask_build(int n_q, int n_kv) {
    return dims("attn_mask_build", ceil_div(attn_mask_bytes(n_q, n_kv), 256), 256);
}

FlashPlan flashinfer_plan(int n_q, int n_kv, int n_head, int n_head_kv, int head_dim,
                          const FlashTile& tile, int resident_blocks) {
    FlashPlan p;
    p.tile = tile;
    const uint64_t group = uint64_t(n_head / n_head_kv);
    const uint64_t q_tiles = ceil_div(uint64_t(n_q) * group, uint64_t(tile.cta_tile_q));
    p.num_chunks = flashinfer_split_chunks(int(q_tiles * n_head_kv), n_kv, resident_blocks);
    // FlashInfer's layouts: CTA_TILE_Q 128 = 4 query warps x 1 KV warp; 16 = 1 x 4.
    const unsigned warps_q = tile.cta_tile_q == 16 ? 1 : 4;
    const unsigned warps_kv = tile.cta_tile_q == 16 ? 4 : 1;
    p.attn.kernel = "flashinfer_prefill";
    p.attn.grid[0] = q_tiles;
    p.attn.grid[1] = uint64_t(p.num_chunks);
    p.attn.grid[2] = uint64_t(n_head_kv);
    p.attn.block[0] = 32;
    p.attn.block[1] = warps_q;
    p.attn.block[2] = warps_kv;
    p.attn.dyn_smem = flashinfer_smem_bytes(tile.cta_tile_q, tile.num_mma_kv, head_dim);
    p.attn.opt_in = true;  // the launcher sets the attribute before every launch
    const uint64_t rows = uint64_t(n_q) * uint64_t(n_head);
    if (p.num_chunks > 1) {
        p.epilogue = dims("merge_chunks", rows, unsigned(head_dim));
        p.workspace = size_t(p.num_chunks) * size_t(rows) * (size_t(head_dim) + 1) * sizeof(float);
    } else {
        p.epilogue = dims("lse_log2_to_ln", ceil_div(rows, 256), 256);
    }
    return p;
}

int flashinfer_blocks_per_sm_bound(const FlashTile& tile, int head_dim, const DeviceLimits& d) {
    const size_t smem = flashinfer_smem_bytes(tile.cta_tile_q, tile.num_mma_kv, head_dim);
    const int threads = 32 * 4 * 1;                                  // both layouts have 4 warps
    const int by_smem = int(size_t(d.smem_per_sm) / (smem + 1024));  // 1 KiB reserved per block
    return std::max(1, std::min({by_smem, d.max_threads_per_sm / threads, d.max_blocks_per_sm}));
}

std::string flashinfer_index_violation(int n_q, int n_kv, int n_head, int n_head_kv, int head_dim,
                                       int kv_stride, int num_chunks) {
    const uint64_t q = uint64_t(n_q), hd = uint64_t(head_dim), h = uint64_t(n_head);
    const uint64_t stride = kv_stride > 0 ? uint64_t(kv_stride) : uint64_t(n_head_kv) * hd;
    const uint64_t group = n_head_kv > 0 ? h / uint64_t(n_head_kv) : 0;
    struct Term {
        const char* what;
        uint64_t elems;
    };
    const Term terms[] = {
        {"q elements (n_q * n_head * head_dim)", q * h * hd},
        {"k/v elements (n_kv * kv_stride)", uint64_t(n_kv) * stride},
        {"output elements (n_q * chunks * n_head * head_dim)", q * uint64_t(num_chunks) * h * hd},
        {"packed query rows (n_q * group)", q * group},
        {"packed key rows (n_kv * group)", uint64_t(n_kv) * group},
    };
    for (const Term& t : terms) {
        if (t.elems >= kU32) {
            std::ostringstream os;
            os << t.what << " = " << t.elems << " overflows the 32-bit index FlashInfer uses";
            return os.str();
        }
    }
    return "";
}

bool flash_kv_in_place(KvDtype kv_dtype, const void* k, const void* v, int kv_stride) {
    const auto aligned = [](const void* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; };
    return kv_dtype == KvDtype::bf16 && kv_stride % 8 == 0 && aligned(k) && aligned(v);
}

FlashScratch plan_flash_scratch(int n_q, int n_kv, int n_head, int n_head_kv, int head_dim,
                                bool kv_in_place, bool masked, size_t workspace_bytes) {
    const auto up256 = [](size_t b) { return (b + 255) / 256 * 256; };
    FlashScratch s;
    s.stage_kv = !kv_in_place;
    const size_t row = size_t(n_head_kv) * size_t(head_dim);  // packed bf16 k/v row
    s.q_bytes = up256(size_t(n_q) * size_t(n_head) * size_t(head_dim) * sizeof(uint16_t));
    s.kv_bytes = s.stage_kv ? up256(size_t(n_kv) * row * sizeof(uint16_t)) : 0;
    s.mask_bytes = masked ? up256(attn_mask_bytes(n_q, n_kv)) : 0;
    s.workspace_bytes = up256(workspace_bytes);
    s.q = 0;
    s.k = s.q + s.q_bytes;
    s.v = s.k + s.kv_bytes;
    s.mask = s.v + s.kv_bytes;
    s.workspace = s.mask + s.mask_bytes;
    s.total = s.workspace + s.workspace_bytes;
    return s;
}

}  // namespace infoflow
