// Which GPU attention kernel a call takes (kernels/cuda/attn_dispatch.h), on hand-built cases:
// the FlashInfer causal rule only where it equals `key_pos <= query_pos`, the custom mask for
// every other position/group layout, the own kernel where FlashInfer cannot run.
#include <catch2/catch.hpp>
#include <numeric>
#include <vector>

#include "kernels/cuda/attn_dispatch.h"

using namespace infoflow;

namespace {

struct Case {
    std::vector<int32_t> q_pos, k_pos, q_group, k_group;
    int n_head = 32, n_head_kv = 8, head_dim = 128;
    bool built = true;
    size_t max_mask_bytes = size_t(256) << 20;
};

AttnDispatch decide(const Case& c) {
    AttnDispatchInput in;
    in.q_pos = c.q_pos.data();
    in.k_pos = c.k_pos.data();
    in.q_group = c.q_group.empty() ? nullptr : c.q_group.data();
    in.k_group = c.k_group.empty() ? nullptr : c.k_group.data();
    in.n_q = int(c.q_pos.size());
    in.n_kv = int(c.k_pos.size());
    in.n_head = c.n_head;
    in.n_head_kv = c.n_head_kv;
    in.head_dim = c.head_dim;
    in.flashinfer_built = c.built;
    in.max_mask_bytes = c.max_mask_bytes;
    return attn_dispatch(in);
}

std::vector<int32_t> range(int from, int to) {  // [from, to)
    std::vector<int32_t> v(size_t(to - from));
    std::iota(v.begin(), v.end(), from);
    return v;
}

}  // namespace

TEST_CASE("attn_dispatch: dense causal where the queries are the last rows", "[attn_dispatch]") {
    Case c;
    c.q_pos = range(0, 8);
    c.k_pos = range(0, 8);
    CHECK(decide(c).kernel == AttnKernel::kFlashCausal);
    // A chunk prefilled at its global positions.
    c.q_pos = range(100, 108);
    c.k_pos = range(100, 108);
    CHECK(decide(c).kernel == AttnKernel::kFlashCausal);
    // Suffix rows after a cached context: the last 3 of 10.
    c.q_pos = range(7, 10);
    c.k_pos = range(0, 10);
    CHECK(decide(c).kernel == AttnKernel::kFlashCausal);
    // Sorted keys with a position gap (dropped sink): q at 10, 11 see prefixes of 4 and 5 keys.
    c.q_pos = {10, 11};
    c.k_pos = {0, 1, 2, 10, 11};
    CHECK(decide(c).kernel == AttnKernel::kFlashCausal);
    // Duplicate key positions still give prefixes {0,1,2} and {0,1,2,3}.
    c.q_pos = {1, 2};
    c.k_pos = {0, 1, 1, 2};
    CHECK(decide(c).kernel == AttnKernel::kFlashCausal);
    // Groups that restrict nothing: every key shared, or every key in the queries' one group.
    c.q_pos = range(0, 4);
    c.k_pos = range(0, 4);
    c.q_group = {0, 0, 0, 0};
    c.k_group = {-1, -1, -1, -1};
    CHECK(decide(c).kernel == AttnKernel::kFlashCausal);
    c.k_group = {-1, 0, 0, -1};
    CHECK(decide(c).kernel == AttnKernel::kFlashCausal);
}

TEST_CASE("attn_dispatch: decode is one row that sees every key", "[attn_dispatch]") {
    Case c;
    c.q_pos = {10};
    c.k_pos = range(0, 11);
    CHECK(decide(c).kernel == AttnKernel::kFlashDecode);
    // Key order does not matter for a single row that sees all keys.
    c.k_pos = {5, 0, 10, 3, 7};
    CHECK(decide(c).kernel == AttnKernel::kFlashDecode);
    // One row that does not see every key needs the mask.
    c.k_pos = {5, 0, 11, 3};
    CHECK(decide(c).kernel == AttnKernel::kFlashMasked);
}

TEST_CASE("attn_dispatch: everything else takes the custom mask", "[attn_dispatch]") {
    Case c;
    // Sparse-query recompute: selected queries 3 and 7 over keys 0..9.
    c.q_pos = {3, 7};
    c.k_pos = range(0, 10);
    AttnDispatch d = decide(c);
    CHECK(d.kernel == AttnKernel::kFlashMasked);
    CHECK(d.mask_bytes == 3);  // 20 bits
    // Unsorted keys.
    c.q_pos = {8, 9};
    c.k_pos = {0, 2, 1, 3, 4, 5, 6, 7, 8, 9};
    CHECK(decide(c).kernel == AttnKernel::kFlashMasked);
    // Unsorted queries.
    c.q_pos = {9, 8};
    c.k_pos = range(0, 10);
    CHECK(decide(c).kernel == AttnKernel::kFlashMasked);
    // More queries than keys.
    c.q_pos = range(0, 4);
    c.k_pos = range(0, 3);
    CHECK(decide(c).kernel == AttnKernel::kFlashMasked);
    // A query that sees no key.
    c.q_pos = {0};
    c.k_pos = {1, 2};
    CHECK(decide(c).kernel == AttnKernel::kFlashMasked);
    // Shard visibility: queries of two groups, keys of both.
    c.q_pos = {4, 5};
    c.k_pos = range(0, 6);
    c.q_group = {0, 1};
    c.k_group = {-1, 0, 0, 1, 1, 1};
    d = decide(c);
    CHECK(d.kernel == AttnKernel::kFlashMasked);
    CHECK(d.reason == "groups restrict visibility");
    // One query group, but a key of another group: not causal.
    c.q_pos = range(0, 4);
    c.k_pos = range(0, 4);
    c.q_group = {0, 0, 0, 0};
    c.k_group = {-1, 0, 1, 0};
    CHECK(decide(c).kernel == AttnKernel::kFlashMasked);
}

TEST_CASE("attn_dispatch: the own kernel where FlashInfer cannot run", "[attn_dispatch]") {
    Case c;
    c.q_pos = range(0, 4);
    c.k_pos = range(0, 4);
    c.built = false;
    CHECK(decide(c).kernel == AttnKernel::kOwn);
    c.built = true;
    c.head_dim = 96;
    CHECK(decide(c).kernel == AttnKernel::kOwn);
    c.head_dim = 64;
    CHECK(decide(c).kernel == AttnKernel::kFlashCausal);
    c.n_head = 9;
    c.n_head_kv = 2;
    CHECK(decide(c).kernel == AttnKernel::kOwn);
    c.n_head = 9;
    c.n_head_kv = 3;
    CHECK(decide(c).kernel == AttnKernel::kFlashCausal);
    // A mask over the caller's limit.
    c.q_pos = {1, 3};
    c.k_pos = range(0, 8);
    c.max_mask_bytes = 1;
    AttnDispatch d = decide(c);
    CHECK(d.kernel == AttnKernel::kOwn);
    CHECK(d.reason.find("over the limit") != std::string::npos);
    c.max_mask_bytes = 2;
    CHECK(decide(c).kernel == AttnKernel::kFlashMasked);
    // Key groups without query groups.
    c.k_group = {0, 0, 0, 0, 0, 0, 0, 0};
    CHECK(decide(c).kernel == AttnKernel::kOwn);
    // Nothing to compute.
    Case e;
    e.q_pos = {};
    e.k_pos = range(0, 3);
    CHECK(decide(e).kernel == AttnKernel::kOwn);
    CHECK(std::string(attn_kernel_name(AttnKernel::kFlashMasked)) == "flashinfer-masked");
}
