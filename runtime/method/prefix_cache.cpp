// Chunk 0 kept across requests (prefix_cache.h).
#include "runtime/method/prefix_cache.h"

namespace infoflow {

size_t chunk_kv_bytes(const ChunkKv& c) {
    size_t n = 0;
    for (const Buffer& b : c.k) n += b.bytes();
    for (const Buffer& b : c.v) n += b.bytes();
    return n;
}

ChunkKv PrefixKvCache::get(Model& model, const std::vector<int32_t>& tokens) {
    Backend& be = model.backend();
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
        if (it->kv.tokens != tokens || it->kv.dtype != model.kv_dtype()) continue;
        lru_.splice(lru_.begin(), lru_, it);  // the most recently used
        ++hits_;
        return copy_chunk(be, lru_.front().kv);
    }
    ++misses_;
    ChunkKv fresh = prefill_chunk(model, tokens, -1);
    const size_t bytes = chunk_kv_bytes(fresh);
    if (bytes == 0 || bytes > max_bytes_) return fresh;
    while (bytes_ + bytes > max_bytes_) {
        bytes_ -= lru_.back().bytes;
        lru_.pop_back();
    }
    lru_.push_front(Entry{copy_chunk(be, fresh), bytes});
    bytes_ += bytes;
    return fresh;
}

}  // namespace infoflow
