#include "runtime/method/pipeline.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "runtime/core/error.h"
#include "runtime/method/chunk_kv.h"
#include "runtime/method/chunk_store.h"
#include "runtime/method/placement.h"
#include "runtime/method/recompute.h"
#include "runtime/method/scoring.h"
#include "runtime/method/selection.h"
#include "runtime/model/generate.h"

namespace infoflow {
namespace {

class PhaseClock {
  public:
    explicit PhaseClock(std::vector<PhaseTime>& out) : out_(out), t_(now()) {}
    void mark(const std::string& name) {
        const auto t = now();
        out_.push_back({name, std::chrono::duration<double, std::milli>(t - t_).count()});
        t_ = t;
    }

  private:
    static std::chrono::steady_clock::time_point now() { return std::chrono::steady_clock::now(); }
    std::vector<PhaseTime>& out_;
    std::chrono::steady_clock::time_point t_;
};

double sum_ms(const std::vector<PhaseTime>& p) {
    double s = 0.0;
    for (const auto& x : p) s += x.ms;
    return s;
}

GenerateOptions generate_options(const Config& cfg, const std::vector<int32_t>& stop_ids) {
    GenerateOptions g;
    g.max_new_tokens = cfg.decode.max_new_tokens;
    g.stop_ids = stop_ids;
    g.sampling.temperature = float(cfg.decode.temperature);
    g.sampling.seed = cfg.decode.seed;
    g.sampling.top_k = cfg.decode.top_k ? *cfg.decode.top_k : 0;
    return g;
}

void check_positions(const Model& model, int T, int Q, int max_new) {
    // The first answer token comes from the last prompt position; each further one needs a
    // position of its own.
    const int n_ctx = model.config().n_ctx_train;
    const int need = T + Q + std::max(0, max_new - 1);
    IF_CHECK(need <= n_ctx, "the request needs "
                                << need << " positions (context " << T << " + suffix " << Q
                                << " + decode.max_new_tokens - 1 = " << std::max(0, max_new - 1)
                                << ") but the model (" << model.weights().source << ") has "
                                << n_ctx);
}

// Phase 1 with the KV store: "store_load" (when store.path is set), then "chunk_prefill".
std::vector<ChunkKv> prefill_or_load(ChunkSource& source, Model& model, const PreparedRequest& req,
                                     PhaseClock& clock) {
    std::vector<int> context(size_t(req.n_chunks() - 1));
    std::iota(context.begin(), context.end(), 1);
    if (source.uses_store()) {
        source.load(context);
        clock.mark("store_load");
    }
    std::vector<ChunkKv> chunks;
    chunks.push_back(prefill_chunk(model, req.chunks[0], -1));
    for (auto& ck : source.take(context)) chunks.push_back(std::move(ck));
    clock.mark("chunk_prefill");
    return chunks;
}

// store.mode = "read-write": the prefilled chunks go into the store after the answer.
void save_to_store(ChunkSource& source, const std::vector<ChunkKv>& chunks, const Config& cfg,
                   PhaseClock& clock, MethodResult& r) {
    if (source.uses_store() && cfg.store.mode == Config::StoreMode::read_write) {
        source.save(chunks);
        clock.mark("store_write");
    }
    r.store_chunks = source.use().chunks_loaded;
    r.store_tokens = source.use().tokens_loaded;
    r.store_bytes = source.use().bytes_loaded;
    r.store_added = source.use().chunks_added;
}

}  // namespace

std::vector<int32_t> scoring_rows(const PreparedRequest& req, Config::Query query) {
    if (query == Config::Query::suffix) return req.suffix;
    return std::vector<int32_t>(req.suffix.begin() + req.question_begin,
                                req.suffix.begin() + req.question_end);
}

MethodResult run_method(Model& model, const PreparedRequest& req, const Config& cfg,
                        const std::vector<int32_t>& stop_ids) {
    const ModelConfig& c = model.config();
    const Config::Method method = cfg.method.name;
    MethodResult r;
    r.method = to_string(method);
    r.context_tokens = req.context_tokens();
    r.suffix_tokens = int(req.suffix.size());
    const int T = r.context_tokens;
    const int Q = r.suffix_tokens;
    const int max_new = cfg.decode.max_new_tokens;
    check_positions(model, T, Q, max_new);
    PhaseClock clock(r.phases);
    const GenerateOptions gen = generate_options(cfg, stop_ids);

    if (method == Config::Method::full) {
        KvCache cache = model.make_cache(T + Q + max_new);
        const std::vector<int32_t> seq = req.full_sequence();
        std::vector<int32_t> pos(seq.size());
        std::iota(pos.begin(), pos.end(), 0);
        r.first_logits = model.forward(cache, seq, pos);
        clock.mark("prefill");
        r.ttft_ms = sum_ms(r.phases);
        r.chunk_order.resize(req.n_chunks());
        std::iota(r.chunk_order.begin(), r.chunk_order.end(), 0);
        const GenerateResult g = generate(model, cache, r.first_logits, T + Q, gen);
        r.answer = g.tokens;
        r.stopped = g.stopped;
        clock.mark("decode");
        return r;
    }
    IF_CHECK(method == Config::Method::none || method == Config::Method::infoflow ||
                 method == Config::Method::cacheblend || method == Config::Method::epic,
             "method.name = \"" << r.method << "\" is not a single-rank method");

    // Phase 1: chunk prefill, chunk 0 exact (no sink), chunks >= 1 with the sink, or loaded
    // from the KV store (store.path) as their own phase.
    ChunkSource source(model, req, cfg);
    std::vector<ChunkKv> chunks = prefill_or_load(source, model, req, clock);

    const std::vector<int32_t> rows = scoring_rows(req, cfg.scoring.query);
    ScoreOptions so;
    so.layers = resolve_scoring_layers(cfg.scoring.layers, c.n_layer);
    so.aggregate_sum = cfg.scoring.aggregate == Config::Aggregate::sum;
    so.layout = cfg.scoring.layout;
    const int k_budget = recompute_budget(cfg.method.ratio, T);

    // Optional reorder (§3.7): stage 1 scores with hl-tp over all context tokens.
    std::vector<int> order(chunks.size());
    std::iota(order.begin(), order.end(), 0);
    if (method == Config::Method::infoflow && cfg.method.reorder) {
        ScoreOptions s1 = so;
        s1.layout = Config::Layout::hl_tp;
        const std::vector<double> score = score_context(model, chunks, order, rows, s1);
        const std::vector<int32_t> gpos = global_positions(chunks, order);
        std::vector<int> slot_chunk, sizes;
        for (int ci : order) {
            sizes.push_back(chunks[ci].size());
            for (int t = 0; t < chunks[ci].size(); ++t) slot_chunk.push_back(ci);
        }
        const std::vector<int> sel =
            select_top_k(score, gpos, std::vector<uint8_t>(size_t(T), 1), k_budget);
        order = reorder_by_selection(sel, slot_chunk, sizes);
        clock.mark("reorder");
    }
    r.chunk_order = order;

    // Assemble the cache at global positions (§3.2).
    const std::vector<int32_t> gpos = global_positions(chunks, order);
    std::vector<int32_t> slot_token;
    std::vector<int> slot_chunk, chunk_begin, chunk_size;
    for (int ci : order) {
        chunk_begin.push_back(int(slot_token.size()));
        chunk_size.push_back(chunks[ci].size());
        for (int t = 0; t < chunks[ci].size(); ++t) {
            slot_token.push_back(chunks[ci].tokens[t]);
            slot_chunk.push_back(ci);
        }
    }
    // parallel.emulate_ranks = P: the "kv" visibility of P ranks in one process (§5.2), the
    // oracle of the distributed run. Chunk 0 and (once selected) S are visible to all; every
    // other token only to the queries of its shard; suffix and decode rows are rank 0's.
    const int emulate = cfg.parallel.emulate_ranks;
    std::vector<int32_t> slot_group;
    if (emulate > 1) {
        IF_CHECK(!cfg.method.reorder,
                 "parallel.emulate_ranks with method.reorder is not supported");
        IF_CHECK(cfg.scoring.softmax == Config::Softmax::global,
                 "parallel.emulate_ranks needs scoring.softmax = \"global\"");
        std::vector<int> sizes;
        for (const auto& ch : req.chunks) sizes.push_back(int(ch.size()));
        const Placement place = place_chunks(sizes, emulate);
        for (int j = 0; j < T; ++j) slot_group.push_back(place.chunk_rank[slot_chunk[j]]);
    }
    const std::vector<int32_t>* groups = emulate > 1 ? &slot_group : nullptr;
    KvCache cache = model.make_cache(T + Q + max_new);
    assemble_cache(model, chunks, order, gpos, groups, cache);
    std::vector<uint8_t> eligible(T);
    for (int j = 0; j < T; ++j) eligible[j] = slot_chunk[j] != 0;

    // Selection and recompute.
    std::vector<int> selected;
    if (method == Config::Method::infoflow) {
        if (k_budget > 0) {
            const std::vector<double> score = score_context(model, chunks, order, rows, so);
            selected = select_top_k(score, gpos, eligible, k_budget);
        }
        clock.mark("scoring");
    } else if (method == Config::Method::epic) {
        selected =
            epic_selection(order, chunk_begin, chunk_size, cfg.epic.mode == Config::EpicMode::fixed,
                           cfg.method.ratio, cfg.epic.k);
        clock.mark("scoring");
    }

    auto gather = [&](const std::vector<int>& sel, std::vector<int32_t>& slots,
                      std::vector<int32_t>& toks, std::vector<int32_t>& pos) {
        for (int j : sel) {
            slots.push_back(j);
            toks.push_back(slot_token[j]);
            pos.push_back(gpos[j]);
        }
    };
    // Query groups of the selected tokens (their shard), and S becomes visible to all.
    auto publish = [&](const std::vector<int>& sel, std::vector<int32_t>* qgroup) {
        if (!groups) return;
        for (int j : sel) {
            qgroup->push_back(slot_group[j]);
            cache.set_group(j, -1);
        }
    };

    if (method == Config::Method::cacheblend && k_budget > 0 && c.n_layer > 1) {
        // Layer 0 exact for every context token, then the layer-1 K/V deviation picks S.
        std::vector<int32_t> all_slots, all_toks, all_pos;
        std::vector<int> all(T);
        std::iota(all.begin(), all.end(), 0);
        gather(all, all_slots, all_toks, all_pos);
        Backend& be = model.backend();
        const size_t row = size_t(cache.row());
        Buffer h = be.alloc_floats(size_t(T) * c.n_embd);
        model.embed(all_toks.data(), T, h.data());
        // Layer 0 with full causal attention over the context (exact on every rank too).
        std::vector<int32_t> saved_groups = cache.group();
        for (int j = 0; j < T; ++j) cache.set_group(j, -1);
        model.layer_forward(0, h.data(), T, all_pos.data(), nullptr, all_slots.data(), cache);
        for (int j = 0; j < T; ++j) cache.set_group(j, saved_groups[j]);
        Buffer k1 = be.alloc_floats(size_t(T) * row);
        Buffer v1 = be.alloc_floats(size_t(T) * row);
        model.layer_kv(1, h.data(), T, all_pos.data(), k1.data(), v1.data());
        std::vector<float> fresh(size_t(T) * row), cached(size_t(T) * row);
        const bool use_k = cfg.cacheblend.metric == Config::BlendMetric::k;
        be.download(fresh.data(), use_k ? k1.data() : v1.data(), fresh.size() * sizeof(float));
        be.download(cached.data(), use_k ? cache.k(1) : cache.v(1), cached.size() * sizeof(float));
        const std::vector<double> dev = kv_deviation(fresh.data(), cached.data(), T, int(row));
        selected = select_top_k(dev, gpos, eligible, k_budget);
        // Every context token's layer-1 K/V is replaced by the fresh one.
        be.copy(cache.k(1), k1.data(), size_t(T) * row * sizeof(float));
        be.copy(cache.v(1), v1.data(), size_t(T) * row * sizeof(float));
        clock.mark("scoring");
        std::vector<int32_t> s_slots, s_toks, s_pos;
        gather(selected, s_slots, s_toks, s_pos);
        Buffer hs = be.alloc_floats(std::max<size_t>(1, selected.size()) * c.n_embd);
        for (size_t i = 0; i < selected.size(); ++i) {
            be.copy(hs.data() + i * c.n_embd, h.data() + size_t(selected[i]) * c.n_embd,
                    sizeof(float) * c.n_embd);
        }
        std::vector<int32_t> s_group;
        publish(selected, &s_group);
        recompute_selected(model, cache, s_slots, s_toks, s_pos, groups ? &s_group : nullptr, 1,
                           hs.data());
        clock.mark("recompute");
    } else {
        if (method == Config::Method::cacheblend) clock.mark("scoring");
        std::vector<int32_t> s_slots, s_toks, s_pos;
        gather(selected, s_slots, s_toks, s_pos);
        std::vector<int32_t> s_group;
        publish(selected, &s_group);
        recompute_selected(model, cache, s_slots, s_toks, s_pos, groups ? &s_group : nullptr, 0);
        clock.mark("recompute");
    }
    for (int j : selected) r.selected_positions.push_back(gpos[j]);

    // Suffix prefill over the updated cache, then the answer (§3.6).
    std::vector<int32_t> spos(Q);
    std::iota(spos.begin(), spos.end(), T);
    const std::vector<int32_t> suffix_group(Q, 0);
    r.first_logits =
        model.forward(cache, req.suffix, spos, false, groups ? &suffix_group : nullptr);
    clock.mark("suffix_prefill");
    r.ttft_ms = sum_ms(r.phases);
    GenerateOptions gen_rank0 = gen;
    if (groups) gen_rank0.group = 0;
    const GenerateResult g = generate(model, cache, r.first_logits, T + Q, gen_rank0);
    r.answer = g.tokens;
    r.stopped = g.stopped;
    clock.mark("decode");
    save_to_store(source, chunks, cfg, clock, r);
    return r;
}

}  // namespace infoflow
