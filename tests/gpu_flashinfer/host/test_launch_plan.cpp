// The CUDA backend's launch plans (kernels/cuda/launch_plan.h) for the paper's shapes on the
// H200, on the CPU: every kernel the backend launches for llama-3.1-8b and qwen3-14b at 8K, 16K
// and 32K tokens on 4 ranks (and on one, for single-GPU `full`) has its grid and block within
// the device's limits, its shared memory within the per-block maximum and opted in above 48 KiB,
// workspaces and scratch of the sizes and layout the launchers use, and no index that the
// kernels form in 32 bits overflowing. The attention calls of every method are covered by a grid
// of (queries, keys): single prefill (N, N), shard prefill (N/P + sink), ring blocks (N/P over
// N/P), the recompute's selected rows (15% of N, over all N keys; split over P ranks or not),
// decode (1 over N/P and N), the question's rows for scoring (64 over N/P and N). The GEMMs'
// plans for the same shapes: tests/kernels/test_device_plan.cpp.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/attn_mask.h"
#include "kernels/cuda/flashinfer_attention.h"
#include "kernels/cuda/flashinfer_smem.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_plan.h"
#include "paper_shapes.h"

using namespace infoflow;
using infoflow::test::kPaperShapes;
using infoflow::test::PaperShape;

namespace {

constexpr int kRanks = 4;
constexpr int kLengths[] = {8192, 16384, 32768};
constexpr uint64_t kI32 = uint64_t(1) << 31;
constexpr size_t kMaxMaskBytes = size_t(256) << 20;  // attn_dispatch's default limit

struct Call {
    const char* what;
    int n_q, n_kv;
};

// The attention calls of every method at context length n on P ranks (see the file comment).
std::vector<Call> attention_calls(int n, int p) {
    const int shard = n / p, selected = (n * 15 + 99) / 100;
    return {
        {"single prefill", n, n},
        {"shard prefill", shard + 1, shard + 1},
        {"ring block", shard, shard},
        {"recompute rows of one rank", (selected + p - 1) / p, n},
        {"recompute rows, exact exchange", selected, n},
        {"decode over a shard", 1, shard},
        {"decode", 1, n},
        {"scoring question rows", 64, shard},
        {"scoring question rows, all keys", 64, n},
    };
}

void check_fits(const LaunchDims& l, const DeviceLimits& d) {
    INFO(l.kernel << " grid " << l.grid[0] << "x" << l.grid[1] << "x" << l.grid[2] << " block "
                  << l.block[0] << "x" << l.block[1] << "x" << l.block[2] << " smem "
                  << l.dyn_smem + l.static_smem);
    CHECK(launch_violation(l, d).empty());
}

}  // namespace

TEST_CASE("launch plan: FlashInfer's shared memory as its SharedStorage holds it",
          "[launch_plan]") {
    // sizeof(SharedStorage) of the instantiated kernels as nvcc computed it (bf16 q/k/v, fp32
    // out); flashinfer_attention_impl.cuh static_asserts the formula against every one built.
    CHECK(flashinfer_smem_bytes(16, 2, 64) == 34816);
    CHECK(flashinfer_smem_bytes(16, 4, 64) == 67584);
    CHECK(flashinfer_smem_bytes(128, 2, 64) == 32768);
    CHECK(flashinfer_smem_bytes(128, 4, 64) == 32768);
    CHECK(flashinfer_smem_bytes(16, 2, 128) == 69632);
    CHECK(flashinfer_smem_bytes(16, 4, 128) == 135168);
    CHECK(flashinfer_smem_bytes(128, 2, 128) == 65536);
    CHECK(flashinfer_smem_bytes(128, 4, 128) == 65536);
}

TEST_CASE("launch plan: limits are enforced", "[launch_plan]") {
    const DeviceLimits d = h200_limits();
    LaunchDims l;
    l.kernel = "k";
    l.block[0] = 128;
    CHECK(launch_violation(l, d).empty());
    l.dyn_smem = 64 * 1024;  // above 48 KiB without opting in
    CHECK(launch_violation(l, d).find("without opting in") != std::string::npos);
    l.opt_in = true;
    CHECK(launch_violation(l, d).empty());
    l.dyn_smem = size_t(d.smem_optin) + 1;
    CHECK(launch_violation(l, d).find("a block can have") != std::string::npos);
    l.dyn_smem = 0;
    l.block[0] = 2048;
    CHECK_FALSE(launch_violation(l, d).empty());
    l.block[0] = 128;
    l.grid[1] = 65536;
    CHECK(launch_violation(l, d).find("grid.y/z") != std::string::npos);
    l.grid[1] = 1;
    l.grid[0] = kI32;
    CHECK(launch_violation(l, d).find("grid.x") != std::string::npos);
    // 32-bit indices: 2^20 query rows of 32 heads of 128 = 2^32 elements.
    CHECK_FALSE(flashinfer_index_violation(1 << 20, 1024, 32, 8, 128, 0, 1).empty());
    CHECK(flashinfer_index_violation(32768, 32768, 40, 8, 128, 0, 1).empty());
}

