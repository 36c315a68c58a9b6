// Distributed execution against its single-rank oracles (docs/design.md §6.1, §6.3, §6.4, §5.5),
// run under mpiexec with 1-4 ranks on a tiny random model: infoflow at ratio 1 equals full in every
// exchange mode; "exact" and "gather" on P ranks equal P = 1 (same selected set, same tokens,
// logits within 1e-4); "kv" and the other exchanges on P ranks equal the single-rank run with
// emulate_ranks = P; ring attention (zigzag, contiguous, all-gather) equals full; byte counts
// match the formulas.
// Collectives first, checks after (no REQUIRE between collectives: a rank must never leave
// the others waiting).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <limits>

#include "comm/communicator.h"
#include "runtime/method/placement.h"
#include "runtime/parallel/ring.h"
#include "runtime/parallel/run.h"
#include "runtime/parallel/sp_pipeline.h"
#include "tests/cpu_paths/cpu_paths.h"
#include "tests/method/method_fixture.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {

// The path's tolerance (docs/design.md §6, tests/cpu_paths/cpu_paths.h): 1e-4 on the fp32
// paths, 1e-2 on amx.
double tol() { return path_tolerance().logits; }
const std::vector<int32_t> kNoStop;

struct Setup {
    std::unique_ptr<Communicator> comm = make_communicator("mpi");
    TinyModel tm;
    // T = 87 context tokens + Q = 9 suffix tokens = 96, divisible by 2P for P = 1..4.
    PreparedRequest req = random_request(21, tm.w.config.n_vocab, 4, {17, 9, 23, 12, 14, 8}, 9);
    Setup() { tm.be->set_threads(1); }
    int P() const { return comm->size(); }
    int rank() const { return comm->rank(); }
};

const PhaseTime* phase(const MethodResult& r, const std::string& name) {
    for (const auto& p : r.phases) {
        if (p.name == name) return &p;
    }
    return nullptr;
}

}  // namespace

TEST_CASE("sp: infoflow at ratio 1 equals full in every exchange mode [6.1]", "[sp]") {
    Setup s;
    const MethodResult full =
        run_method(*s.tm.m, s.req, method_config(Config::Method::full), kNoStop);
    using E = Config::Exchange;
    for (auto ex : {E::kv, E::exact, E::kv_answer_exact, E::exact_answer_kv, E::gather,
                    E::compact_int8, E::compact_int4, E::compact_int4h}) {
        Config cfg = method_config(Config::Method::infoflow, 1.0);
        cfg.parallel.exchange = ex;
        const MethodResult r = run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop);
        CAPTURE(s.P(), s.rank(), to_string(ex));
        CHECK(int(r.selected_positions.size()) == s.req.context_tokens() - 4);
        if (s.rank() == 0) {
            CHECK(rel_err(r.first_logits, full.first_logits) <= tol());
            CHECK(r.answer == full.answer);
        }
    }
}

TEST_CASE("sp: exact exchange on P ranks equals one rank [6.4]", "[sp]") {
    Setup s;
    for (auto m : {Config::Method::infoflow, Config::Method::epic, Config::Method::cacheblend,
                   Config::Method::none}) {
        for (auto agg : {Config::Aggregate::norm, Config::Aggregate::sum}) {
            Config cfg = method_config(m, 0.3);
            cfg.scoring.aggregate = agg;
            cfg.parallel.exchange = Config::Exchange::exact;
            const MethodResult one = run_method(*s.tm.m, s.req, cfg, kNoStop);
            const MethodResult r = run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop);
            CAPTURE(s.P(), s.rank(), to_string(m), to_string(agg));
            CHECK(r.selected_positions == one.selected_positions);  // global softmax: same set
            CHECK(r.answer == one.answer);  // every rank holds the broadcast tokens
            if (s.rank() == 0) CHECK(rel_err(r.first_logits, one.first_logits) <= tol());
        }
    }
}

