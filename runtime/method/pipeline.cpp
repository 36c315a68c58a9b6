// The single-rank pipeline, the oracle of every distributed mode: `run_method` is the driver,
// reading as the phases of docs/design.md §3 (chunk prefill, optional reorder, scoring and
// selection, selective recompute, the answer); each phase is one function below, and the driver
// alone keeps the phase clock.
#include "runtime/method/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <utility>

#include "runtime/core/error.h"
#include "runtime/core/pieces.h"
#include "runtime/core/progress.h"
#include "runtime/method/chunk_kv.h"
#include "runtime/method/chunk_store.h"
#include "runtime/method/kv_codec.h"
#include "runtime/method/phases.h"
#include "runtime/method/placement.h"
#include "runtime/method/recompute.h"
#include "runtime/method/reform.h"
#include "runtime/method/scoring.h"
#include "runtime/method/selection.h"

namespace infoflow {
namespace {

// The context assembled in one cache at global positions (§3.2), slot j of the cache being
// context slot j.
struct Context {
    explicit Context(KvCache c) : cache(std::move(c)) {}
    KvCache cache;
    std::vector<int> order;                    // chunk order
    std::vector<int32_t> gpos;                 // [T] global position of each slot
    std::vector<int32_t> slot_token;           // [T]
    std::vector<int> slot_chunk;               // [T]
    std::vector<int> chunk_begin, chunk_size;  // per chunk, in `order`
    // parallel.emulate_ranks = P > 1 with an exchange that restricts what some rows see: the
    // shard of each slot ([T]), for the "kv" visibility of P ranks in one process (§5.2); empty
    // otherwise.
    std::vector<int32_t> slot_group;
    bool grouped() const { return !slot_group.empty(); }
    // The visibility group of the answer's rows: 0 (rank 0's) where the exchange's answer sees
    // rank 0's shard only, else -1 (every key).
    int32_t answer_group = -1;
};

// Phase 2's result: the slots to recompute, and where the recompute starts.
struct Selection {
    std::vector<int> selected;  // slots, sorted by position
    int first_layer = 0;        // cacheblend: 1 (layer 0 ran for every token)
    Buffer hidden;              // first_layer > 0: [|S|, n_embd], the input of first_layer
};

// `full`: one exact causal prefill of the whole sequence, then the answer.
MethodResult run_full(Model& model, const PreparedRequest& req, const Config& cfg,
                      const std::vector<int32_t>& stop_ids, MethodResult r, const RunHooks& hooks) {
    PhaseClock clock(r.phases);
    KvCache cache =
        model.make_cache(r.context_tokens + r.suffix_tokens + cfg.decode.max_new_tokens);
    const std::vector<int32_t> seq = req.full_sequence();
    std::vector<int32_t> pos(seq.size());
    std::iota(pos.begin(), pos.end(), 0);
    r.first_logits = forward_in_pieces(model, cache, seq, pos);
    clock.mark("prefill");
    r.ttft_ms = sum_ms(r.phases);
    r.chunk_order = identity_order(req.n_chunks());
    if (hooks.take_cache) {
        hooks.take_cache(std::move(cache), -1, r);
        clock.mark("decode");  // empty: the caller decodes
    } else if (!hooks.before_decode || hooks.before_decode(cache, r)) {
        GenerateOptions gen = generate_options(cfg, stop_ids);
        gen.on_token = hooks.on_token;
        decode_answer(model, cache, gen, r);
        clock.mark("decode");
        if (hooks.after_decode) hooks.after_decode(cache, r);
    }
    return r;
}

// Reorder stage 1 (§3.7): score with hl-tp over all context tokens (chunk 0 included), select,
// and sort chunks 1..K by their selected fraction.
std::vector<int> reorder_chunks(Model& model, const PreparedRequest& req, const Config& cfg,
                                const std::vector<ChunkKv>& chunks) {
    const std::vector<int> ident = identity_order(int(chunks.size()));
    ScoreOptions s1 = score_options(cfg, model.config().n_layer);
    s1.layout = Config::Layout::hl_tp;
    const std::vector<double> score =
        score_context(model, chunks, ident, scoring_rows(req, cfg.scoring.query), s1);
    const std::vector<int32_t> gpos = global_positions(chunks, ident);
    std::vector<int> slot_chunk, sizes;
    for (int ci : ident) {
        sizes.push_back(chunks[ci].size());
        for (int t = 0; t < chunks[ci].size(); ++t) slot_chunk.push_back(ci);
    }
    const int T = req.context_tokens();
    const std::vector<int> sel = select_top_k(score, gpos, std::vector<uint8_t>(size_t(T), 1),
                                              recompute_budget(cfg.method.ratio, T));
    return reorder_by_selection(sel, slot_chunk, sizes);
}

// parallel.emulate_ranks = P > 1 and an exchange whose recompute or answer sees only part of
// the keys (the "kv" visibility, §5.2): the context slots then carry their shard as a group.
bool emulated_groups(const Config& cfg) {
    const Config::Exchange ex = cfg.parallel.exchange;
    return cfg.parallel.emulate_ranks > 1 && (exchange_recompute_kv(ex) || exchange_answer_kv(ex));
}

// InfoFlow scores the context cache itself when its positions are the scoring layout's (global)
// and no emulated-rank groups restrict what the rows see; otherwise it assembles a scoring cache
// of its own from the chunks.
bool scores_in_context_cache(const Config& cfg) {
    return cfg.scoring.layout == Config::Layout::global && !emulated_groups(cfg);
}

// The chunks in `order` assembled in a cache with room for the suffix and the answer. With
// `release` (the same vector as `chunks`) each chunk's K/V are freed once copied.
Context assemble_context(Model& model, const PreparedRequest& req, const Config& cfg,
                         const std::vector<ChunkKv>& chunks, const std::vector<int>& order,
                         std::vector<ChunkKv>* release = nullptr) {
    const int T = req.context_tokens();
    Context x(model.make_cache(T + int(req.suffix.size()) + cfg.decode.max_new_tokens));
    x.order = order;
    x.gpos = global_positions(chunks, order);
    for (int ci : order) {
        x.chunk_begin.push_back(int(x.slot_token.size()));
        x.chunk_size.push_back(chunks[ci].size());
        for (int t = 0; t < chunks[ci].size(); ++t) {
            x.slot_token.push_back(chunks[ci].tokens[t]);
            x.slot_chunk.push_back(ci);
        }
    }
    // Emulated ranks: chunk 0 and (once selected) S are visible to all; every other token only
    // to the queries of its shard where the exchange restricts them (the recompute's, or the
    // answer's: rank 0's).
    const int emulate = cfg.parallel.emulate_ranks;
    if (emulate > 1) {
        IF_CHECK(!cfg.method.reorder,
                 "parallel.emulate_ranks with method.reorder is not supported");
        IF_CHECK(cfg.scoring.softmax == Config::Softmax::global,
                 "parallel.emulate_ranks needs scoring.softmax = \"global\"");
    }
    if (emulated_groups(cfg)) {
        if (exchange_answer_kv(cfg.parallel.exchange)) x.answer_group = 0;
        std::vector<int> sizes;
        for (const auto& ch : req.chunks) sizes.push_back(int(ch.size()));
        const Placement place = place_chunks(sizes, emulate);
        for (int j = 0; j < T; ++j) x.slot_group.push_back(place.chunk_rank[x.slot_chunk[j]]);
    }
    const std::vector<int32_t>* group = x.grouped() ? &x.slot_group : nullptr;
    if (release) {
        assemble_cache_releasing(model, *release, order, x.gpos, group, x.cache);
    } else {
        assemble_cache(model, chunks, order, x.gpos, group, x.cache);
    }
    return x;
}

// CacheBlend's first steps (§4): layer 0 with full causal attention over the context, then
// every token's fresh layer-1 K/V; returns the layer-1 deviation of each token (of V or K,
// cacheblend.metric) and leaves the fresh layer-1 K/V in the cache and the layer-1 input of
// every token in `h` ([T, n_embd]).
std::vector<double> cacheblend_deviation(Model& model, const Config& cfg, Context& x, Buffer& h) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int T = int(x.gpos.size());
    const size_t row = size_t(x.cache.row());
    std::vector<int32_t> all_slots(T);
    std::iota(all_slots.begin(), all_slots.end(), 0);
    h = be.alloc_floats(size_t(T) * c.n_embd);
    model.embed(x.slot_token.data(), T, h.data());
    // Layer 0 sees the whole context (exact on every rank too).
    const std::vector<int32_t> saved_groups = x.cache.group();
    for (int j = 0; j < T; ++j) x.cache.set_group(j, -1);
    model.layer_forward(0, h.data(), T, x.gpos.data(), nullptr, all_slots.data(), x.cache);
    for (int j = 0; j < T; ++j) x.cache.set_group(j, saved_groups[j]);
    Buffer k1 = be.alloc_floats(size_t(T) * row);
    Buffer v1 = be.alloc_floats(size_t(T) * row);
    model.layer_kv(1, h.data(), T, x.gpos.data(), k1.data(), v1.data());
    const bool use_k = cfg.cacheblend.metric == Config::BlendMetric::k;
    Buffer old = be.alloc_floats(size_t(T) * row);
    x.cache.read_range(1, 0, T, use_k ? old.data() : nullptr, use_k ? nullptr : old.data());
    std::vector<float> fresh(size_t(T) * row), cached(size_t(T) * row);
    be.download(fresh.data(), use_k ? k1.data() : v1.data(), fresh.size() * sizeof(float));
    be.download(cached.data(), old.data(), cached.size() * sizeof(float));
    x.cache.write_range(1, 0, T, k1.data(), v1.data());
    return kv_deviation(fresh.data(), cached.data(), T, int(row));
}

// A selection that starts the recompute at layer 1 from the layer-1 inputs `h` of every token.
void start_at_layer_1(Model& model, const Buffer& h, Selection& s) {
    const int E = model.config().n_embd;
    Backend& be = model.backend();
    s.first_layer = 1;
    s.hidden = be.alloc_floats(std::max<size_t>(1, s.selected.size()) * E);
    for (size_t i = 0; i < s.selected.size(); ++i) {
        be.copy(s.hidden.data() + i * E, h.data() + size_t(s.selected[i]) * E, sizeof(float) * E);
    }
}

// CacheBlend (§4): the tokens with the largest layer-1 deviation; every token's layer-1 K/V is
// replaced by the fresh one.
Selection cacheblend_select(Model& model, const Config& cfg, Context& x,
                            const SelectionInputs& in) {
    Buffer h;
    const std::vector<double> dev = cacheblend_deviation(model, cfg, x, h);
    Selection s;
    s.selected = select_top_k(dev, x.gpos, in.eligible, in.k_budget);
    start_at_layer_1(model, h, s);
    return s;
}

// InfoFlow (§3.3, §3.4) with the selection variants of docs/quality.md. With
// scoring.deviation_weight = w > 0 CacheBlend's first steps run first (so the scoring pass sees
// the fresh layer-1 K/V), each score is multiplied by deviation^w, and the recompute starts at
// layer 1 as CacheBlend's does.
Selection infoflow_select(Model& model, const PreparedRequest& req, const Config& cfg,
                          const std::vector<ChunkKv>& chunks, Context& x,
                          const SelectionInputs& in) {
    const double w = cfg.scoring.deviation_weight;
    Selection s;
    Buffer h;
    std::vector<double> dev;
    if (w > 0.0) {
        IF_CHECK(cfg.parallel.emulate_ranks <= 1,
                 "scoring.deviation_weight with parallel.emulate_ranks is not "
                 "implemented yet");
        IF_CHECK(model.config().n_layer > 1, "scoring.deviation_weight needs >= 2 layers");
        dev = cacheblend_deviation(model, cfg, x, h);
    }
    const std::vector<int32_t> rows = scoring_rows(req, cfg.scoring.query);
    const ScoreOptions opt = score_options(cfg, model.config().n_layer);
    const int T = int(x.gpos.size());
    std::vector<double> score = scores_in_context_cache(cfg)
                                    ? score_assembled(model, x.cache, T, int32_t(T), rows, opt)
                                    : score_context(model, chunks, x.order, rows, opt);
    if (w > 0.0) {
        for (int j = 0; j < T; ++j) score[size_t(j)] *= std::pow(dev[size_t(j)], w);
    }
    s.selected =
        select_infoflow(score, x.gpos, in.eligible, x.slot_chunk, in.k_budget, select_options(cfg));
    if (w > 0.0) start_at_layer_1(model, h, s);
    return s;
}

// Phase 2 (§3.3, §3.4, §4): the tokens to recompute, by the method's criterion.
Selection score_and_select(Model& model, const PreparedRequest& req, const Config& cfg,
                           const std::vector<ChunkKv>& chunks, Context& x) {
    const SelectionInputs in = selection_inputs(cfg, x.slot_chunk);
    Selection s;
    switch (cfg.method.name) {
        case Config::Method::infoflow:
            if (in.k_budget > 0) s = infoflow_select(model, req, cfg, chunks, x, in);
            break;
        case Config::Method::epic:
            s.selected = epic_select(cfg, x.order, x.chunk_begin, x.chunk_size);
            break;
        case Config::Method::cacheblend:
            if (in.k_budget > 0 && model.config().n_layer > 1) {
                s = cacheblend_select(model, cfg, x, in);
            }
            break;
        default:
            break;
    }
    return s;
}

// Every context slot's group set to `group`.
void set_groups(Context& x, int32_t group) {
    for (int j = 0; j < int(x.gpos.size()); ++j) x.cache.set_group(j, group);
}

// Emulated "gather" / "compact-*" exchanges: what the ranks receive of every context token
// outside chunk 0 that no one recomputes, the same rows through the same codes (§5.2).
void emulate_context_codes(const Config& cfg, Context& x, const Selection& s) {
    const Config::Exchange ex = cfg.parallel.exchange;
    if (cfg.parallel.emulate_ranks <= 1 || !exchange_whole_context(ex)) return;
    if (ex == Config::Exchange::gather) return;  // rows as stored: nothing changes
    std::vector<uint8_t> selected(x.gpos.size(), 0);
    for (int j : s.selected) selected[size_t(j)] = 1;
    std::vector<int32_t> slots;
    for (int j = 0; j < int(x.gpos.size()); ++j) {
        if (x.slot_chunk[j] != 0 && !selected[size_t(j)]) slots.push_back(j);
    }
    round_trip_cache_rows(exchange_kv_codec(ex), x.cache, slots);
}

// Phase 3 (§3.5): S through the layers from s.first_layer, its new K/V written first. With
// emulated groups each selected query keeps its shard's group where the exchange's recompute
// sees its shard only (else every key), S becomes visible to all, and where the answer sees
// every key, so does every slot afterwards.
void recompute(Model& model, const Config& cfg, Context& x, const Selection& s) {
    const bool masked = x.grouped() && exchange_recompute_kv(cfg.parallel.exchange);
    std::vector<int32_t> slots, toks, pos, group;
    for (int j : s.selected) {
        slots.push_back(j);
        toks.push_back(x.slot_token[j]);
        pos.push_back(x.gpos[j]);
        if (masked) group.push_back(x.slot_group[j]);
    }
    if (masked) {
        for (int j : s.selected) x.cache.set_group(j, -1);  // S visible to every query
    } else if (x.grouped()) {
        set_groups(x, -1);  // the recompute sees every key
    }
    recompute_selected(model, x.cache, slots, toks, pos, masked ? &group : nullptr, s.first_layer,
                       s.first_layer > 0 ? s.hidden.data() : nullptr);
    if (!x.grouped()) return;
    if (x.answer_group < 0) {
        set_groups(x, -1);
    } else if (!masked) {  // the shards' groups back for the answer; S stays visible to all
        for (int j = 0; j < int(x.gpos.size()); ++j) x.cache.set_group(j, x.slot_group[j]);
        for (int j : s.selected) x.cache.set_group(j, -1);
    }
}

}  // namespace

