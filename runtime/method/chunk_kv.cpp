#include "runtime/method/chunk_kv.h"

#include "runtime/core/error.h"
#include "runtime/core/memory.h"
#include "runtime/core/pieces.h"

namespace infoflow {

namespace {

// [sink] + tokens at positions 0.., and the chunk's own positions (after the sink).
struct ChunkSequence {
    int lead = 0;
    std::vector<int32_t> seq, pos;
};

ChunkSequence chunk_sequence(const std::vector<int32_t>& tokens, int32_t sink_id) {
    ChunkSequence cs;
    cs.lead = sink_id >= 0 ? 1 : 0;
    if (cs.lead) cs.seq.push_back(sink_id);
    cs.seq.insert(cs.seq.end(), tokens.begin(), tokens.end());
    cs.pos.resize(cs.seq.size());
    for (size_t i = 0; i < cs.seq.size(); ++i) cs.pos[i] = int32_t(i);
    return cs;
}

ChunkKv chunk_shadow(const std::vector<int32_t>& tokens, const ChunkSequence& cs, KvDtype dtype) {
    ChunkKv out;
    out.tokens = tokens;
    out.local_pos.assign(cs.pos.begin() + cs.lead, cs.pos.end());
    out.dtype = dtype;
    return out;
}

// Runs the chunk's sequence through every layer in `cache` (cleared first), in row pieces of at
// most piece_rows() rows (one piece outside job serve; the same bits either way, pieces.h); then
// `layer_done(l)` sees each layer's K/V in slots [lead, lead + n).
template <typename LayerDone>
void run_chunk(Model& model, const ChunkSequence& cs, KvCache& cache, LayerDone&& layer_done) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int m = int(cs.seq.size());
    IF_CHECK(cache.capacity() >= m,
             "chunk prefill: a scratch cache of " << cache.capacity() << " slots for " << m);
    cache.clear();
    Buffer hidden = be.alloc_floats(size_t(m) * c.n_embd);
    for (const auto& [a, b] : piece_ranges(m)) {
        // Each piece's slots are appended as it runs: its rows attend over written keys only.
        const int first = cache.append(b - a, cs.pos.data() + a, nullptr);
        std::vector<int32_t> slots(size_t(b - a));
        for (int i = 0; i < b - a; ++i) slots[size_t(i)] = first + i;
        float* h = hidden.data() + size_t(a) * c.n_embd;
        model.embed(cs.seq.data() + a, b - a, h);
        for (int l = 0; l < c.n_layer; ++l) {
            model.layer_forward(l, h, b - a, cs.pos.data() + a, nullptr, slots.data(), cache);
            piece_done(double(b - a) / c.n_layer);  // a layer at a time (job serve, pieces.h)
        }
    }
    for (int l = 0; l < c.n_layer; ++l) layer_done(l);
}

// Writes one layer of n rows (K post-RoPE at their local positions, both in the cache's type)
// to cache slots [first, first + n), each key re-rotated by its delta (target - local position)
// on the way in, so the cache only ever receives finished rows (16-bit keys: widened, rotated
// in fp32, rounded once more). Its scratch is kept across calls.
class LayerPlacer {
  public:
    // The chunk whose layers come next: n keys from local_pos[i] to target_pos[i].
    void set_chunk(const int32_t* target_pos, const int32_t* local_pos, int n) {
        delta_.resize(n);
        rotate_ = false;
        for (int i = 0; i < n; ++i) {
            delta_[i] = target_pos[i] - local_pos[i];
            rotate_ = rotate_ || delta_[i] != 0;
        }
    }
    void place(Model& model, KvCache& cache, int l, int first, const void* k, const void* v) {
        const int n = int(delta_.size());
        if (!rotate_) {
            cache.write_range_raw(l, first, n, k, v);
            return;
        }
        Backend& be = model.backend();
        const size_t elems = size_t(n) * cache.row();
        const bool wide = cache.dtype() == KvDtype::f32;
        if (rotated_.bytes() < elems * sizeof(float)) rotated_ = be.alloc_floats(elems);
        if (wide) {
            be.copy(rotated_.data(), static_cast<const float*>(k), elems * sizeof(float));
        } else {
            be.widen_kv(cache.dtype(), k, elems, rotated_.data());
        }
        model.rerotate_keys(rotated_.data(), n, delta_.data());
        if (wide) {
            cache.write_range(l, first, n, rotated_.data(), static_cast<const float*>(v));
        } else {
            const size_t bytes = elems * kv_dtype_size(cache.dtype());
            if (narrow_k_.bytes() < bytes) narrow_k_ = be.alloc(bytes);
            be.narrow_kv(cache.dtype(), rotated_.data(), elems, narrow_k_.data());
            cache.write_range_raw(l, first, n, narrow_k_.data(), v);
        }
    }

  private:
    std::vector<int32_t> delta_;  // [n] target - local position of the chunk's keys
    bool rotate_ = false;         // any delta != 0
    Buffer rotated_;              // [n, row] the keys at their target positions
    Buffer narrow_k_;             // [n, row] the same rounded back to a 16-bit KV type
};

}  // namespace

ChunkKv copy_chunk(Backend& be, const ChunkKv& c) {
    ChunkKv out;
    out.tokens = c.tokens;
    out.local_pos = c.local_pos;
    out.dtype = c.dtype;
    for (const std::vector<Buffer>* src : {&c.k, &c.v}) {
        std::vector<Buffer>& dst = src == &c.k ? out.k : out.v;
        for (const Buffer& b : *src) {
            dst.push_back(be.alloc(b.bytes()));
            if (b.bytes()) be.copy(dst.back().data(), b.data(), b.bytes());
        }
    }
    return out;
}