TEST_CASE("sp: the default exchange (auto) runs what it resolves to on these ranks [5.2]", "[sp]") {
    Setup s;
    // kv on 2 ranks, exact on more (docs/quality.md "P ranks"); the run is that exchange's, bit
    // for bit, and so is its emulation on one rank.
    const Config::Exchange want = s.P() > 2 ? Config::Exchange::exact : Config::Exchange::kv;
    CHECK(resolve_exchange(Config::Exchange::automatic, s.P()) == want);
    CHECK(resolve_exchange(Config::Exchange::compact_int4, s.P()) ==
          Config::Exchange::compact_int4);  // a named exchange is itself
    Config def = method_config(Config::Method::infoflow, 0.3);
    def.parallel.exchange = Config::Exchange::automatic;
    Config named = def;
    named.parallel.exchange = want;
    const MethodResult a = run_request(*s.tm.m, s.req, def, *s.comm, kNoStop);
    const MethodResult b = run_request(*s.tm.m, s.req, named, *s.comm, kNoStop);
    CAPTURE(s.P(), s.rank());
    CHECK(a.selected_positions == b.selected_positions);
    const auto sent = [](const MethodResult& r) {
        uint64_t n = 0;
        for (const auto& p : r.phases) n += p.bytes_sent;
        return n;
    };
    CHECK(sent(a) == sent(b));
    if (s.rank() == 0) {
        CHECK(std::memcmp(a.first_logits.data(), b.first_logits.data(),
                          a.first_logits.size() * sizeof(float)) == 0);
        CHECK(a.answer == b.answer);
    }
    Config emu = def;
    emu.parallel.emulate_ranks = s.P();
    Config emu_named = named;
    emu_named.parallel.emulate_ranks = s.P();
    const MethodResult e = run_method(*s.tm.m, s.req, emu, kNoStop);
    const MethodResult f = run_method(*s.tm.m, s.req, emu_named, kNoStop);
    CHECK(e.first_logits == f.first_logits);
    CHECK(e.answer == f.answer);
}

TEST_CASE("sp: kv exchange on P ranks equals emulate_ranks = P [6.4]", "[sp]") {
    Setup s;
    int moved = 0;                        // tokens run by a helper rank, over the balanced runs
    for (bool balance : {true, false}) {  // forced on (the model would not move on tiny runs)
        for (auto m : {Config::Method::infoflow, Config::Method::epic, Config::Method::cacheblend,
                       Config::Method::none}) {
            for (auto layout : {Config::Layout::global, Config::Layout::tl_tp}) {
                Config cfg = method_config(m, 0.3);
                cfg.scoring.layout = layout;
                cfg.parallel.balance = balance ? Config::Balance::on : Config::Balance::off;
                const MethodResult r = run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop);
                Config emu = cfg;
                emu.parallel.emulate_ranks = s.P();
                const MethodResult one = run_method(*s.tm.m, s.req, emu, kNoStop);
                CAPTURE(s.P(), s.rank(), balance, to_string(m), to_string(layout));
                CHECK(r.selected_positions == one.selected_positions);
                if (balance) {
                    moved += r.recompute_moved;
                } else {
                    CHECK(r.recompute_moved == 0);
                }
                if (s.rank() == 0) {
                    CHECK(rel_err(r.first_logits, one.first_logits) <= tol());
                    CHECK(r.answer == one.answer);
                }
            }
        }
    }
    // The balanced runs did move tokens (else they tested only the owner path).
    CAPTURE(s.P());
    if (s.P() > 1) CHECK(moved > 0);
}

