// Chunk 0 kept across requests (job serve, docs/serve.md "Batching"). Chunk 0 -- the chat
// prefix and the instruction before the documents -- is the same for every request with the same
// system prompt, and it is prefilled exactly, alone, at positions 0.. (prefill_chunk with no sink):
// its K/V are a function of its tokens and the model's KV type. So after one prefill a copy of
// them is what the next prefill would give, bit for bit, and the next request skips it (on one
// SmolLM2 rank ~130 ms of a ~800-ms request, and a layer of it was the longest uncut piece of
// context work between two decode steps).
//
// Bounded: at most `max_bytes` of K/V, the least recently used entry evicted first; a chunk
// larger than the bound is prefilled and not kept. One thread uses it (a rank's worker).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <vector>

#include "runtime/method/chunk_kv.h"

namespace infoflow {

class PrefixKvCache {
  public:
    explicit PrefixKvCache(size_t max_bytes) : max_bytes_(max_bytes) {}
    // Chunk 0 of `tokens` (prefill_chunk(model, tokens, -1)): a copy of the kept one, or
    // prefilled now and kept.
    ChunkKv get(Model& model, const std::vector<int32_t>& tokens);

    size_t bytes() const { return bytes_; }
    size_t max_bytes() const { return max_bytes_; }
    size_t entries() const { return lru_.size(); }
    uint64_t hits() const { return hits_; }
    uint64_t misses() const { return misses_; }

  private:
    struct Entry {
        ChunkKv kv;
        size_t bytes = 0;
    };
    size_t max_bytes_;
    size_t bytes_ = 0;
    uint64_t hits_ = 0, misses_ = 0;
    std::list<Entry> lru_;  // most recently used first
};

// The K/V bytes a chunk holds.
size_t chunk_kv_bytes(const ChunkKv& c);

}  // namespace infoflow
