// Phase 1 of the sequence-parallel method (docs/design.md §5.1, §5.2): the rank's shard of chunks
// is prefilled (§3.1) and assembled at global positions; no messages.
#include <algorithm>

#include "runtime/core/error.h"
#include "runtime/method/phases.h"
#include "runtime/method/scoring.h"
#include "runtime/parallel/sp_phases.h"

namespace infoflow {
namespace {

// Whether a later step reads the shard's chunk K/V themselves, not only the assembled cache:
// the store (the chunks are loaded as K/V, and new ones saved after the answer) and an InfoFlow
// scoring layout other than `global` (it assembles a scoring cache of its own, sp_select.cpp).
bool keeps_chunk_kv(const Config& cfg, const ChunkSource* source) {
    if (source && source->uses_store()) return true;
    return cfg.method.name == Config::Method::infoflow &&
           cfg.scoring.layout != Config::Layout::global;
}

}  // namespace

ShardPrefill shard_prefill(Model& model, const PreparedRequest& req, const Config& cfg, int rank,
                           int n_ranks, ChunkSource* source, const std::function<void()>& loaded,
                           const std::vector<ChunkKv>* given) {
    Shard sh;
    sh.rank = rank;
    std::vector<int> sizes;
    for (const auto& ch : req.chunks) sizes.push_back(int(ch.size()));
    sh.place = place_chunks(sizes, n_ranks);
    const int first_chunk = sh.place.first_chunk[rank];
    const int end_chunk = sh.place.end_chunk[rank];
    const bool keep = given != nullptr || keeps_chunk_kv(cfg, source);
    if (given) {  // chunk 0 and this rank's chunks copied, the others as shadows
        IF_CHECK(int(given->size()) == req.n_chunks(),
                 "shard_prefill: " << given->size() << " given chunks for a request of "
                                   << req.n_chunks());
        const int lead = req.sink_id >= 0 ? 1 : 0;
        for (int i = 0; i < req.n_chunks(); ++i) {
            if (i == 0 || (i >= first_chunk && i < end_chunk)) {
                sh.chunks.push_back(copy_chunk(model.backend(), (*given)[size_t(i)]));
            } else {
                ChunkKv c;
                c.tokens = req.chunks[size_t(i)];
                for (size_t t = 0; t < c.tokens.size(); ++t)
                    c.local_pos.push_back(int32_t(lead + t));
                sh.chunks.push_back(std::move(c));
            }
        }
    } else if (keep) {
        sh.chunks = prefill_context(model, req, first_chunk, end_chunk, source, loaded);
    } else {
        // Without kept K/V only chunk 0 is prefilled here; the own chunks go straight into the
        // cache below.
        sh.chunks = prefill_context(model, req, first_chunk, first_chunk, source, loaded);
    }

    sh.gpos = global_positions(sh.chunks, identity_order(req.n_chunks()));
    for (int i = 0, at = 0; i < req.n_chunks(); ++i) {
        sh.offsets.push_back(at);
        for (int t = 0; t < sh.chunks[i].size(); ++t) sh.chunk_of.push_back(i);
        at += sh.chunks[i].size();
    }
    sh.c0 = sh.chunks[0].size();
    sh.local_order.push_back(0);
    for (int i = first_chunk; i < end_chunk; ++i) sh.local_order.push_back(i);
    if (first_chunk < end_chunk) {
        sh.own_begin = sh.offsets[first_chunk];
        sh.own_end = sh.own_begin + sh.place.shard_tokens[rank];
    }

    std::vector<int32_t> local_pos;
    for (int ci : sh.local_order) {
        for (int t = 0; t < sh.chunks[ci].size(); ++t) {
            local_pos.push_back(sh.gpos[sh.offsets[ci] + t]);
        }
    }
    const int T = req.context_tokens();
    const int capacity =
        int(local_pos.size()) + T + int(req.suffix.size()) + cfg.decode.max_new_tokens;
    ShardPrefill out{std::move(sh), model.make_cache(capacity)};
    Shard& s = out.shard;
    if (keep) {
        assemble_cache(model, s.chunks, s.local_order, local_pos, nullptr, out.cache);
        return out;
    }
    // Chunk 0, then each own chunk prefilled into its slots through one reused chunk-sized
    // cache: the same rows assemble_cache would write, with no second copy of the shard.
    const std::vector<int32_t> pos0(local_pos.begin(), local_pos.begin() + s.c0);
    assemble_cache(model, s.chunks, {0}, pos0, nullptr, out.cache);
    int longest = 0;
    for (int i = first_chunk; i < end_chunk; ++i) longest = std::max(longest, sizes[i]);
    KvCache scratch = model.make_cache(longest + (req.sink_id >= 0 ? 1 : 0));
    for (int i = first_chunk; i < end_chunk; ++i) {
        const int n = sizes[i];
        const int at = out.cache.size();
        out.cache.append(n, local_pos.data() + at, nullptr);
        s.chunks[i] = prefill_chunk_into(model, req.chunks[i], req.sink_id, scratch, out.cache, at);
    }
    return out;
}

}  // namespace infoflow