TEST_CASE(
    "sp: a balanced kv recompute moves the K/V plus the helped tokens' queries and "
    "partials [5.5]",
    "[sp]") {
    Setup s;
    const ModelConfig& c = s.tm.w.config;
    int moved = 0;
    for (auto m : {Config::Method::infoflow, Config::Method::epic, Config::Method::cacheblend}) {
        for (double ratio : {0.3, 0.6}) {
            const Config cfg = method_config(m, ratio);
            const MethodResult r = run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop);
            // Over all ranks: per layer each selected token's K/V to P-1 ranks; per recomputed
            // layer each helped token's query to its owner and its partial (out, lse) back;
            // CacheBlend's helped tokens also take their layer-1 input once.
            const int first = m == Config::Method::cacheblend ? 1 : 0;
            const uint64_t kv = 2ull * c.n_head_kv * c.head_dim * sizeof(float);
            const uint64_t helped = uint64_t(c.n_head) * (2 * c.head_dim + 1) * sizeof(float);
            const uint64_t n_moved = uint64_t(r.recompute_moved);
            const uint64_t expect =
                uint64_t(r.selected_positions.size()) * kv * uint64_t(s.P() - 1) * c.n_layer +
                n_moved * helped * uint64_t(c.n_layer - first) +
                n_moved * uint64_t(first) * c.n_embd * sizeof(float);
            uint64_t sent = 0, recv = 0;
            for (const auto& per_rank : r.phases_per_rank) {
                for (const PhaseTime& p : per_rank) {
                    if (p.name != "recompute") continue;
                    sent += p.bytes_sent;
                    recv += p.bytes_recv;
                }
            }
            CAPTURE(s.P(), s.rank(), to_string(m), ratio, r.recompute_moved);
            CHECK(sent == expect);
            CHECK(recv == expect);
            if (s.P() == 1) continue;  // one rank runs the single-rank pipeline: no plan
            moved += r.recompute_moved;
            // The plan's loads: one per rank, no busier than with every token on its owner.
            REQUIRE(int(r.recompute_load.size()) == s.P());
            double hi = 0, hi_owned = 0;
            for (int q = 0; q < s.P(); ++q) {
                hi = std::max(hi, r.recompute_load[q]);
                hi_owned = std::max(hi_owned, r.recompute_load_owned[q]);
            }
            CHECK(hi <= hi_owned);
            if (r.recompute_moved > 0) CHECK(hi < hi_owned);
        }
    }
    CAPTURE(s.P());
    if (s.P() > 1) CHECK(moved > 0);
}

TEST_CASE("sp: placement tokens on P ranks equals its one-rank oracles [6.4]", "[sp]") {
    Setup s;
    // Uneven chunks, so that whole-chunk shards differ and the P-rank run cuts chunks.
    const PreparedRequest req = random_request(33, s.tm.w.config.n_vocab, 4, {50, 70}, 9);
    Config tokens;
    tokens.parallel.placement = Config::Placement::tokens;
    CAPTURE(s.P());
    // edges at 120 s / P of the 120 context tokens: on 2-4 ranks each one cuts a chunk
    const int cut_chunks = place_request(req, tokens, s.P()).n_chunks();
    if (s.P() > 1) CHECK(cut_chunks == req.n_chunks() + s.P() - 1);
    for (auto ex : {Config::Exchange::kv, Config::Exchange::exact}) {
        for (auto m : {Config::Method::infoflow, Config::Method::epic, Config::Method::none}) {
            Config cfg = method_config(m, 0.3);
            cfg.parallel.exchange = ex;
            cfg.parallel.placement = Config::Placement::tokens;
            const MethodResult r = run_request(*s.tm.m, req, cfg, *s.comm, kNoStop);
            // kv: emulate_ranks = P with the same placement; exact: one rank over the cut chunks
            Config one_cfg = cfg;
            PreparedRequest one_req = req;
            if (ex == Config::Exchange::kv) {
                one_cfg.parallel.emulate_ranks = s.P();
            } else {
                one_req = place_request(req, cfg, s.P());
                one_cfg.parallel.placement = Config::Placement::chunks;
            }
            const MethodResult one = run_method(*s.tm.m, one_req, one_cfg, kNoStop);
            CAPTURE(s.P(), s.rank(), to_string(ex), to_string(m));
            CHECK(r.chunk_order.size() == size_t(place_request(req, cfg, s.P()).n_chunks()));
            CHECK(r.selected_positions == one.selected_positions);
            if (s.rank() == 0) {
                CHECK(rel_err(r.first_logits, one.first_logits) <= tol());
                CHECK(r.answer == one.answer);
            }
        }
    }
}

