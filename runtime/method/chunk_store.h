// Phase 1 with the document KV store (docs/design.md §5.2 phase 1, §8): a request's context chunks
// are loaded from the store (store.path) where present and prefilled (§3.1) otherwise; with
// store.mode = "read-write" the prefilled ones are added afterwards. Loaded chunks are the
// ChunkKv the prefill would give (keys post-RoPE at local positions), so re-positioning
// (§3.2, assemble_cache) is the same for both. Without store.path every chunk is prefilled.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/config/config.h"
#include "runtime/method/chunk_kv.h"
#include "runtime/method/prefix_cache.h"
#include "runtime/method/request.h"
#include "runtime/model/model.h"

namespace infoflow {

class KvStore;
struct StoredChunk;

// What phase 1 took from the store and what it prefilled (this rank).
struct StoreUse {
    int chunks_loaded = 0;
    int tokens_loaded = 0;
    uint64_t bytes_loaded = 0;  // document files read
    int chunks_prefilled = 0;
    int tokens_prefilled = 0;
    int chunks_added = 0;            // written back (read-write)
    std::vector<int> loaded_chunks;  // indices of the loaded chunks, in load order
    double load_ms = 0.0;
    double write_ms = 0.0;
};

// The chunking settings a chunk was cut with, part of its store key: "passage", "fixed/2048",
// "fixed/auto" (one chunk per rank).
std::string chunking_label(const Config& cfg);

// The store identity of a model / tokenizer / store.dtype.
std::unique_ptr<KvStore> open_store_for(const Model& model, const std::string& tokenizer_hash,
                                        const Config& cfg, bool writable);

// ChunkKv <-> the store's host form.
StoredChunk to_stored(Model& model, const ChunkKv& c, int32_t sink_id, const std::string& key,
                      const std::string& chunking);
ChunkKv from_stored(Model& model, const StoredChunk& s);

class ChunkSource {
  public:
    // Opens cfg.store.path when set (read-only, or read-write with store.mode = "read-write").
    ChunkSource(Model& model, const PreparedRequest& req, const Config& cfg);
    ~ChunkSource();
    ChunkSource(const ChunkSource&) = delete;
    ChunkSource& operator=(const ChunkSource&) = delete;

    bool uses_store() const { return store_ != nullptr; }
    // Chunk 0 from `cache` (kept across requests) instead of a fresh prefill; nullptr: none.
    void set_prefix_cache(PrefixKvCache* cache) { prefix_cache_ = cache; }
    // Chunk 0 of the request, prefilled exactly (prefill_chunk with no sink) or its kept copy.
    ChunkKv prefix();
    bool writes() const { return writable_ && !prefilled_.empty(); }

    // Loads the chunks of `which` (indices >= 1 into req.chunks) that the store holds.
    void load(const std::vector<int>& which);
    // The chunks of `which`, in that order: loaded ones as loaded, the others prefilled now
    // (prefill_chunks, each as [sink] + chunk).
    std::vector<ChunkKv> take(const std::vector<int>& which);
    // store.mode = "read-write": adds the chunks prefilled by `take` in one atomic commit.
    // `chunks[i]` must be chunk i of the request (chunks of other ranks may be shadows).
    void save(const std::vector<ChunkKv>& chunks);

    const StoreUse& use() const { return use_; }

  private:
    Model& model_;
    const PreparedRequest& req_;
    std::string chunking_;
    bool writable_ = false;
    std::unique_ptr<KvStore> store_;
    std::vector<int> loaded_ids_;
    std::vector<ChunkKv> loaded_;
    std::vector<int> prefilled_;
    StoreUse use_;
    PrefixKvCache* prefix_cache_ = nullptr;
};

}  // namespace infoflow