TEST_CASE("launch plan: own kernels for the paper's shapes fit the H200", "[launch_plan]") {
    const DeviceLimits d = h200_limits();
    for (const PaperShape& m : kPaperShapes) {
        for (int n : kLengths) {
            CAPTURE(m.name, n);
            for (const Call& c : attention_calls(n, kRanks)) {
                CAPTURE(c.what, c.n_q, c.n_kv);
                const LaunchDims own = plan_attention_own(c.n_q, m.n_head);
                check_fits(own, d);
                CHECK(own.block[0] == unsigned(cuda::kAttnThreads));
                // The kernel's block index is (query, head): an int.
                CHECK(uint64_t(c.n_q) * m.n_head < kI32);
                const LaunchDims sc = plan_attention_scores(c.n_kv, m.n_head, m.head_dim);
                check_fits(sc, d);
                CHECK(sc.dyn_smem <= size_t(cuda::kMaxScoreSharedFloats) * sizeof(float));
                CHECK_FALSE(sc.opt_in);
                check_fits(plan_lse_merge(c.n_q * m.n_head), d);
                check_fits(plan_mask_build(c.n_q, c.n_kv), d);
            }
            // Per token, per layer: norms over n rows, elementwise over the widest activation.
            check_fits(plan_rms_norm(n), d);
            for (size_t elems : {size_t(n) * m.n_embd, size_t(n) * m.n_ff,
                                 size_t(n) * m.n_head * m.head_dim / 2}) {
                const LaunchDims g = plan_grid_stride("elementwise", elems);
                check_fits(g, d);
                CHECK(g.blocks() * g.threads() <= elems + g.threads());  // grid-stride covers
            }
        }
    }
}

TEST_CASE("launch plan: FlashInfer for the paper's shapes fits the H200", "[launch_plan]") {
    const DeviceLimits d = h200_limits();
    for (const PaperShape& m : kPaperShapes) {
        const int row = m.n_head_kv * m.head_dim;
        for (int n : kLengths) {
            for (const Call& c : attention_calls(n, kRanks)) {
                CAPTURE(m.name, n, c.what, c.n_q, c.n_kv);
                const int packed = c.n_q * (m.n_head / m.n_head_kv);
                const FlashTile tile =
                    flashinfer_tile(packed, m.head_dim, d.smem_per_sm, d.smem_optin);
                REQUIRE(tile.num_mma_kv > 0);
                const int per_sm = flashinfer_blocks_per_sm_bound(tile, m.head_dim, d);
                const FlashPlan pl = flashinfer_plan(c.n_q, c.n_kv, m.n_head, m.n_head_kv,
                                                     m.head_dim, tile, per_sm * d.num_sm);
                check_fits(pl.attn, d);
                check_fits(pl.epilogue, d);
                CHECK(pl.attn.dyn_smem ==
                      flashinfer_smem_bytes(tile.cta_tile_q, tile.num_mma_kv, m.head_dim));
                if (pl.attn.dyn_smem > size_t(d.smem_default)) CHECK(pl.attn.opt_in);
                CHECK(pl.attn.threads() == 128);
                CHECK(pl.attn.grid[2] == uint64_t(m.n_head_kv));
                // Few query rows split the keys; many fill the device without.
                if (pl.num_chunks > 1) {
                    CHECK(pl.workspace == size_t(pl.num_chunks) * c.n_q * m.n_head *
                                              (size_t(m.head_dim) + 1) * sizeof(float));
                    CHECK(pl.workspace <= (size_t(64) << 20));
                    CHECK(pl.epilogue.block[0] == unsigned(m.head_dim));
                } else {
                    CHECK(pl.workspace == 0);
                }
                CHECK(flashinfer_index_violation(c.n_q, c.n_kv, m.n_head, m.n_head_kv, m.head_dim,
                                                 row, pl.num_chunks)
                          .empty());
                // The custom mask (shard and selection visibility) within the dispatch limit.
                CHECK(attn_mask_bytes(c.n_q, c.n_kv) <= kMaxMaskBytes);
                // Scratch of the call: a bf16 cache is read in place, f32/f16 rows are staged.
                for (bool in_place : {false, true}) {
                    const FlashScratch sc =
                        plan_flash_scratch(c.n_q, c.n_kv, m.n_head, m.n_head_kv, m.head_dim,
                                           in_place, true, pl.workspace);
                    for (size_t off : {sc.q, sc.k, sc.v, sc.mask, sc.workspace}) {
                        CHECK(off % 256 == 0);
                    }
                    CHECK(sc.q_bytes >= size_t(c.n_q) * m.n_head * m.head_dim * 2);
                    CHECK(sc.kv_bytes ==
                          (in_place ? 0 : (size_t(c.n_kv) * row * 2 + 255) / 256 * 256));
                    CHECK(sc.mask_bytes >= attn_mask_bytes(c.n_q, c.n_kv));
                    CHECK(sc.total == sc.workspace + sc.workspace_bytes);
                    CHECK(sc.workspace_bytes >= pl.workspace);
                    // The largest (single-GPU 32K prefill of qwen3-14b) stays under 1 GiB.
                    CHECK(sc.total <= (size_t(1) << 30));
                }
            }
        }
    }
}

TEST_CASE("launch plan: a bf16 cache is read in place only where FlashInfer can", "[launch_plan]") {
    alignas(16) static uint16_t rows[64];
    CHECK(flash_kv_in_place(KvDtype::bf16, rows, rows + 8, 1024));
    CHECK_FALSE(flash_kv_in_place(KvDtype::f16, rows, rows, 1024));  // FlashInfer reads bf16
    CHECK_FALSE(flash_kv_in_place(KvDtype::f32, rows, rows, 1024));
    CHECK_FALSE(flash_kv_in_place(KvDtype::bf16, rows + 1, rows, 1024));  // 2-byte aligned
    CHECK_FALSE(flash_kv_in_place(KvDtype::bf16, rows, rows, 388));       // stride % 8 != 0
    const FlashScratch staged = plan_flash_scratch(100, 1000, 32, 8, 128, false, false, 0);
    const FlashScratch direct = plan_flash_scratch(100, 1000, 32, 8, 128, true, false, 0);
    CHECK(staged.kv_bytes == 1000 * 1024 * 2);
    CHECK(direct.kv_bytes == 0);
    CHECK(direct.total == staged.total - 2 * staged.kv_bytes);
}