TEST_CASE("sp: kv exchange moves exactly the selected tokens' K/V [5.5]", "[sp]") {
    Setup s;
    Config cfg = method_config(Config::Method::infoflow, 0.2);
    cfg.parallel.balance = Config::Balance::off;  // every token on its owner: K/V only
    const MethodResult r = run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop);
    std::vector<int> sizes;
    for (const auto& c : s.req.chunks) sizes.push_back(int(c.size()));
    const Placement place = place_chunks(sizes, s.P());
    std::vector<int> chunk_of;
    for (size_t i = 0; i < sizes.size(); ++i) chunk_of.insert(chunk_of.end(), sizes[i], int(i));
    std::vector<uint64_t> n_sel(s.P(), 0);
    for (int32_t p : r.selected_positions) n_sel[place.chunk_rank[chunk_of[p]]]++;
    const ModelConfig& c = s.tm.w.config;
    const uint64_t per_token = 2ull * c.n_head_kv * c.head_dim * sizeof(float) * c.n_layer;
    uint64_t others = 0;
    for (int q = 0; q < s.P(); ++q) others += q == s.rank() ? 0 : n_sel[q];
    const PhaseTime* rec = phase(r, "recompute");
    REQUIRE(rec != nullptr);
    CAPTURE(s.P(), s.rank());
    CHECK(rec->bytes_sent == n_sel[s.rank()] * per_token * uint64_t(s.P() - 1));
    CHECK(rec->bytes_recv == others * per_token);
    const PhaseTime* pre = phase(r, s.P() > 1 ? "shard_prefill" : "chunk_prefill");
    REQUIRE(pre != nullptr);
    CHECK(pre->bytes_sent == 0);  // phase 1 has no messages
}

TEST_CASE(
    "sp: with an f16 KV cache, kv equals emulate_ranks, exact equals one rank, and the "
    "K/V exchange moves half the bytes [6.4, 5.5]",
    "[sp]") {
    Setup s;
    s.tm.m->set_kv_dtype(KvDtype::f16);
    Config cfg = method_config(Config::Method::infoflow, 0.3);
    cfg.parallel.balance = Config::Balance::off;  // the byte count below is the K/V alone
    const MethodResult r = run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop);
    Config emu = cfg;
    emu.parallel.emulate_ranks = s.P();
    const MethodResult one = run_method(*s.tm.m, s.req, emu, kNoStop);
    Config ex = cfg;
    ex.parallel.exchange = Config::Exchange::exact;
    const MethodResult rx = run_request(*s.tm.m, s.req, ex, *s.comm, kNoStop);
    const MethodResult onex = run_method(*s.tm.m, s.req, ex, kNoStop);
    Config bal = cfg;  // the balanced recompute reads its helper keys as f16 rows too
    bal.parallel.balance = Config::Balance::on;
    bal.method.ratio = 0.6;
    const MethodResult rb = run_request(*s.tm.m, s.req, bal, *s.comm, kNoStop);
    bal.parallel.emulate_ranks = s.P();
    const MethodResult oneb = run_method(*s.tm.m, s.req, bal, kNoStop);
    s.tm.m->set_kv_dtype(KvDtype::f32);
    CAPTURE(s.P(), s.rank(), rb.recompute_moved);
    CHECK(rb.selected_positions == oneb.selected_positions);
    if (s.P() > 1) CHECK(rb.recompute_moved > 0);
    CHECK(r.selected_positions == one.selected_positions);
    CHECK(rx.selected_positions == onex.selected_positions);
    CHECK(rx.answer == onex.answer);
    if (s.rank() == 0) {
        CHECK(rel_err(r.first_logits, one.first_logits) <= tol());
        CHECK(r.answer == one.answer);
        CHECK(rel_err(rx.first_logits, onex.first_logits) <= tol());
        CHECK(rel_err(rb.first_logits, oneb.first_logits) <= tol());
        CHECK(rb.answer == oneb.answer);
    }
    // Each selected token's K/V rows travel as f16: 2 bytes per element.
    std::vector<int> sizes;
    for (const auto& c : s.req.chunks) sizes.push_back(int(c.size()));
    const Placement place = place_chunks(sizes, s.P());
    std::vector<int> chunk_of;
    for (size_t i = 0; i < sizes.size(); ++i) chunk_of.insert(chunk_of.end(), sizes[i], int(i));
    std::vector<uint64_t> n_sel(s.P(), 0);
    for (int32_t p : r.selected_positions) n_sel[place.chunk_rank[chunk_of[p]]]++;
    const ModelConfig& c = s.tm.w.config;
    const uint64_t per_token = 2ull * c.n_head_kv * c.head_dim * 2 * c.n_layer;
    const PhaseTime* rec = phase(r, "recompute");
    REQUIRE(rec != nullptr);
    CHECK(rec->bytes_sent == n_sel[s.rank()] * per_token * uint64_t(s.P() - 1));
}