std::vector<int32_t> scoring_rows(const PreparedRequest& req, Config::Query query) {
    if (query == Config::Query::suffix) return req.suffix;
    return std::vector<int32_t>(req.suffix.begin() + req.question_begin,
                                req.suffix.begin() + req.question_end);
}

MethodResult run_method(Model& model, const PreparedRequest& req, const Config& cfg,
                        const std::vector<int32_t>& stop_ids) {
    return run_method(model, req, cfg, stop_ids, RunHooks());
}

MethodResult run_method(Model& model, const PreparedRequest& req, const Config& cfg,
                        const std::vector<int32_t>& stop_ids, const RunHooks& hooks) {
    if (cfg.parallel.exchange == Config::Exchange::automatic) {  // for the emulated ranks
        return run_method(model, req,
                          with_exchange_for(cfg, std::max(1, cfg.parallel.emulate_ranks)), stop_ids,
                          hooks);
    }
    // reform, h2o, streamingllm read contexts longer than the model's window (reform.h); they
    // have no chunk phase to share and no hook points yet.
    if (is_long_context_method(cfg.method.name)) {
        IF_CHECK(!hooks.sweep_hooks() && !hooks.on_token && !hooks.take_cache,
                 "method.name = \"" << to_string(cfg.method.name)
                                    << "\": shared chunks and decode hooks (job sweep's "
                                       "fidelity, job serve's streaming) are not implemented "
                                       "yet for this method");
        return run_long_context(model, req, cfg, stop_ids);
    }
    if (cfg.method.name != Config::Method::full &&
        cfg.parallel.placement == Config::Placement::tokens && cfg.parallel.emulate_ranks > 1) {
        // The chunks a P-rank run with parallel.placement = "tokens" uses (§5.1): cut at the
        // even shard edges of the emulated ranks, then placed whole.
        IF_CHECK(hooks.chunks == nullptr,
                 "parallel.placement = \"tokens\" with shared chunks (job sweep) is not "
                 "implemented yet");
        Config placed = cfg;
        placed.parallel.placement = Config::Placement::chunks;
        return run_method(model, place_request(req, cfg, cfg.parallel.emulate_ranks), placed,
                          stop_ids, hooks);
    }
    MethodResult r = start_result(model, req, cfg, 1);
    IF_CHECK(cfg.method.name != Config::Method::full || !hooks.forced_ref,
             "method.name = \"full\" takes no forced_ref hook (use after_decode)");
    if (cfg.method.name == Config::Method::full) {
        return run_full(model, req, cfg, stop_ids, r, hooks);
    }
    check_recompute_method(cfg, "single-rank");
    PhaseClock clock(r.phases);

    // Phase 1: chunk 0 exact, chunks >= 1 with the sink, or loaded from the KV store
    // (store.path) as their own phase.
    ChunkSource source(model, req, cfg);
    source.set_prefix_cache(hooks.prefix_cache);
    std::vector<ChunkKv> own;
    if (!hooks.chunks) {
        own = prefill_context(model, req, 1, req.n_chunks(), &source,
                              [&] { clock.mark("store_load"); });
    }
    const std::vector<ChunkKv>& chunks = hooks.chunks ? *hooks.chunks : own;
    IF_CHECK(
        int(chunks.size()) == req.n_chunks(),
        "run_method: " << chunks.size() << " prefilled chunks for a request of " << req.n_chunks());
    clock.mark("chunk_prefill");
    r.chunk_order = identity_order(req.n_chunks());
    if (cfg.method.name == Config::Method::infoflow && cfg.method.reorder) {
        r.chunk_order = reorder_chunks(model, req, cfg, chunks);
        clock.mark("reorder");
    }

    // Once in the context cache the chunks' K/V are needed again only to score in another
    // layout or to be written to the store; otherwise each is freed as it is copied (the 8K
    // context is then held once, not twice).
    const bool keep_chunks =
        hooks.chunks != nullptr ||
        (source.uses_store() && cfg.store.mode == Config::StoreMode::read_write) ||
        (cfg.method.name == Config::Method::infoflow && !scores_in_context_cache(cfg));
    Context x =
        assemble_context(model, req, cfg, chunks, r.chunk_order, keep_chunks ? nullptr : &own);
    const Selection s = score_and_select(model, req, cfg, chunks, x);
    if (cfg.method.name != Config::Method::none) clock.mark("scoring");
    piece_done(double(req.suffix.size()));  // the scoring rows' pass (job serve, pieces.h)
    emulate_context_codes(cfg, x, s);
    recompute(model, cfg, x, s);
    clock.mark("recompute");
    for (int j : s.selected) r.selected_positions.push_back(x.gpos[j]);

    // The answer (§3.6); with emulated ranks the suffix and decode rows may be rank 0's.
    r.first_logits = prefill_suffix(model, x.cache, req, x.answer_group);
    clock.mark("suffix_prefill");
    r.ttft_ms = sum_ms(r.phases);
    GenerateOptions gen = generate_options(cfg, stop_ids);
    gen.on_token = hooks.on_token;
    gen.group = x.answer_group;
    if (hooks.forced_ref) {  // the same teacher forcing as on P ranks (run_method_sp)
        const std::vector<float> rows =
            teacher_forced_logits(model, x.cache, r.context_tokens + r.suffix_tokens,
                                  r.first_logits, *hooks.forced_ref, gen.group);
        if (hooks.on_forced && !hooks.on_forced(rows, r)) return r;
    }
    if (hooks.before_decode && !hooks.before_decode(x.cache, r)) {
        if (!hooks.chunks) save_to_store(source, chunks, r);  // the store's use, as below
        return r;
    }
    if (hooks.take_cache) {
        hooks.take_cache(std::move(x.cache), gen.group, r);
        clock.mark("decode");  // empty: the caller decodes
    } else {
        decode_answer(model, x.cache, gen, r);
        clock.mark("decode");
        if (hooks.after_decode) hooks.after_decode(x.cache, r);
    }
    if (hooks.chunks) return r;        // phase 1 and its store accounting belong to the caller
    save_to_store(source, chunks, r);  // store.mode = "read-write": after the answer
    if (source.uses_store() && cfg.store.mode == Config::StoreMode::read_write) {
        clock.mark("store_write");
    }
    return r;
}

}  // namespace infoflow
