#include "runtime/method/chunk_kv.h"

#include "runtime/core/error.h"
#include "runtime/core/memory.h"

namespace infoflow {

ChunkKv prefill_chunk(Model& model, const std::vector<int32_t>& tokens, int32_t sink_id) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int lead = sink_id >= 0 ? 1 : 0;
    const int n = int(tokens.size());
    std::vector<int32_t> seq;
    if (lead) seq.push_back(sink_id);
    seq.insert(seq.end(), tokens.begin(), tokens.end());
    std::vector<int32_t> pos(seq.size());
    for (size_t i = 0; i < seq.size(); ++i) pos[i] = int32_t(i);

    ChunkKv out;
    out.tokens = tokens;
    out.local_pos.assign(pos.begin() + lead, pos.end());
    if (n == 0) return out;
    KvCache cache = model.make_cache(int(seq.size()));
    const int first = cache.append(int(seq.size()), pos.data(), nullptr);
    std::vector<int32_t> slots(seq.size());
    for (size_t i = 0; i < seq.size(); ++i) slots[i] = first + int32_t(i);
    Buffer hidden = be.alloc_floats(seq.size() * size_t(c.n_embd));
    model.embed(seq.data(), int(seq.size()), hidden.data());
    out.dtype = cache.dtype();
    for (int l = 0; l < c.n_layer; ++l) {
        model.layer_forward(l, hidden.data(), int(seq.size()), pos.data(), nullptr, slots.data(),
                            cache);
        out.k.push_back(be.alloc(size_t(n) * cache.row_bytes()));
        out.v.push_back(be.alloc(size_t(n) * cache.row_bytes()));
        cache.read_range_raw(l, lead, n, out.k[l].data(), out.v[l].data());
    }
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
    Backend& be = model.backend();
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
    const size_t row = size_t(cache.row());
    Buffer rotated;                  // [n, row] the chunk's keys at their target positions
    std::vector<uint16_t> narrow_k;  // the same rounded back to a 16-bit KV type
    int at = 0;
    for (int ci : order) {
        const ChunkKv& ck = chunks[ci];
        const int n = ck.size();
        if (n == 0) continue;
        std::vector<int32_t> delta(n);
        bool rotate = false;
        for (int i = 0; i < n; ++i) {
            delta[i] = target_pos[at + i] - ck.local_pos[i];
            rotate = rotate || delta[i] != 0;
        }
        IF_CHECK(ck.dtype == cache.dtype(), "assemble_cache: chunk K/V are "
                                                << kv_dtype_name(ck.dtype) << ", the cache "
                                                << kv_dtype_name(cache.dtype()));
        const bool wide = ck.dtype == KvDtype::f32;
        // Keys are re-rotated on their way in, so the cache only ever receives finished rows
        // (16-bit keys: widened, rotated in fp32, rounded once more).
        if (rotate && rotated.bytes() < size_t(n) * row * sizeof(float)) {
            rotated = be.alloc_floats(size_t(n) * row);
            if (!wide) narrow_k.resize(size_t(n) * row);
        }
        for (int l = 0; l < L; ++l) {
            if (!rotate) {
                cache.write_range_raw(l, first + at, n, ck.k[l].data(), ck.v[l].data());
                continue;
            }
            if (wide) {
                be.copy(rotated.data(), ck.k[l].data(), size_t(n) * row * sizeof(float));
            } else {  // 16-bit KV lives on the CPU backend: host memory
                kv_widen(ck.dtype, ck.k[l].data(), size_t(n) * row, rotated.data());
            }
            model.rerotate_keys(rotated.data(), n, delta.data());
            if (wide) {
                cache.write_range(l, first + at, n, rotated.data(), ck.v[l].data());
            } else {
                kv_narrow(ck.dtype, rotated.data(), size_t(n) * row, narrow_k.data());
                cache.write_range_raw(l, first + at, n, narrow_k.data(), ck.v[l].data());
            }
        }
        if (release) {
            ChunkKv& done = (*release)[ci];
            std::vector<Buffer>().swap(done.k);
            std::vector<Buffer>().swap(done.v);
            return_free_memory();  // now, not after the loop: the peak is what this saves
        }
        at += n;
    }
}

}  // namespace

void assemble_cache(Model& model, const std::vector<ChunkKv>& chunks, const std::vector<int>& order,
                    const std::vector<int32_t>& target_pos, const std::vector<int32_t>* group,
                    KvCache& cache, int n_layers) {
    assemble(model, chunks, nullptr, order, target_pos, group, cache, n_layers);
}

void assemble_cache_releasing(Model& model, std::vector<ChunkKv>& chunks,
                              const std::vector<int>& order,
                              const std::vector<int32_t>& target_pos,
                              const std::vector<int32_t>* group, KvCache& cache) {
    assemble(model, chunks, &chunks, order, target_pos, group, cache, -1);
}

}  // namespace infoflow