TEST_CASE(
    "sp: gather equals one rank; compact-int8/int4, kv-answer-exact and exact-answer-kv equal "
    "emulate_ranks = P [6.4]",
    "[sp]") {
    Setup s;
    using E = Config::Exchange;
    for (auto ex : {E::gather, E::compact_int8, E::compact_int4, E::compact_int4h,
                    E::kv_answer_exact, E::exact_answer_kv}) {
        for (auto m : {Config::Method::infoflow, Config::Method::epic, Config::Method::cacheblend,
                       Config::Method::none}) {
            Config cfg = method_config(m, 0.3);
            cfg.parallel.exchange = ex;
            const MethodResult r = run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop);
            Config one = cfg;
            if (ex != E::gather) one.parallel.emulate_ranks = s.P();
            const MethodResult o = run_method(*s.tm.m, s.req, one, kNoStop);
            CAPTURE(s.P(), s.rank(), to_string(ex), to_string(m));
            CHECK(r.selected_positions == o.selected_positions);
            // exact-answer-kv and kv-answer-exact decode on rank 0 only / on every rank
            if (s.rank() == 0 || ex == E::kv_answer_exact) CHECK(r.answer == o.answer);
            if (s.rank() == 0) CHECK(rel_err(r.first_logits, o.first_logits) <= tol());
        }
    }
}

TEST_CASE("sp: the compact codes change the result, and their oracle does not depend on P [6.4]",
          "[sp]") {
    Setup s;
    Config cfg = method_config(Config::Method::infoflow, 0.3);
    const MethodResult one = run_method(*s.tm.m, s.req, cfg, kNoStop);
    for (auto ex : {Config::Exchange::compact_int8, Config::Exchange::compact_int4,
                    Config::Exchange::compact_int4h}) {
        cfg.parallel.exchange = ex;
        cfg.parallel.emulate_ranks = 2;
        const MethodResult two = run_method(*s.tm.m, s.req, cfg, kNoStop);
        cfg.parallel.emulate_ranks = 4;
        const MethodResult four = run_method(*s.tm.m, s.req, cfg, kNoStop);
        CAPTURE(to_string(ex));
        // Every unselected row through the codes, whoever owns it: the same on any P.
        CHECK(two.first_logits == four.first_logits);
        // ... and not the one-rank result (else the tests above could not tell a run that
        // dropped the codes, or never applied them, from a correct one)
        CHECK(rel_err(two.first_logits, one.first_logits) > 1e-6);
    }
}

TEST_CASE("sp: context_gather moves each unselected row once, as stored or as codes [5.5]",
          "[sp]") {
    Setup s;
    const ModelConfig& c = s.tm.w.config;
    const int row = c.n_head_kv * c.head_dim;
    std::vector<int> sizes;
    for (const auto& ch : s.req.chunks) sizes.push_back(int(ch.size()));
    const Placement place = place_chunks(sizes, s.P());
    std::vector<int> chunk_of;
    for (size_t i = 0; i < sizes.size(); ++i) chunk_of.insert(chunk_of.end(), sizes[i], int(i));
    for (auto ex : {Config::Exchange::gather, Config::Exchange::compact_int8,
                    Config::Exchange::compact_int4, Config::Exchange::compact_int4h}) {
        Config cfg = method_config(Config::Method::infoflow, 0.3);
        cfg.parallel.exchange = ex;
        const MethodResult r = run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop);
        CAPTURE(s.P(), s.rank(), to_string(ex));
        if (s.P() == 1) continue;  // one rank runs the single-rank pipeline: nothing moves
        // Bytes of one token's K and V rows of one layer: 8-bit codes are 64 values + an fp16
        // step per group of 64, 4-bit codes (turned or not) 16 bytes + fp16 minimum and step
        // per group of 32.
        auto groups = [](int n, int g) { return uint64_t((n + g - 1) / g); };
        const uint64_t slot = ex == Config::Exchange::gather ? 2ull * row * sizeof(float)
                              : ex == Config::Exchange::compact_int8
                                  ? 2 * (uint64_t(row) + 2 * groups(row, 64))
                                  : 2 * (uint64_t(row + 1) / 2 + 4 * groups(row, 32));
        std::vector<uint64_t> unsel(s.P(), 0);
        std::vector<uint8_t> sel(chunk_of.size(), 0);
        for (int32_t p : r.selected_positions) sel[p] = 1;
        for (size_t g = 0; g < chunk_of.size(); ++g) {
            if (chunk_of[g] != 0 && !sel[g]) unsel[place.chunk_rank[chunk_of[g]]]++;
        }
        uint64_t others = 0;
        for (int q = 0; q < s.P(); ++q) others += q == s.rank() ? 0 : unsel[q];
        const PhaseTime* gather = phase(r, "context_gather");
        CHECK(gather != nullptr);
        if (!gather) continue;  // every rank alike: the next run's collectives stay matched
        CHECK(gather->bytes_sent == unsel[s.rank()] * slot * c.n_layer * uint64_t(s.P() - 1));
        CHECK(gather->bytes_recv == others * slot * c.n_layer);
        // Then per layer the new K/V of every selected token and suffix row (they run in one
        // pass), from the rank that ran it, to the P - 1 others (summed over the ranks).
        uint64_t sent = 0;
        for (const auto& per_rank : r.phases_per_rank) {
            for (const PhaseTime& p : per_rank) sent += p.name == "recompute" ? p.bytes_sent : 0;
        }
        const uint64_t rows = r.selected_positions.size() + s.req.suffix.size();
        CHECK(sent == rows * 2 * row * sizeof(float) * uint64_t(s.P() - 1) * c.n_layer);
    }
}

