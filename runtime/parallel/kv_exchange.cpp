#include "runtime/parallel/kv_exchange.h"

#include <algorithm>

#include "runtime/parallel/comm_stage.h"

namespace infoflow {
namespace {

char* bytes_of(Buffer& b) { return static_cast<char*>(static_cast<void*>(b.data())); }

}  // namespace

KvExchange::KvExchange(Communicator& comm, Backend& be, KvCache& cache,
                       const std::vector<int32_t>& slot, const std::vector<std::vector<int>>& lists)
    : comm_(comm), be_(be), cache_(cache), rb_(cache.row_bytes()) {
    const int P = comm.size();
    size_t total = 0;
    slots_.resize(P);
    bytes_.resize(P);
    for (int p = 0; p < P; ++p) {
        for (int i : lists[p]) slots_[p].push_back(slot[i]);
        bytes_[p] = lists[p].size() * 2 * rb_;
        total += bytes_[p];
    }
    send_ = be.alloc(std::max<size_t>(1, bytes_[comm.rank()]));
    gathered_ = be.alloc(std::max<size_t>(1, total));
}

void KvExchange::run(int layer) {
    const int P = comm_.size(), me = comm_.rank();
    char* send = bytes_of(send_);
    const int n = int(slots_[me].size());
    cache_.read_rows_raw(layer, slots_[me].data(), send, send + size_t(n) * rb_, n);
    all_gather_v_backend(comm_, be_, send_.data(), bytes_[me], gathered_.data(), bytes_);
    const char* block = bytes_of(gathered_);
    for (int p = 0; p < P; ++p) {
        const int np = int(slots_[p].size());
        if (p != me) {
            for (const SlotRun& r : slot_runs(slots_[p].data(), np)) {
                cache_.write_range_raw(layer, r.slot, r.n, block + size_t(r.row) * rb_,
                                       block + (size_t(np) + r.row) * rb_);
            }
        }
        block += bytes_[p];
    }
}

}  // namespace infoflow
