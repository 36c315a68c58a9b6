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
        be.copy(out.k[l].data(), cache.k(l) + lead * row, size_t(n) * row * sizeof(float));
        be.copy(out.v[l].data(), cache.v(l) + lead * row, size_t(n) * row * sizeof(float));
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
        // One batch: the projections and the MLP run over every row at once (row-independent
        // GEMMs), attention runs per chunk over that chunk's own keys, with the same arguments
        // as prefill_chunk gives it. So the result does not depend on which chunks share a batch:
        // it equals prefill_chunk bit for bit, and a chunk loaded from the KV store (prefilled
        // alone) equals one prefilled here.
        std::vector<int32_t> seq, pos;
        std::vector<int> begin, len;
        for (size_t k = i; k < j; ++k) {
            begin.push_back(int(seq.size()));
            if (lead) {
                seq.push_back(sink_id);
                pos.push_back(0);
            }
            for (size_t t = 0; t < chunks[k].size(); ++t) {
                seq.push_back(chunks[k][t]);
                pos.push_back(int32_t(lead + t));
            }
            len.push_back(int(seq.size()) - begin.back());
        }
        const int n = int(seq.size());
        const size_t row = size_t(c.n_head_kv) * c.head_dim;
        const size_t qrow = size_t(c.n_head) * c.head_dim;
        Buffer hidden = be.alloc_floats(size_t(n) * c.n_embd);
        Buffer q = be.alloc_floats(size_t(n) * qrow);
        Buffer kb = be.alloc_floats(size_t(n) * row);
        Buffer vb = be.alloc_floats(size_t(n) * row);
        Buffer attn = be.alloc_floats(size_t(n) * qrow);
        model.embed(seq.data(), n, hidden.data());
        for (size_t k = i; k < j; ++k) {
            ChunkKv& ck = out[k];
            ck.tokens = chunks[k];
            for (size_t t = 0; t < chunks[k].size(); ++t) ck.local_pos.push_back(int32_t(lead + t));
        }
        for (int l = 0; l < c.n_layer; ++l) {
            model.layer_qkv(l, hidden.data(), n, pos.data(), q.data(), kb.data(), vb.data());
            for (size_t k = i; k < j; ++k) {
                const int b = begin[k - i], m = len[k - i];
                AttnParams ap;
                ap.q = q.data() + size_t(b) * qrow;
                ap.k = kb.data() + size_t(b) * row;
                ap.v = vb.data() + size_t(b) * row;
                ap.q_pos = pos.data() + b;
                ap.k_pos = pos.data() + b;
                ap.n_q = m;
                ap.n_kv = m;
                ap.n_head = c.n_head;
                ap.n_head_kv = c.n_head_kv;
                ap.head_dim = c.head_dim;
                ap.out = attn.data() + size_t(b) * qrow;
                be.attention(ap);
                // The chunk's K/V without the sink.
                ChunkKv& ck = out[k];
                const size_t real = size_t(m - lead);
                ck.k.push_back(be.alloc_floats(std::max<size_t>(1, real * row)));
                ck.v.push_back(be.alloc_floats(std::max<size_t>(1, real * row)));
                be.copy(ck.k[l].data(), kb.data() + size_t(b + lead) * row,
                        real * row * sizeof(float));
                be.copy(ck.v[l].data(), vb.data() + size_t(b + lead) * row,
                        real * row * sizeof(float));
            }
            // The last layer's output is not needed: K/V are all a chunk prefill keeps.
            if (l + 1 < c.n_layer) model.layer_post(l, hidden.data(), attn.data(), n);
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
        for (int l = 0; l < L; ++l) {
            float* kd = cache.k(l) + size_t(first + at) * row;
            be.copy(kd, ck.k[l].data(), size_t(n) * row * sizeof(float));
            be.copy(cache.v(l) + size_t(first + at) * row, ck.v[l].data(),
                    size_t(n) * row * sizeof(float));
            if (rotate) model.rerotate_keys(kd, n, delta.data());
        }
        at += n;
    }
}

}  // namespace infoflow