TEST_CASE("ring equals full for every layout and exchange [6.3]", "[ring]") {
    Setup s;
    const MethodResult full =
        run_method(*s.tm.m, s.req, method_config(Config::Method::full), kNoStop);
    const ModelConfig& c = s.tm.w.config;
    const int N = s.req.context_tokens() + int(s.req.suffix.size());
    for (auto layout : {Config::RingLayout::zigzag, Config::RingLayout::contiguous}) {
        for (auto ex : {Config::RingExchange::p2p, Config::RingExchange::allgather}) {
            Config cfg = method_config(Config::Method::ring);
            cfg.ring.layout = layout;
            cfg.ring.exchange = ex;
            const MethodResult r = run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop);
            CAPTURE(s.P(), s.rank(), to_string(layout), to_string(ex));
            CHECK(r.answer == full.answer);  // distributed decode, tokens on every rank
            if (s.rank() == 0) CHECK(rel_err(r.first_logits, full.first_logits) <= tol());
            // Bytes per rank per layer: (P-1) * (N/P) * 2 * H_kv * D * 4 (N divisible by 2P).
            const PhaseTime* pre = phase(r, "ring_prefill");
            REQUIRE(pre != nullptr);
            const uint64_t per_layer =
                uint64_t(s.P() - 1) * uint64_t(N / s.P()) * 2 * c.n_head_kv * c.head_dim * 4;
            CHECK(pre->bytes_sent == per_layer * c.n_layer);
            CHECK(pre->bytes_recv == per_layer * c.n_layer);
            if (ex == Config::RingExchange::p2p) {  // the reference of the exchanges' bytes
                const std::vector<uint64_t> want =
                    ring_prefill_bytes(N, s.P(), layout == Config::RingLayout::zigzag,
                                       size_t(c.n_head_kv) * c.head_dim * sizeof(float), c.n_layer);
                CHECK(want[s.rank()] == pre->bytes_sent + pre->bytes_recv);
            }
        }
    }
}

TEST_CASE("ring_prefill_bytes counts what the p2p ring moves with uneven shards", "[ring]") {
    Setup s;
    // T = 120 + Q = 9: 129 tokens, not divisible by 2P for P = 2..4.
    const PreparedRequest req = random_request(33, s.tm.w.config.n_vocab, 4, {50, 66}, 9);
    const ModelConfig& c = s.tm.w.config;
    const int N = req.context_tokens() + int(req.suffix.size());
    for (auto layout : {Config::RingLayout::zigzag, Config::RingLayout::contiguous}) {
        Config cfg = method_config(Config::Method::ring);
        cfg.ring.layout = layout;
        const MethodResult r = run_request(*s.tm.m, req, cfg, *s.comm, kNoStop);
        const std::vector<uint64_t> want =
            ring_prefill_bytes(N, s.P(), layout == Config::RingLayout::zigzag,
                               size_t(c.n_head_kv) * c.head_dim * sizeof(float), c.n_layer);
        CAPTURE(s.P(), s.rank(), N, to_string(layout));
        const PhaseTime* pre = phase(r, "ring_prefill");
        CHECK(pre != nullptr);
        if (pre) CHECK(want[s.rank()] == pre->bytes_sent + pre->bytes_recv);
    }
}

