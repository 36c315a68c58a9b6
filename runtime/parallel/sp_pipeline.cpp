// The driver of the sequence-parallel method: the phases of docs/design.md §5.2 in order
// (sp_phases.h), timed and their communication counted here alone.
#include "runtime/parallel/sp_pipeline.h"

#include <memory>

#include "runtime/core/error.h"
#include "runtime/core/pieces.h"
#include "runtime/method/chunk_store.h"
#include "runtime/method/kv_codec.h"
#include "runtime/method/phases.h"
#include "runtime/parallel/phase_clock.h"
#include "runtime/parallel/sp_phases.h"

namespace infoflow {

void gather_phases(Communicator& comm, MethodResult& r) {
    const int P = comm.size();
    const size_t n = r.phases.size();
    std::vector<double> mine(n * 4), all(n * 4 * P);
    for (size_t i = 0; i < n; ++i) {
        mine[i * 4 + 0] = r.phases[i].ms;
        mine[i * 4 + 1] = double(r.phases[i].bytes_sent);
        mine[i * 4 + 2] = double(r.phases[i].bytes_recv);
        mine[i * 4 + 3] = r.phases[i].wait_ms;
    }
    comm.all_gather(mine.data(), mine.size() * sizeof(double), all.data());
    r.phases_per_rank.assign(n, std::vector<PhaseTime>(P));
    for (size_t i = 0; i < n; ++i) {
        for (int q = 0; q < P; ++q) {
            const double* x = all.data() + size_t(q) * n * 4 + i * 4;
            PhaseTime& p = r.phases_per_rank[i][q];
            p.name = r.phases[i].name;
            p.ms = x[0];
            p.bytes_sent = uint64_t(x[1]);
            p.bytes_recv = uint64_t(x[2]);
            p.wait_ms = x[3];
        }
    }
}

MethodResult run_method_sp(Model& model, const PreparedRequest& req_in, const Config& cfg,
                           Communicator& comm, const std::vector<int32_t>& stop_ids,
                           const RunHooks& hooks) {
    if (cfg.parallel.exchange == Config::Exchange::automatic) {
        return run_method_sp(model, req_in, with_exchange_for(cfg, comm.size()), comm, stop_ids,
                             hooks);
    }
    check_recompute_method(cfg, "sequence-parallel");
    IF_CHECK(!cfg.method.reorder, "method.reorder = true runs on one rank only");
    IF_CHECK(!hooks.before_decode && !hooks.after_decode,
             "the sequence-parallel pipeline takes no before_decode/after_decode hooks (use "
             "forced_ref/on_forced)");
    IF_CHECK(!hooks.chunks ||
                 (cfg.store.path.empty() && cfg.parallel.placement == Config::Placement::chunks),
             "shared chunks (job sweep) with store.path or parallel.placement = \"tokens\" "
             "on P ranks are not implemented yet");
    IF_CHECK(!hooks.take_cache || (exchange_answer_on_rank0(cfg.parallel.exchange) &&
                                   !hooks.forced_ref && !hooks.on_forced),
             "taking the prompt cache (job serve's batched decode) with parallel.exchange = \""
                 << to_string(cfg.parallel.exchange)
                 << "\" (the answer across the ranks) or teacher forcing is not implemented yet");
    // parallel.placement = "tokens": chunks cut at the even shard edges of these P ranks (§5.1)
    const PreparedRequest req = place_request(req_in, cfg, comm.size());
    const Config::Exchange ex = cfg.parallel.exchange;
    const bool whole = exchange_whole_context(ex);
    // The answer across the ranks (every key, partial states merged), or on rank 0 over its cache
    // (chunk 0, its shard and S; with a whole-context exchange, every key).
    const bool exact = !whole && !exchange_answer_kv(ex);
    if (whole && ex != Config::Exchange::gather) {  // before any collective, on every rank
        check_kv_codec(exchange_kv_codec(ex), model.config().head_dim);
    }
    MethodResult r = start_result(model, req, cfg, comm.size());
    r.chunk_order = identity_order(req.n_chunks());
    SpClock clock(comm, r.phases);

    // 1. no messages; this shard's chunks found in the KV store are loaded instead (phase
    // store_load, every rank reading the same file)
    clock.begin(cfg.store.path.empty() ? "shard_prefill" : "store_load");
    ChunkSource source(model, req, cfg);
    source.set_prefix_cache(hooks.prefix_cache);
    ShardPrefill p = shard_prefill(
        model, req, cfg, comm.rank(), comm.size(), &source,
        [&] {
            clock.end();
            clock.begin("shard_prefill");
        },
        hooks.chunks);
    const Shard& sh = p.shard;
    // The whole-context exchanges' cache is made here too: it holds the context, known now.
    std::unique_ptr<KvCache> full;
    if (whole) {
        full = std::make_unique<KvCache>(whole_context_cache(model, req, cfg, sh, p.cache));
    }
    clock.end();
    r.shard_tokens = sh.place.shard_tokens;

    clock.begin("scoring");  // 2. identical selection on every rank
    const SpSelection sel = score_and_select(model, comm, req, cfg, sh, p.cache);
    clock.end();
    piece_done(double(req.suffix.size()));  // the scoring rows' pass (job serve, pieces.h)

    // 3. per layer, in the exchange mode; the whole-context exchanges first gather every
    // context row once, into the cache the answer then runs over, and run the suffix rows in the
    // recompute's pass (phase 4's suffix prefill is then the first token's logits alone).
    if (whole) {
        clock.begin("context_gather");
        gather_context(model, comm, req, cfg, sh, sel, p.cache, *full);
        clock.end();
    }
    KvCache& cache = whole ? *full : p.cache;
    clock.begin("recompute");
    std::vector<float> last_row;  // whole-context: the suffix ran with S; its last row, rank 0
    if (whole) {
        last_row = recompute_whole(model, comm, req, sh, sel, cache, &r);
    } else if (exchange_recompute_kv(ex)) {
        recompute_kv(model, comm, req, sh, sel, cache, cfg, &r);
        // kv-answer-exact: each rank's keys for the answer are its own (chunk 0 counts on rank
        // 0), so the other shards' selected tokens appended here go.
        if (exact) cache.truncate(sh.c0 + (sh.own_end - sh.own_begin));
    } else {
        recompute_exact(model, comm, req, sh, sel, cache);
        if (!exact) share_selected_kv(model, comm, sh, sel, cache);  // exact-answer-kv
    }
    for (int g : sel.selected) r.selected_positions.push_back(sh.gpos[g]);
    clock.end();

    clock.begin("suffix_prefill");  // 4. the answer
    r.first_logits = exact   ? prefill_suffix_exact(model, comm, req, sh, cache)
                     : whole ? logits_of_row(model, last_row)
                             : prefill_suffix_kv(model, comm, req, cache);
    clock.end();
    r.ttft_ms = sum_ms(r.phases);
    bool decode = true;
    if (hooks.forced_ref) {  // teacher forcing, then rank 0 says whether to decode
        const std::vector<float> rows =
            exact
                ? forced_rows_exact(model, comm, req, sh, cache, r.first_logits, *hooks.forced_ref)
                : forced_rows_kv(model, comm, req, cache, r.first_logits, *hooks.forced_ref);
        int32_t go = 1;
        if (comm.rank() == 0 && hooks.on_forced) go = hooks.on_forced(rows, r) ? 1 : 0;
        comm.broadcast(&go, sizeof(go), 0);
        decode = go != 0;
    }
    clock.begin("decode");  // every rank has the phase, its rows gathered below
    if (hooks.take_cache) {
        hooks.take_cache(std::move(cache), -1, r);  // rank 0's cache is the prompt
    } else if (decode && exact) {
        decode_exact(model, comm, cfg, stop_ids, sh, cache, r, hooks.on_token);
    } else if (decode) {
        decode_kv(model, comm, cfg, stop_ids, cache, r, hooks.on_token);
    }
    clock.end();

    if (source.uses_store()) {
        // Each rank adds its own prefilled chunks (the store's lock serializes the writers).
        const bool write = cfg.store.mode == Config::StoreMode::read_write;
        if (write) clock.begin("store_write");
        save_to_store(source, sh.chunks, r);
        if (write) clock.end();
        // Summed over ranks, the same on every rank (the configs agree).
        double use[4] = {double(r.store_chunks), double(r.store_tokens), double(r.store_bytes),
                         double(r.store_added)};
        comm.all_reduce(use, 4, DType::f64, ReduceOp::sum);
        r.store_chunks = int(use[0]);
        r.store_tokens = int(use[1]);
        r.store_bytes = uint64_t(use[2]);
        r.store_added = int(use[3]);
        // Which chunks came from the store, over all ranks (each loads its own shard's).
        std::vector<int32_t> loaded(size_t(req.n_chunks()), 0);
        for (int ci : r.store_loaded_chunks) loaded[size_t(ci)] = 1;
        comm.all_reduce(loaded.data(), loaded.size(), DType::i32, ReduceOp::max);
        r.store_loaded_chunks.clear();
        for (int ci = 0; ci < req.n_chunks(); ++ci) {
            if (loaded[size_t(ci)]) r.store_loaded_chunks.push_back(ci);
        }
    }
    gather_phases(comm, r);
    return r;
}

}  // namespace infoflow