ChunkKv prefill_chunk(Model& model, const std::vector<int32_t>& tokens, int32_t sink_id) {
    Backend& be = model.backend();
    const ChunkSequence cs = chunk_sequence(tokens, sink_id);
    const int n = int(tokens.size());
    if (n == 0) return chunk_shadow(tokens, cs, KvDtype::f32);
    KvCache cache = model.make_cache(int(cs.seq.size()));
    ChunkKv out = chunk_shadow(tokens, cs, cache.dtype());
    run_chunk(model, cs, cache, [&](int l) {
        out.k.push_back(be.alloc(size_t(n) * cache.row_bytes()));
        out.v.push_back(be.alloc(size_t(n) * cache.row_bytes()));
        cache.read_range_raw(l, cs.lead, n, out.k[l].data(), out.v[l].data());
    });
    return out;
}

ChunkKv prefill_chunk_into(Model& model, const std::vector<int32_t>& tokens, int32_t sink_id,
                           KvCache& scratch, KvCache& dest, int dest_first) {
    Backend& be = model.backend();
    const ChunkSequence cs = chunk_sequence(tokens, sink_id);
    const int n = int(tokens.size());
    ChunkKv out = chunk_shadow(tokens, cs, dest.dtype());
    if (n == 0) return out;
    IF_CHECK(scratch.dtype() == dest.dtype(),
             "prefill_chunk_into: a " << kv_dtype_name(scratch.dtype()) << " scratch cache for a "
                                      << kv_dtype_name(dest.dtype()) << " cache");
    IF_CHECK(dest_first >= 0 && dest_first + n <= dest.size(),
             "prefill_chunk_into: slots [" << dest_first << ", " << dest_first + n
                                           << ") outside the " << dest.size() << " appended");
    Buffer k = be.alloc(size_t(n) * dest.row_bytes()), v = be.alloc(size_t(n) * dest.row_bytes());
    LayerPlacer placer;
    placer.set_chunk(dest.pos().data() + dest_first, out.local_pos.data(), n);
    run_chunk(model, cs, scratch, [&](int l) {
        scratch.read_range_raw(l, cs.lead, n, k.data(), v.data());
        placer.place(model, dest, l, dest_first, k.data(), v.data());
    });
    return out;
}

std::vector<ChunkKv> prefill_chunks(Model& model, const std::vector<std::vector<int32_t>>& chunks,
                                    int32_t sink_id) {
    // One pass per chunk, never several chunks in one GEMM: a GEMM's rounding depends on where
    // a row sits in it, so packed chunks would differ (in the last bits) from chunks prefilled
    // alone — which is what the KV store holds (docs/design.md §8: a cached run equals a fresh
    // run).
    std::vector<ChunkKv> out;
    out.reserve(chunks.size());
    for (const auto& ch : chunks) out.push_back(prefill_chunk(model, ch, sink_id));
    return out;
}

namespace {

// assemble_cache; with `release` (the same vector as `chunks`, writable) each chunk's K/V are
// freed once copied.
void assemble(Model& model, const std::vector<ChunkKv>& chunks, std::vector<ChunkKv>* release,
              const std::vector<int>& order, const std::vector<int32_t>& target_pos,
              const std::vector<int32_t>* group, KvCache& cache, int n_layers) {
    const int L = n_layers < 0 ? model.config().n_layer : n_layers;
    size_t total = 0;
    for (int ci : order) {
        total += chunks.at(ci).tokens.size();
        IF_CHECK(has_kv(chunks[ci]), "assemble_cache: the K/V of chunk " << ci << " were released");
    }
    IF_CHECK(target_pos.size() == total,
             "assemble_cache: " << target_pos.size() << " positions for " << total << " tokens");
    IF_CHECK(group == nullptr || group->size() == total, "assemble_cache: group size mismatch");
    const int first = cache.append(int(total), target_pos.data(), group ? group->data() : nullptr);
    LayerPlacer placer;
    int at = 0;
    for (int ci : order) {
        const ChunkKv& ck = chunks[ci];
        const int n = ck.size();
        if (n == 0) continue;
        IF_CHECK(ck.dtype == cache.dtype(), "assemble_cache: chunk K/V are "
                                                << kv_dtype_name(ck.dtype) << ", the cache "
                                                << kv_dtype_name(cache.dtype()));
        placer.set_chunk(target_pos.data() + at, ck.local_pos.data(), n);
        for (int l = 0; l < L; ++l) {
            placer.place(model, cache, l, first + at, ck.k[l].data(), ck.v[l].data());
        }
        if (release) {
            ChunkKv& done = (*release)[ci];
            std::vector<Buffer>().swap(done.k);
            std::vector<Buffer>().swap(done.v);
            return_free_memory();  // now, not after the loop: the peak is what this saves
        }
        at += n;
        // A point where job serve may run a decode step (its time slice; no tokens of layer
        // work): the copy of a long context is otherwise one piece of tens of milliseconds.
        piece_done(0.0);
    }
}

}  // namespace

void assemble_cache(Model& model, const std::vector<ChunkKv>& chunks, const std::vector<int>& order,
                    const std::vector<int32_t>& target_pos, const std::vector<int32_t>* group,
                    KvCache& cache, int n_layers) {
    assemble(model, chunks, nullptr, order, target_pos, group, cache, n_layers);
}

void assemble_cache_releasing(Model& model, std::vector<ChunkKv>& chunks,
                              const std::vector<int>& order, const std::vector<int32_t>& target_pos,
                              const std::vector<int32_t>* group, KvCache& cache) {
    assemble(model, chunks, &chunks, order, target_pos, group, cache, -1);
}

}  // namespace infoflow
