// Phase 1 of the sequence-parallel method (docs/design.md §5.1, §5.2): the rank's shard of chunks is
// prefilled (§3.1) and assembled at global positions; no messages.
#include "runtime/method/phases.h"
#include "runtime/method/scoring.h"
#include "runtime/parallel/sp_phases.h"

namespace infoflow {

ShardPrefill shard_prefill(Model& model, const PreparedRequest& req, const Config& cfg, int rank,
                           int n_ranks, ChunkSource* source, const std::function<void()>& loaded) {
    Shard sh;
    sh.rank = rank;
    std::vector<int> sizes;
    for (const auto& ch : req.chunks) sizes.push_back(int(ch.size()));
    sh.place = place_chunks(sizes, n_ranks);
    const int first_chunk = sh.place.first_chunk[rank];
    const int end_chunk = sh.place.end_chunk[rank];
    sh.chunks = prefill_context(model, req, first_chunk, end_chunk, source, loaded);

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
    assemble_cache(model, out.shard.chunks, out.shard.local_order, local_pos, nullptr, out.cache);
    return out;
}

}  // namespace infoflow
