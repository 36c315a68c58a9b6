#include "runtime/parallel/dist_attention.h"

#include <algorithm>
#include <cmath>

#include "runtime/core/error.h"

namespace infoflow {

void merge_partials_allgather(Communicator& comm, Backend& be, float* out, float* lse, int n_states,
                              int head_dim) {
    const int P = comm.size();
    if (P == 1) return;
    const size_t per = size_t(n_states) * (head_dim + 1);
    const size_t out_bytes = sizeof(float) * n_states * head_dim;
    Buffer send = be.alloc_floats(std::max<size_t>(1, per));
    Buffer recv = be.alloc_floats(std::max<size_t>(1, per * P));
    be.copy(send.data(), out, out_bytes);
    be.copy(send.data() + size_t(n_states) * head_dim, lse, sizeof(float) * n_states);
    comm.all_gather(send.data(), per * sizeof(float), recv.data());
    // Start from rank 0's state and merge the others in rank order.
    be.copy(out, recv.data(), out_bytes);
    be.copy(lse, recv.data() + size_t(n_states) * head_dim, sizeof(float) * n_states);
    for (int r = 1; r < P; ++r) {
        const float* o = recv.data() + per * r;
        be.lse_merge(out, lse, o, o + size_t(n_states) * head_dim, n_states, head_dim);
    }
}

void pass_q_attention(Communicator& comm, Backend& be, AttnParams local, const float* q_own,
                      const int32_t* pos_own, int n_own, float* out_own, float* lse_own) {
    const int P = comm.size();
    const int H = local.n_head;
    const int D = local.head_dim;
    const size_t qrow = size_t(H) * D;

    // Everyone learns how many rows each rank owns.
    std::vector<int64_t> counts(P, 0);
    counts[comm.rank()] = n_own;
    comm.all_reduce(counts.data(), P, DType::i64, ReduceOp::sum);
    std::vector<size_t> q_bytes(P), pos_bytes(P);
    int n_all = 0;
    std::vector<int> first(P);
    for (int r = 0; r < P; ++r) {
        first[r] = n_all;
        n_all += int(counts[r]);
        q_bytes[r] = size_t(counts[r]) * qrow * sizeof(float);
        pos_bytes[r] = size_t(counts[r]) * sizeof(int32_t);
    }
    // Queries in the backend's memory; positions stay on the host, as the cache's do.
    Buffer q_all = be.alloc_floats(std::max<size_t>(1, size_t(n_all) * qrow));
    std::vector<int32_t> pos_all(std::max(1, n_all));
    comm.all_gather_v(q_own, q_bytes[comm.rank()], q_all.data(), q_bytes);
    comm.all_gather_v(pos_own, pos_bytes[comm.rank()], pos_all.data(), pos_bytes);

    // Partial attention of every query over this rank's keys.
    Buffer out_all = be.alloc_floats(std::max<size_t>(1, size_t(n_all) * qrow));
    Buffer lse_all = be.alloc_floats(std::max<size_t>(1, size_t(n_all) * H));
    if (n_all > 0) {
        local.q = q_all.data();
        local.q_pos = pos_all.data();
        local.q_group = nullptr;
        local.k_group = nullptr;
        local.n_q = n_all;
        local.out = out_all.data();
        local.lse = lse_all.data();
        if (local.n_kv > 0) {
            be.attention(local);
        } else {  // no local key: the empty state (0, -inf) for every row
            const std::vector<float> zero(size_t(n_all) * qrow, 0.0f);
            const std::vector<float> ninf(size_t(n_all) * H, -INFINITY);
            be.upload(out_all.data(), zero.data(), zero.size() * sizeof(float));
            be.upload(lse_all.data(), ninf.data(), ninf.size() * sizeof(float));
        }
    }

    // Partials back to their owners: block for rank q = its rows' (out, lse).
    const size_t state = size_t(H) * (D + 1);
    Buffer send = be.alloc_floats(std::max<size_t>(1, size_t(n_all) * state));
    std::vector<size_t> send_bytes(P), recv_bytes(P);
    for (int r = 0; r < P; ++r) {
        float* dst = send.data() + size_t(first[r]) * state;
        const size_t n = size_t(counts[r]);
        be.copy(dst, out_all.data() + size_t(first[r]) * qrow, n * qrow * sizeof(float));
        be.copy(dst + n * qrow, lse_all.data() + size_t(first[r]) * H, n * H * sizeof(float));
        send_bytes[r] = n * state * sizeof(float);
        recv_bytes[r] = size_t(n_own) * state * sizeof(float);
    }
    Buffer recv = be.alloc_floats(std::max<size_t>(1, size_t(n_own) * state * P));
    comm.all_to_all_v(send.data(), send_bytes, recv.data(), recv_bytes);
    const size_t blk = size_t(n_own) * state;
    if (n_own == 0) return;
    be.copy(out_own, recv.data(), size_t(n_own) * qrow * sizeof(float));
    be.copy(lse_own, recv.data() + size_t(n_own) * qrow, size_t(n_own) * H * sizeof(float));
    for (int r = 1; r < P; ++r) {
        const float* o = recv.data() + blk * r;
        be.lse_merge(out_own, lse_own, o, o + size_t(n_own) * qrow, n_own * H, D);
    }
}

}  // namespace infoflow
