// Chunk prefill (docs/design.md §3.1) and global position reconstruction (§3.2). A chunk is
// prefilled on its own as [sink] + chunk with causal attention inside that sequence; the sink's K/V
// are dropped. Its keys are kept post-RoPE at their local positions; `assemble_cache` places the
// chunks in a cache in a given order and rotates each key by delta = target - local position
// (rotations compose), which is how every layout and every re-ordering is built from one
// prefill per chunk.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/model.h"

namespace infoflow {

struct ChunkKv {
    std::vector<int32_t> tokens;     // [n] without the sink
    std::vector<int32_t> local_pos;  // [n] positions used at prefill (1.. after a sink, else 0..)
    // Per layer, [n, n_head_kv*head_dim] in `dtype` (the model's KV cache type, so a 16-bit
    // cache never has an fp32 copy of the context); k post-RoPE at local_pos.
    std::vector<Buffer> k, v;
    KvDtype dtype = KvDtype::f32;
    int size() const { return int(tokens.size()); }
};

// A deep copy of a chunk (its K/V in new buffers of `be`).
ChunkKv copy_chunk(Backend& be, const ChunkKv& c);

// Prefills `tokens` alone, preceded by `sink_id` when >= 0. With no sink this equals an exact
// prefill of the chunk at positions 0.. (how chunk 0 is computed).
ChunkKv prefill_chunk(Model& model, const std::vector<int32_t>& tokens, int32_t sink_id);

// The same prefill, its K/V written straight into `dest` instead of kept: slots
// [dest_first, dest_first + n) (already appended, at their target positions) receive exactly
// what assemble_cache would place there, each key re-rotated from its local position. `scratch`
// (capacity >= n + 1, the cache's type) holds the chunk's own pass and is reused across chunks,
// so a shard is prefilled with one chunk-sized cache and no copy of its K/V. Returns the chunk
// without K/V (has_kv false): its tokens and local positions.
ChunkKv prefill_chunk_into(Model& model, const std::vector<int32_t>& tokens, int32_t sink_id,
                           KvCache& scratch, KvCache& dest, int dest_first);

// Prefills several chunks independently, each exactly as prefill_chunk does (one forward pass
// per chunk), so a chunk's K/V do not depend on the other chunks of the request: chunks loaded
// from the KV store (prefilled alone by cache-build) equal freshly prefilled ones bit for bit.
std::vector<ChunkKv> prefill_chunks(Model& model, const std::vector<std::vector<int32_t>>& chunks,
                                    int32_t sink_id);

// Appends the chunks to `cache` in `order` (indices into `chunks`), token j of the result at
// position target_pos[j] (one entry per appended token, in appended order) with visibility group
// group[j] (nullptr: none). Only layers [0, n_layers) are filled (n_layers < 0: all).
void assemble_cache(Model& model, const std::vector<ChunkKv>& chunks, const std::vector<int>& order,
                    const std::vector<int32_t>& target_pos, const std::vector<int32_t>* group,
                    KvCache& cache, int n_layers = -1);

// The same, but each chunk's K/V buffers are released as soon as they are in `cache` (its
// tokens and local positions stay): the context is never held twice, so the peak memory of the
// assembly is the cache plus one chunk, not the cache plus every chunk.
void assemble_cache_releasing(Model& model, std::vector<ChunkKv>& chunks,
                              const std::vector<int>& order, const std::vector<int32_t>& target_pos,
                              const std::vector<int32_t>* group, KvCache& cache);

// Whether the chunk's K/V are still held (assemble_cache_releasing drops them).
inline bool has_kv(const ChunkKv& c) { return c.size() == 0 || !c.k.empty(); }

}  // namespace infoflow
