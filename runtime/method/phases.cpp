#include "runtime/method/phases.h"

#include <algorithm>
#include <numeric>

#include "runtime/core/error.h"
#include "runtime/core/pieces.h"
#include "runtime/method/selection.h"

namespace infoflow {

MethodResult start_result(const Model& model, const PreparedRequest& req, const Config& cfg,
                          int ranks) {
    MethodResult r;
    r.method = to_string(cfg.method.name);
    r.ranks = ranks;
    r.context_tokens = req.context_tokens();
    r.suffix_tokens = int(req.suffix.size());
    check_positions(model, r.context_tokens, r.suffix_tokens, cfg.decode.max_new_tokens);
    return r;
}

void check_positions(const Model& model, int T, int Q, int max_new) {
    // The first answer token comes from the last prompt position; each further one needs a
    // position of its own.
    const int n_ctx = model.config().n_ctx_train;
    const int64_t need = int64_t(T) + Q + std::max(0, max_new - 1);  // no int overflow
    IF_CHECK(need <= n_ctx, "the request needs "
                                << need << " positions (context " << T << " + suffix " << Q
                                << " + decode.max_new_tokens - 1 = " << std::max(0, max_new - 1)
                                << ") but the model (" << model.weights().source << ") has "
                                << n_ctx);
}

void check_recompute_method(const Config& cfg, const char* where) {
    const Config::Method m = cfg.method.name;
    IF_CHECK(m == Config::Method::none || m == Config::Method::infoflow ||
                 m == Config::Method::cacheblend || m == Config::Method::epic,
             "method.name = \"" << to_string(m) << "\" is not a " << where << " method");
}

std::vector<ChunkKv> prefill_context(Model& model, const PreparedRequest& req, int first, int end,
                                     ChunkSource* source, const std::function<void()>& loaded) {
    std::vector<ChunkKv> own;
    if (source && source->uses_store()) {
        std::vector<int> which;
        for (int i = std::max(first, 1); i < end; ++i) which.push_back(i);
        source->load(which);
        if (loaded) loaded();
        own = source->take(which);
        if (first == 0 && end > 0) own.insert(own.begin(), ChunkKv());  // index i - first
    } else {
        own = prefill_chunks(
            model,
            std::vector<std::vector<int32_t>>(req.chunks.begin() + first, req.chunks.begin() + end),
            req.sink_id);
    }
    std::vector<ChunkKv> chunks;
    const int lead = req.sink_id >= 0 ? 1 : 0;
    for (int i = 0; i < req.n_chunks(); ++i) {
        if (i == 0) {
            chunks.push_back(source ? source->prefix() : prefill_chunk(model, req.chunks[0], -1));
        } else if (i >= first && i < end) {
            chunks.push_back(std::move(own[i - first]));
        } else {  // a chunk this rank does not hold: sizes and local positions (for layouts)
            ChunkKv c;
            c.tokens = req.chunks[i];
            for (size_t t = 0; t < c.tokens.size(); ++t) c.local_pos.push_back(int32_t(lead + t));
            chunks.push_back(std::move(c));
        }
    }
    return chunks;
}

void save_to_store(ChunkSource& source, const std::vector<ChunkKv>& chunks, MethodResult& r) {
    if (!source.uses_store()) return;
    source.save(chunks);  // read-write only; nothing otherwise
    r.store_chunks = source.use().chunks_loaded;
    r.store_tokens = source.use().tokens_loaded;
    r.store_bytes = source.use().bytes_loaded;
    r.store_added = source.use().chunks_added;
    r.store_loaded_chunks = source.use().loaded_chunks;
}

std::vector<int> identity_order(int n) {
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    return order;
}

ScoreOptions score_options(const Config& cfg, int n_layer) {
    ScoreOptions so;
    so.layers = resolve_scoring_layers(cfg.scoring.layers, n_layer);
    so.aggregate_sum = cfg.scoring.aggregate == Config::Aggregate::sum;
    so.layout = cfg.scoring.layout;
    so.value_norm = cfg.scoring.value_norm;
    return so;
}

SelectOptions select_options(const Config& cfg) {
    SelectOptions o;
    o.span = cfg.scoring.span;
    o.chunk_decay = cfg.scoring.chunk_decay;
    o.chunk_floor = cfg.scoring.chunk_floor;
    return o;
}

SelectionInputs selection_inputs(const Config& cfg, const std::vector<int>& slot_chunk) {
    SelectionInputs in;
    const int T = int(slot_chunk.size());
    in.k_budget = recompute_budget(cfg.method.ratio, T);
    in.eligible.resize(T);
    for (int j = 0; j < T; ++j) in.eligible[j] = slot_chunk[j] != 0;
    return in;
}

std::vector<int> epic_select(const Config& cfg, const std::vector<int>& chunk_id,
                             const std::vector<int>& chunk_begin,
                             const std::vector<int>& chunk_size) {
    return epic_selection(chunk_id, chunk_begin, chunk_size,
                          cfg.epic.mode == Config::EpicMode::fixed, cfg.method.ratio, cfg.epic.k);
}

std::vector<float> forward_in_pieces(Model& model, KvCache& cache,
                                     const std::vector<int32_t>& tokens,
                                     const std::vector<int32_t>& pos) {
    IF_CHECK(pos.size() == tokens.size(),
             "forward: " << tokens.size() << " tokens but " << pos.size() << " positions");
    std::vector<float> logits;
    for (const auto& [a, b] : piece_ranges(int(tokens.size()))) {
        logits = model.forward(cache, std::vector<int32_t>(tokens.begin() + a, tokens.begin() + b),
                               std::vector<int32_t>(pos.begin() + a, pos.begin() + b));
        piece_done(b - a);
    }
    return logits;
}

std::vector<float> prefill_suffix(Model& model, KvCache& cache, const PreparedRequest& req,
                                  int32_t group) {
    const int Q = int(req.suffix.size());
    std::vector<int32_t> spos(Q);
    std::iota(spos.begin(), spos.end(), req.context_tokens());
    const std::vector<int32_t> suffix_group(Q, group);
    return model.forward(cache, req.suffix, spos, false, group >= 0 ? &suffix_group : nullptr);
}

void decode_answer(Model& model, KvCache& cache, const GenerateOptions& gen, MethodResult& r) {
    const GenerateResult g =
        generate(model, cache, r.first_logits, r.context_tokens + r.suffix_tokens, gen);
    r.answer = g.tokens;
    r.stopped = g.stopped;
    r.cancelled = g.cancelled;
}

GenerateOptions generate_options(const Config& cfg, const std::vector<int32_t>& stop_ids) {
    GenerateOptions g;
    g.max_new_tokens = cfg.decode.max_new_tokens;
    g.stop_ids = stop_ids;
    g.sampling.temperature = float(cfg.decode.temperature);
    g.sampling.seed = cfg.decode.seed;
    g.sampling.top_k = cfg.decode.top_k ? *cfg.decode.top_k : 0;
    g.sampling.top_p = cfg.decode.top_p;
    for (const auto& [id, b] : cfg.decode.logit_bias)
        g.sampling.logit_bias.emplace_back(id, float(b));
    return g;
}

double sum_ms(const std::vector<PhaseTime>& phases) {
    double s = 0.0;
    for (const auto& p : phases) s += p.ms;
    return s;
}

}  // namespace infoflow
