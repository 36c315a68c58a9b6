#include "runtime/method/chunk_store.h"

#include <algorithm>
#include <chrono>

#include "runtime/core/error.h"
#include "runtime/core/pieces.h"
#include "runtime/store/kv_store.h"

namespace infoflow {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

StoreDType store_dtype(Config::StoreDType t) {
    switch (t) {
        case Config::StoreDType::f16:
            return StoreDType::f16;
        case Config::StoreDType::bf16:
            return StoreDType::bf16;
        case Config::StoreDType::f32:
            return StoreDType::f32;
    }
    return StoreDType::f16;
}

}  // namespace

std::string chunking_label(const Config& cfg) {
    if (cfg.chunking.mode == Config::ChunkMode::passage) return "passage";
    return "fixed/" +
           (cfg.chunking.size ? std::to_string(*cfg.chunking.size) : std::string("auto"));
}

std::unique_ptr<KvStore> open_store_for(const Model& model, const std::string& tokenizer_hash,
                                        const Config& cfg, bool writable) {
    StoreOptions opt;
    opt.path = cfg.store.path;
    opt.writable = writable;
    opt.compression = cfg.store.compression;
    const StoreIdentity id = store_identity(model.config(), model.weights().fingerprint,
                                            tokenizer_hash, store_dtype(cfg.store.dtype));
    return open_kv_store(opt, id);
}

StoredChunk to_stored(Model& model, const ChunkKv& c, int32_t sink_id, const std::string& key,
                      const std::string& chunking) {
    Backend& be = model.backend();
    const ModelConfig& mc = model.config();
    StoredChunk s;
    s.key = key;
    s.tokens = c.tokens;
    s.local_pos = c.local_pos;
    s.sink_id = sink_id;
    s.chunking = chunking;
    const size_t count = size_t(c.size()) * mc.n_head_kv * mc.head_dim;
    s.k.resize(mc.n_layer);
    s.v.resize(mc.n_layer);
    for (int l = 0; l < mc.n_layer; ++l) {
        s.k[l].resize(count);
        s.v[l].resize(count);
        if (c.dtype == KvDtype::f32) {
            be.download(s.k[l].data(), c.k[l].data(), count * sizeof(float));
            be.download(s.v[l].data(), c.v[l].data(), count * sizeof(float));
        } else {  // the 16-bit rows to the host, widened there
            std::vector<uint16_t> h(count);
            be.download(h.data(), c.k[l].data(), count * sizeof(uint16_t));
            kv_widen(c.dtype, h.data(), count, s.k[l].data());
            be.download(h.data(), c.v[l].data(), count * sizeof(uint16_t));
            kv_widen(c.dtype, h.data(), count, s.v[l].data());
        }
    }
    return s;
}

ChunkKv from_stored(Model& model, const StoredChunk& s) {
    Backend& be = model.backend();
    ChunkKv c;
    c.tokens = s.tokens;
    c.local_pos = s.local_pos;
    c.dtype = model.kv_dtype();  // held as the caches it goes into store K/V
    const size_t esize = kv_dtype_size(c.dtype);
    for (size_t l = 0; l < s.k.size(); ++l) {
        c.k.push_back(be.alloc(std::max<size_t>(1, s.k[l].size()) * esize));
        c.v.push_back(be.alloc(std::max<size_t>(1, s.v[l].size()) * esize));
        if (c.dtype == KvDtype::f32) {
            be.upload(c.k[l].data(), s.k[l].data(), s.k[l].size() * sizeof(float));
            be.upload(c.v[l].data(), s.v[l].data(), s.v[l].size() * sizeof(float));
        } else {  // narrowed on the host, the 16-bit rows uploaded
            std::vector<uint16_t> h(std::max(s.k[l].size(), s.v[l].size()));
            kv_narrow(c.dtype, s.k[l].data(), s.k[l].size(), h.data());
            be.upload(c.k[l].data(), h.data(), s.k[l].size() * sizeof(uint16_t));
            kv_narrow(c.dtype, s.v[l].data(), s.v[l].size(), h.data());
            be.upload(c.v[l].data(), h.data(), s.v[l].size() * sizeof(uint16_t));
        }
        piece_done(0.0);  // a point for job serve's time slice (pieces.h)
    }
    return c;
}

