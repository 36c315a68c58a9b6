#include "runtime/method/chunk_kv.h"

#include "runtime/core/error.h"

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
    const size_t row = size_t(cache.row());
    for (int l = 0; l < c.n_layer; ++l) {
        model.layer_forward(l, hidden.data(), int(seq.size()), pos.data(), nullptr, slots.data(),
                            cache);
        out.k.push_back(be.alloc_floats(size_t(n) * row));
        out.v.push_back(be.alloc_floats(size_t(n) * row));
        cache.read_range(l, lead, n, out.k[l].data(), out.v[l].data());
    }
    return out;
}

std::vector<ChunkKv> prefill_chunks(Model& model, const std::vector<std::vector<int32_t>>& chunks,
                                    int32_t sink_id, int batch_tokens) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int lead = sink_id >= 0 ? 1 : 0;
    std::vector<ChunkKv> out(chunks.size());
    size_t i = 0;
    while (i < chunks.size()) {
        // Consecutive chunks while they fit; a chunk larger than the batch goes alone.
        size_t j = i;
        int total = 0;
        while (j < chunks.size() &&
               (j == i || total + lead + int(chunks[j].size()) <= batch_tokens)) {
            total += lead + int(chunks[j].size());
            ++j;
        }
        if (j == i + 1) {
            out[i] = prefill_chunk(model, chunks[i], sink_id);
            i = j;
            continue;
        }
        std::vector<int32_t> seq, pos, group;
        for (size_t k = i; k < j; ++k) {
            if (lead) {
                seq.push_back(sink_id);
                pos.push_back(0);
                group.push_back(int32_t(k - i));
            }
            for (size_t t = 0; t < chunks[k].size(); ++t) {
                seq.push_back(chunks[k][t]);
                pos.push_back(int32_t(lead + t));
                group.push_back(int32_t(k - i));
            }
        }
        const int n = int(seq.size());
        KvCache cache = model.make_cache(n);
        const int first = cache.append(n, pos.data(), group.data());
        std::vector<int32_t> slots(n);
        for (int t = 0; t < n; ++t) slots[t] = first + t;
        Buffer hidden = be.alloc_floats(size_t(n) * c.n_embd);
        model.embed(seq.data(), n, hidden.data());
        for (int l = 0; l < c.n_layer; ++l) {
            model.layer_forward(l, hidden.data(), n, pos.data(), group.data(), slots.data(), cache);
        }
        const size_t row = size_t(cache.row());
        int at = 0;
        for (size_t k = i; k < j; ++k) {
            ChunkKv& ck = out[k];
            const int m = int(chunks[k].size());
            ck.tokens = chunks[k];
            for (int t = 0; t < m; ++t) ck.local_pos.push_back(lead + t);
            at += lead;
            for (int l = 0; l < c.n_layer; ++l) {
                ck.k.push_back(be.alloc_floats(std::max<size_t>(1, size_t(m) * row)));
                ck.v.push_back(be.alloc_floats(std::max<size_t>(1, size_t(m) * row)));
                cache.read_range(l, at, m, ck.k[l].data(), ck.v[l].data());
            }
            at += m;
        }
        i = j;
    }
    return out;
}

void assemble_cache(Model& model, const std::vector<ChunkKv>& chunks, const std::vector<int>& order,
                    const std::vector<int32_t>& target_pos, const std::vector<int32_t>* group,
                    KvCache& cache, int n_layers) {
    Backend& be = model.backend();
    const int L = n_layers < 0 ? model.config().n_layer : n_layers;
    size_t total = 0;
    for (int ci : order) total += chunks.at(ci).tokens.size();
    IF_CHECK(target_pos.size() == total,
             "assemble_cache: " << target_pos.size() << " positions for " << total << " tokens");
    IF_CHECK(group == nullptr || group->size() == total, "assemble_cache: group size mismatch");
    const int first = cache.append(int(total), target_pos.data(), group ? group->data() : nullptr);
    const size_t row = size_t(cache.row());
    Buffer rotated;  // [n, row] the chunk's keys at their target positions
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
        // Keys are re-rotated on their way in, so the cache only ever receives finished rows.
        if (rotate && rotated.bytes() < size_t(n) * row * sizeof(float)) {
            rotated = be.alloc_floats(size_t(n) * row);
        }
        for (int l = 0; l < L; ++l) {
            const float* k = ck.k[l].data();
            if (rotate) {
                be.copy(rotated.data(), k, size_t(n) * row * sizeof(float));
                model.rerotate_keys(rotated.data(), n, delta.data());
                k = rotated.data();
            }
            cache.write_range(l, first + at, n, k, ck.v[l].data());
        }
        at += n;
    }
}

}  // namespace infoflow
