// Collectives on backend memory, staged through the host where the communicator cannot read it
// (see comm_stage.h).
#include "runtime/parallel/comm_stage.h"

#include <algorithm>
#include <numeric>

namespace infoflow {

bool comm_reads_backend(const Communicator& comm, const Backend& be) {
    // The CPU backend's memory is host memory; any other backend's is device memory.
    const bool host_backend = be.name() == "cpu";
    return host_backend == (comm.memory_space() == MemorySpace::host);
}

namespace {

// The stream a direct call is enqueued on: the backend's own for a device communicator, so the
// transfer follows the ops that wrote its buffers (the CUDA backend's stream does not
// synchronize with the legacy default stream a null stream would mean); none for a host one.
Stream direct_stream(const Communicator& comm, Backend& be) {
    return comm.memory_space() == MemorySpace::device ? be.stream() : nullptr;
}

std::vector<char> download(Backend& be, const void* src, size_t bytes) {
    std::vector<char> h(std::max<size_t>(bytes, 1));
    if (bytes) be.download(h.data(), src, bytes);
    return h;
}

size_t total(const std::vector<size_t>& v) {
    return std::accumulate(v.begin(), v.end(), size_t(0));
}

}  // namespace

void all_gather_backend(Communicator& comm, Backend& be, const void* send, size_t bytes_per_rank,
                        void* recv) {
    if (comm_reads_backend(comm, be)) {
        return comm.all_gather(send, bytes_per_rank, recv, direct_stream(comm, be));
    }
    const std::vector<char> s = download(be, send, bytes_per_rank);
    std::vector<char> r(std::max<size_t>(bytes_per_rank * size_t(comm.size()), 1));
    comm.all_gather(s.data(), bytes_per_rank, r.data());
    be.upload(recv, r.data(), bytes_per_rank * size_t(comm.size()));
}

void all_gather_v_backend(Communicator& comm, Backend& be, const void* send, size_t send_bytes,
                          void* recv, const std::vector<size_t>& recv_bytes) {
    if (comm_reads_backend(comm, be)) {
        return comm.all_gather_v(send, send_bytes, recv, recv_bytes, direct_stream(comm, be));
    }
    const std::vector<char> s = download(be, send, send_bytes);
    std::vector<char> r(std::max<size_t>(total(recv_bytes), 1));
    comm.all_gather_v(s.data(), send_bytes, r.data(), recv_bytes);
    be.upload(recv, r.data(), total(recv_bytes));
}

void all_to_all_v_backend(Communicator& comm, Backend& be, const void* send,
                          const std::vector<size_t>& send_bytes, void* recv,
                          const std::vector<size_t>& recv_bytes) {
    if (comm_reads_backend(comm, be)) {
        return comm.all_to_all_v(send, send_bytes, recv, recv_bytes, direct_stream(comm, be));
    }
    const std::vector<char> s = download(be, send, total(send_bytes));
    std::vector<char> r(std::max<size_t>(total(recv_bytes), 1));
    comm.all_to_all_v(s.data(), send_bytes, r.data(), recv_bytes);
    be.upload(recv, r.data(), total(recv_bytes));
}

BackendP2P::BackendP2P(Communicator& comm, Backend& be)
    : comm_(comm), be_(be), direct_(comm_reads_backend(comm, be)) {}

Request BackendP2P::isend(const void* buf, size_t bytes, int dest, int tag) {
    if (direct_) return comm_.isend(buf, bytes, dest, tag, direct_stream(comm_, be_));
    auto s = std::make_unique<Staged>();
    s->host = download(be_, buf, bytes);
    const void* host = s->host.data();
    staged_.push_back(std::move(s));
    return comm_.isend(host, bytes, dest, tag);
}

Request BackendP2P::irecv(void* buf, size_t bytes, int src, int tag) {
    if (direct_) return comm_.irecv(buf, bytes, src, tag, direct_stream(comm_, be_));
    auto s = std::make_unique<Staged>();
    s->dst = buf;
    s->host.resize(bytes);
    void* host = s->host.data();
    staged_.push_back(std::move(s));
    return comm_.irecv(host, bytes, src, tag);
}

void BackendP2P::complete() {
    for (const auto& s : staged_) {
        if (s->dst && !s->host.empty()) be_.upload(s->dst, s->host.data(), s->host.size());
    }
    staged_.clear();
}

}  // namespace infoflow