ChunkSource::ChunkSource(Model& model, const PreparedRequest& req, const Config& cfg)
    : model_(model), req_(req), chunking_(chunking_label(cfg)) {
    if (cfg.store.path.empty()) return;
    const auto t0 = std::chrono::steady_clock::now();
    writable_ = cfg.store.mode == Config::StoreMode::read_write;
    store_ = open_store_for(model, req.tokenizer_hash, cfg, writable_);
    use_.load_ms += ms_since(t0);
}

ChunkSource::~ChunkSource() = default;

void ChunkSource::load(const std::vector<int>& which) {
    if (!store_) return;
    const auto t0 = std::chrono::steady_clock::now();
    for (int ci : which) {
        IF_CHECK(ci >= 1 && ci < req_.n_chunks(), "ChunkSource: chunk " << ci << " out of range");
        const std::vector<int32_t>& tokens = req_.chunks[ci];
        if (tokens.empty()) continue;
        const std::string key = document_key(tokens, req_.sink_id, chunking_);
        if (!store_->contains(key)) continue;
        const StoredChunk s = store_->load(key, tokens);
        loaded_ids_.push_back(ci);
        loaded_.push_back(from_stored(model_, s));
        use_.chunks_loaded += 1;
        use_.loaded_chunks.push_back(ci);
        use_.tokens_loaded += s.size();
        use_.bytes_loaded += store_->document_bytes(key);
        // A point for job serve's time slice (pieces.h): loading a request's documents is
        // otherwise one piece of tens of milliseconds.
        piece_done(0.0);
    }
    use_.load_ms += ms_since(t0);
}

ChunkKv ChunkSource::prefix() {
    const std::vector<int32_t>& tokens = req_.chunks[0];
    return prefix_cache_ ? prefix_cache_->get(model_, tokens) : prefill_chunk(model_, tokens, -1);
}

std::vector<ChunkKv> ChunkSource::take(const std::vector<int>& which) {
    std::vector<std::vector<int32_t>> missing;
    std::vector<int> missing_at;
    std::vector<ChunkKv> out(which.size());
    for (size_t i = 0; i < which.size(); ++i) {
        const auto it = std::find(loaded_ids_.begin(), loaded_ids_.end(), which[i]);
        if (it != loaded_ids_.end()) {
            out[i] = std::move(loaded_[size_t(it - loaded_ids_.begin())]);
            continue;
        }
        missing.push_back(req_.chunks[which[i]]);
        missing_at.push_back(int(i));
        if (!req_.chunks[which[i]].empty()) prefilled_.push_back(which[i]);
    }
    loaded_ids_.clear();
    loaded_.clear();
    std::vector<ChunkKv> fresh = prefill_chunks(model_, missing, req_.sink_id);
    for (size_t m = 0; m < fresh.size(); ++m) {
        use_.chunks_prefilled += 1;
        use_.tokens_prefilled += fresh[m].size();
        out[missing_at[m]] = std::move(fresh[m]);
    }
    return out;
}

void ChunkSource::save(const std::vector<ChunkKv>& chunks) {
    if (!writes()) return;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<StoredChunk> host;
    for (int ci : prefilled_) {
        IF_CHECK(ci < int(chunks.size()) && chunks[ci].k.size() == size_t(model_.config().n_layer),
                 "ChunkSource::save: chunk " << ci << " was not prefilled here");
        host.push_back(to_stored(model_, chunks[ci], req_.sink_id,
                                 document_key(req_.chunks[ci], req_.sink_id, chunking_),
                                 chunking_));
    }
    std::vector<const StoredChunk*> ptrs;
    for (const StoredChunk& s : host) ptrs.push_back(&s);
    use_.chunks_added += store_->add(ptrs);
    prefilled_.clear();
    use_.write_ms += ms_since(t0);
}

}  // namespace infoflow