TEST_CASE("ring with an f16 KV cache equals full with one and moves half the bytes", "[ring]") {
    Setup s;
    s.tm.m->set_kv_dtype(KvDtype::f16);
    const MethodResult full =
        run_method(*s.tm.m, s.req, method_config(Config::Method::full), kNoStop);
    std::vector<MethodResult> runs;
    for (auto ex : {Config::RingExchange::p2p, Config::RingExchange::allgather}) {
        Config cfg = method_config(Config::Method::ring);
        cfg.ring.exchange = ex;
        runs.push_back(run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop));
    }
    s.tm.m->set_kv_dtype(KvDtype::f32);
    const ModelConfig& c = s.tm.w.config;
    const int N = s.req.context_tokens() + int(s.req.suffix.size());
    // Every block travels as the cache stores it: 2 bytes per element.
    const uint64_t per_layer =
        uint64_t(s.P() - 1) * uint64_t(N / s.P()) * 2 * c.n_head_kv * c.head_dim * 2;
    for (const MethodResult& r : runs) {
        CAPTURE(s.P(), s.rank());
        CHECK(r.answer == full.answer);
        if (s.rank() == 0) CHECK(rel_err(r.first_logits, full.first_logits) <= tol());
        const PhaseTime* pre = phase(r, "ring_prefill");
        REQUIRE(pre != nullptr);
        CHECK(pre->bytes_sent == per_layer * c.n_layer);
        CHECK(pre->bytes_recv == per_layer * c.n_layer);
    }
}

TEST_CASE("sp: a decode budget near INT_MAX is refused by the position check, not wrapped",
          "[sp][faults]") {
    Setup s;
    Config cfg = method_config(Config::Method::infoflow, 0.3);
    cfg.decode.max_new_tokens = std::numeric_limits<int>::max();
    // Every rank runs the check before its first collective, so every rank throws.
    CHECK_THROWS_WITH(run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop),
                      Catch::Contains("positions") && Catch::Contains("the model"));
}

TEST_CASE("sp: a token callback on rank 0 ends the decode on every rank", "[sp]") {
    // Job serve's cancellation (a client that went away): rank 0 refuses the third token; in
    // the "exact" exchange and in ring attention every rank decodes, so the end must reach them
    // all with that token (else they would wait in the next step's collectives); in "kv" rank 0
    // decodes alone.
    Setup s;
    for (auto method : {Config::Method::infoflow, Config::Method::ring}) {
        for (auto ex : {Config::Exchange::kv, Config::Exchange::exact}) {
            if (method == Config::Method::ring && ex == Config::Exchange::kv) continue;
            Config cfg = method_config(method, 0.3);
            cfg.parallel.exchange = ex;
            cfg.decode.max_new_tokens = 8;
            const MethodResult all = run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop);
            int calls = 0;
            RunHooks hooks;
            hooks.on_token = [&](int32_t) { return ++calls < 3; };
            const MethodResult cut = run_request(*s.tm.m, s.req, cfg, *s.comm, kNoStop, hooks);
            CAPTURE(s.P(), s.rank(), to_string(method), to_string(ex));
            const bool decodes_here =
                s.rank() == 0 || ex == Config::Exchange::exact || method == Config::Method::ring;
            CHECK(calls == (s.rank() == 0 ? 3 : 0));  // only rank 0 is asked
            if (decodes_here) {
                CHECK(cut.cancelled);
                CHECK(cut.answer.size() == 3);
                CHECK(all.answer.size() == 8);
                CHECK(std::equal(cut.answer.begin(), cut.answer.end(), all.answer.begin()));
            }
        }
    }
}
