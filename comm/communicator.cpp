// The shared half of every communicator: argument checks, timing and byte accounting around the
// implementations' do_* calls (docs/design.md §5.5), Request, the stats gather, the config-hash check
// and abort_job (§11). This is also the factory file: the only place that tests INFOFLOW_HAVE_MPI
// and INFOFLOW_HAVE_NCCL (docs/style.md point 3). It never calls MPI, CUDA or NCCL itself; they stay in
// mpi_env.cpp, mpi_comm.cpp and nccl_comm.cpp.
#include "comm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"

#if defined(INFOFLOW_HAVE_MPI)
#include "comm/mpi_env.h"
#endif
#if defined(INFOFLOW_HAVE_NCCL)
#include "comm/nccl_comm.h"
#endif

namespace infoflow {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

uint64_t sum_except(const std::vector<size_t>& v, int skip) {
    uint64_t s = 0;
    for (size_t i = 0; i < v.size(); ++i) {
        if (static_cast<int>(i) != skip) s += v[i];
    }
    return s;
}

bool valid_phase_name(const std::string& s) {
    if (s.empty()) return false;
    for (unsigned char c : s) {
        if (c < 0x20 || c == 0x7f) return false;
    }
    return true;
}

}  // namespace

size_t dtype_size(DType t) {
    switch (t) {
        case DType::f32:
            return 4;
        case DType::f64:
            return 8;
        case DType::i32:
            return 4;
        case DType::i64:
            return 8;
    }
    IF_FAIL("unknown DType " << static_cast<int>(t));
}

const char* dtype_name(DType t) {
    switch (t) {
        case DType::f32:
            return "f32";
        case DType::f64:
            return "f64";
        case DType::i32:
            return "i32";
        case DType::i64:
            return "i64";
    }
    return "?";
}

const char* reduce_op_name(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum:
            return "sum";
        case ReduceOp::max:
            return "max";
        case ReduceOp::min:
            return "min";
    }
    return "?";
}

// ---- Request ----------------------------------------------------------------------------------

Request::Request(std::unique_ptr<RequestImpl> impl, Communicator* owner, std::string phase)
    : impl_(std::move(impl)), owner_(owner), phase_(std::move(phase)) {}

Request::~Request() { release(); }

Request::Request(Request&& o) noexcept
    : impl_(std::move(o.impl_)), owner_(o.owner_), phase_(std::move(o.phase_)) {}

Request& Request::operator=(Request&& o) noexcept {
    if (this != &o) {
        release();
        impl_ = std::move(o.impl_);
        owner_ = o.owner_;
        phase_ = std::move(o.phase_);
    }
    return *this;
}

void Request::release() noexcept {
    if (!impl_) return;
    if (std::uncaught_exceptions() == 0) {
        std::fprintf(stderr,
                     "warning: infoflow::Request destroyed before completion; "
                     "abandoning it (every isend/irecv must be waited)\n");
    }
    impl_->abandon();
    impl_.reset();
}

void Request::wait() {
    if (!impl_) return;
    const auto t0 = Clock::now();
    std::unique_ptr<RequestImpl> impl = std::move(impl_);  // done from here on, even on throw
    try {
        impl->wait();
    } catch (...) {
        if (owner_) owner_->add_wait(phase_, ms_since(t0));
        throw;
    }
    if (owner_) owner_->add_wait(phase_, ms_since(t0));
}

bool Request::test() {
    if (!impl_) return true;
    const auto t0 = Clock::now();
    bool complete = false;
    try {
        complete = impl_->test();
    } catch (...) {
        impl_.reset();
        if (owner_) owner_->add_wait(phase_, ms_since(t0));
        throw;
    }
    if (complete) impl_.reset();
    if (owner_) owner_->add_wait(phase_, ms_since(t0));
    return complete;
}

void wait_all(std::vector<Request>& requests) {
    std::exception_ptr first;
    for (Request& r : requests) {
        try {
            r.wait();
        } catch (...) {
            if (!first) first = std::current_exception();
        }
    }
    if (first) std::rethrow_exception(first);
}

// ---- Communicator: checks and accounting around the do_* calls ---------------------------------

Communicator::Communicator(int rank, int size, int local_rank, int local_size)
    : rank_(rank),
      size_(size),
      local_rank_(local_rank),
      local_size_(local_size),
      watchdog_(rank, std::max(size, 1)) {
    IF_CHECK(size >= 1 && rank >= 0 && rank < size, "bad rank " << rank << " of " << size);
    IF_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size,
             "bad node-local rank " << local_rank << " of " << local_size);
}

void Communicator::check_stream(Stream stream) const {
    IF_CHECK(memory_space() != MemorySpace::host || stream == nullptr,
             "the " << kind() << " communicator takes host buffers and no stream");
}

void Communicator::check_peer(int peer, const char* what) const {
    IF_CHECK(peer >= 0 && peer < size_,
             what << " rank " << peer << " out of range [0, " << size_ << ")");
}

void Communicator::count(uint64_t sent, uint64_t recv, double ms) {
    auto it = stats_.find(phase_);
    if (it == stats_.end()) {
        it = stats_.emplace(phase_, CommStats{}).first;
        phase_order_.push_back(phase_);
    }
    it->second.bytes_sent += sent;
    it->second.bytes_recv += recv;
    it->second.wait_ms += ms;
    it->second.calls += 1;
}

void Communicator::add_wait(const std::string& phase, double ms) {
    auto it = stats_.find(phase);
    if (it == stats_.end()) {  // stats were reset while the request was pending
        it = stats_.emplace(phase, CommStats{}).first;
        phase_order_.push_back(phase);
    }
    it->second.wait_ms += ms;
}

void Communicator::barrier(Stream stream) {
    check_stream(stream);
    const auto t0 = Clock::now();
    do_barrier(stream);
    count(0, 0, ms_since(t0));
}

void Communicator::broadcast(void* buf, size_t bytes, int root, Stream stream) {
    check_stream(stream);
    check_peer(root, "broadcast root");
    IF_CHECK(buf != nullptr || bytes == 0, "broadcast: null buffer for " << bytes << " bytes");
    const auto t0 = Clock::now();
    do_broadcast(buf, bytes, root, stream);
    const uint64_t b = bytes, p1 = static_cast<uint64_t>(size_ - 1);
    count(rank_ == root ? b * p1 : 0, rank_ == root ? 0 : b, ms_since(t0));
}

void Communicator::all_reduce(void* buf, size_t count_, DType dtype, ReduceOp op, Stream stream) {
    check_stream(stream);
    const size_t e = dtype_size(dtype);
    IF_CHECK(buf != nullptr || count_ == 0,
             "all_reduce: null buffer for " << count_ << " " << dtype_name(dtype) << " elements");
    const auto t0 = Clock::now();
    do_all_reduce(buf, count_, dtype, op, stream);
    const uint64_t n = count_, p = static_cast<uint64_t>(size_), r = static_cast<uint64_t>(rank_);
    const uint64_t b = n * e;
    const uint64_t c_r = e * (n / p + (r < n % p ? 1 : 0));
    // B + (P-2)*c_r, written so that P = 1 (B - c_r with c_r = B) stays unsigned.
    const uint64_t bytes = p == 1 ? 0 : b + (p - 2) * c_r;
    count(bytes, bytes, ms_since(t0));
}

void Communicator::all_gather(const void* send, size_t bytes_per_rank, void* recv, Stream stream) {
    check_stream(stream);
    IF_CHECK((send != nullptr && recv != nullptr) || bytes_per_rank == 0,
             "all_gather: null buffer for " << bytes_per_rank << " bytes per rank");
    const auto t0 = Clock::now();
    do_all_gather(send, bytes_per_rank, recv, stream);
    const uint64_t b = static_cast<uint64_t>(bytes_per_rank) * (size_ - 1);
    count(b, b, ms_since(t0));
}

void Communicator::all_gather_v(const void* send, size_t send_bytes, void* recv,
                                const std::vector<size_t>& recv_bytes, Stream stream) {
    check_stream(stream);
    IF_CHECK(recv_bytes.size() == static_cast<size_t>(size_),
             "all_gather_v: recv_bytes has " << recv_bytes.size() << " entries for " << size_
                                             << " ranks");
    IF_CHECK(recv_bytes[rank_] == send_bytes,
             "all_gather_v: rank " << rank_ << " sends " << send_bytes << " bytes but recv_bytes["
                                   << rank_ << "] = " << recv_bytes[rank_]);
    IF_CHECK(send != nullptr || send_bytes == 0, "all_gather_v: null send buffer");
    IF_CHECK(recv != nullptr || sum_except(recv_bytes, -1) == 0, "all_gather_v: null recv buffer");
    const auto t0 = Clock::now();
    do_all_gather_v(send, send_bytes, recv, recv_bytes, stream);
    count(static_cast<uint64_t>(send_bytes) * (size_ - 1), sum_except(recv_bytes, rank_),
          ms_since(t0));
}

void Communicator::all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                                const std::vector<size_t>& recv_bytes, Stream stream) {
    check_stream(stream);
    const size_t p = static_cast<size_t>(size_);
    IF_CHECK(send_bytes.size() == p && recv_bytes.size() == p,
             "all_to_all_v: send_bytes/recv_bytes have "
                 << send_bytes.size() << "/" << recv_bytes.size() << " entries for " << p
                 << " ranks");
    IF_CHECK(send_bytes[rank_] == recv_bytes[rank_],
             "all_to_all_v: rank " << rank_ << " sends itself " << send_bytes[rank_]
                                   << " bytes but expects " << recv_bytes[rank_]);
    IF_CHECK(send != nullptr || sum_except(send_bytes, -1) == 0, "all_to_all_v: null send buffer");
    IF_CHECK(recv != nullptr || sum_except(recv_bytes, -1) == 0, "all_to_all_v: null recv buffer");
    const auto t0 = Clock::now();
    do_all_to_all_v(send, send_bytes, recv, recv_bytes, stream);
    count(sum_except(send_bytes, rank_), sum_except(recv_bytes, rank_), ms_since(t0));
}

Request Communicator::isend(const void* buf, size_t bytes, int dest, int tag, Stream stream) {
    check_stream(stream);
    check_peer(dest, "isend destination");
    IF_CHECK(tag >= 0, "isend: negative tag " << tag);
    IF_CHECK(buf != nullptr || bytes == 0, "isend: null buffer for " << bytes << " bytes");
    const auto t0 = Clock::now();
    std::unique_ptr<RequestImpl> impl = do_isend(buf, bytes, dest, tag, stream);
    count(dest == rank_ ? 0 : bytes, 0, ms_since(t0));
    return Request(std::move(impl), this, phase_);
}

Request Communicator::irecv(void* buf, size_t bytes, int src, int tag, Stream stream) {
    check_stream(stream);
    check_peer(src, "irecv source");
    IF_CHECK(tag >= 0, "irecv: negative tag " << tag);
    IF_CHECK(buf != nullptr || bytes == 0, "irecv: null buffer for " << bytes << " bytes");
    const auto t0 = Clock::now();
    std::unique_ptr<RequestImpl> impl = do_irecv(buf, bytes, src, tag, stream);
    count(0, src == rank_ ? 0 : bytes, ms_since(t0));
    return Request(std::move(impl), this, phase_);
}

void Communicator::sendrecv(const void* send, size_t send_bytes, int dest, void* recv,
                            size_t recv_bytes, int src, int tag, Stream stream) {
    check_stream(stream);
    check_peer(dest, "sendrecv destination");
    check_peer(src, "sendrecv source");
    IF_CHECK(tag >= 0, "sendrecv: negative tag " << tag);
    IF_CHECK(send != nullptr || send_bytes == 0, "sendrecv: null send buffer");
    IF_CHECK(recv != nullptr || recv_bytes == 0, "sendrecv: null recv buffer");
    const auto t0 = Clock::now();
    do_sendrecv(send, send_bytes, dest, recv, recv_bytes, src, tag, stream);
    count(dest == rank_ ? 0 : send_bytes, src == rank_ ? 0 : recv_bytes, ms_since(t0));
}

void Communicator::set_phase(const std::string& phase) {
    IF_CHECK(valid_phase_name(phase),
             "bad communication phase name '" << phase << "' (non-empty, no control characters)");
    phase_ = phase;
    // Fault injection for the end-to-end fault tests: INFOFLOW_INJECT_FAULT="RANK:PHASE" makes
    // that rank fail as it enters that phase, while the others go on into its collectives;
    // "RANK:PHASE:stop" makes it stop itself with SIGSTOP there instead (a hung rank, for the
    // watchdog tests).
    if (const char* spec = std::getenv("INFOFLOW_INJECT_FAULT")) {
        const std::string s(spec);
        const size_t colon = s.find(':');
        std::string rest = colon == std::string::npos ? "" : s.substr(colon + 1);
        const bool stop = rest.size() > 5 && rest.compare(rest.size() - 5, 5, ":stop") == 0;
        if (stop) rest.resize(rest.size() - 5);
        if (colon != std::string::npos && rest == phase &&
            std::atoi(s.substr(0, colon).c_str()) == rank_) {
            if (stop) {
                std::fflush(stdout);
                std::raise(SIGSTOP);
            } else {
                IF_FAIL("injected fault on rank " << rank_ << " entering phase '" << phase << "'");
            }
        }
    }
    on_set_phase(phase_);
}

std::vector<PhaseStats> Communicator::stats() const {
    std::vector<PhaseStats> out;
    out.reserve(phase_order_.size());
    for (const std::string& name : phase_order_) out.push_back({name, stats_.at(name)});
    return out;
}

CommStats Communicator::stats(const std::string& phase) const {
    auto it = stats_.find(phase);
    return it == stats_.end() ? CommStats{} : it->second;
}

CommStats Communicator::total_stats() const {
    CommStats t;
    for (const auto& kv : stats_) {
        t.bytes_sent += kv.second.bytes_sent;
        t.bytes_recv += kv.second.bytes_recv;
        t.wait_ms += kv.second.wait_ms;
        t.calls += kv.second.calls;
    }
    return t;
}

void Communicator::reset_stats() {
    stats_.clear();
    phase_order_.clear();
}

PhaseScope::PhaseScope(Communicator& comm, const std::string& phase)
    : comm_(comm), previous_(comm.phase()) {
    comm_.set_phase(phase);
}

PhaseScope::~PhaseScope() { comm_.set_phase(previous_); }

// ---- gather_stats --------------------------------------------------------------------------

namespace {

// Record per phase: u64 name length, name bytes, u64 bytes_sent, u64 bytes_recv, f64 wait_ms,
// u64 calls; host byte order (ranks of one job share an architecture).
void put(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }

std::string serialize_stats(const std::vector<PhaseStats>& stats) {
    std::string out;
    for (const PhaseStats& ps : stats) {
        const uint64_t len = ps.phase.size();
        put(out, &len, 8);
        out += ps.phase;
        put(out, &ps.stats.bytes_sent, 8);
        put(out, &ps.stats.bytes_recv, 8);
        put(out, &ps.stats.wait_ms, 8);
        put(out, &ps.stats.calls, 8);
    }
    return out;
}

std::vector<PhaseStats> deserialize_stats(const char* p, size_t n, int rank) {
    std::vector<PhaseStats> out;
    size_t off = 0;
    auto take = [&](void* dst, size_t k) {
        IF_CHECK(off + k <= n, "gather_stats: truncated record from rank " << rank);
        std::memcpy(dst, p + off, k);
        off += k;
    };
    while (off < n) {
        PhaseStats ps;
        uint64_t len = 0;
        take(&len, 8);
        IF_CHECK(len <= n - off, "gather_stats: bad phase name length from rank " << rank);
        ps.phase.assign(p + off, len);
        off += len;
        take(&ps.stats.bytes_sent, 8);
        take(&ps.stats.bytes_recv, 8);
        take(&ps.stats.wait_ms, 8);
        take(&ps.stats.calls, 8);
        out.push_back(std::move(ps));
    }
    return out;
}

}  // namespace

std::vector<PhaseStatsAllRanks> gather_stats(Communicator& comm) {
    const std::string mine = serialize_stats(comm.stats());
    const int p = comm.size();
    PhaseScope scope(comm, "comm_stats");

    uint64_t my_len = mine.size();
    std::vector<uint64_t> lens(p);
    comm.all_gather(&my_len, sizeof my_len, lens.data());
    std::vector<size_t> recv_bytes(p);
    size_t total = 0;
    for (int r = 0; r < p; ++r) {
        recv_bytes[r] = static_cast<size_t>(lens[r]);
        total += recv_bytes[r];
    }
    std::string all(total, '\0');
    comm.all_gather_v(mine.data(), mine.size(), all.data(), recv_bytes);

    std::vector<PhaseStatsAllRanks> out;
    size_t off = 0;
    for (int r = 0; r < p; ++r) {
        for (PhaseStats& ps : deserialize_stats(all.data() + off, recv_bytes[r], r)) {
            auto it = out.begin();
            while (it != out.end() && it->phase != ps.phase) ++it;
            if (it == out.end()) {
                out.push_back({ps.phase, std::vector<CommStats>(p)});
                it = out.end() - 1;
            }
            it->per_rank[r] = ps.stats;
        }
        off += recv_bytes[r];
    }
    return out;
}

// ---- check_same_config ---------------------------------------------------------------------

void check_same_config(Communicator& comm, const std::string& config_hash) {
    // No rank may throw before the all-gather (the others would wait in it), so a hash that does
    // not fit the slot is replaced by its own hash rather than rejected.
    const std::string h =
        config_hash.size() <= k_config_hash_slot ? config_hash : fnv1a64_hex(config_hash);
    std::string slot(k_config_hash_slot, '\0');
    std::memcpy(slot.data(), h.data(), h.size());
    const int p = comm.size();
    std::string all(k_config_hash_slot * p, '\0');
    {
        PhaseScope scope(comm, "startup");
        comm.all_gather(slot.data(), k_config_hash_slot, all.data());
    }

    auto hash_of = [&](int r) {
        const char* s = all.data() + k_config_hash_slot * r;
        return std::string(s, strnlen(s, k_config_hash_slot));
    };
    const std::string ref = hash_of(0);
    std::vector<int> bad;
    for (int r = 1; r < p; ++r) {
        if (hash_of(r) != ref) bad.push_back(r);
    }
    if (bad.empty()) return;
    std::ostringstream os;
    os << "the configuration differs across ranks: rank" << (bad.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < bad.size(); ++i) os << (i ? ", " : "") << bad[i];
    os << " differ" << (bad.size() > 1 ? "" : "s") << " from rank 0 (rank 0 has config hash '"
       << ref << "'";
    const size_t k_listed = 8;
    for (size_t i = 0; i < bad.size() && i < k_listed; ++i) {
        os << ", rank " << bad[i] << " has '" << hash_of(bad[i]) << "'";
    }
    if (bad.size() > k_listed) os << ", ...";
    os << "); start every rank with the same config file and --set options";
    IF_FAIL(os.str());
}

// ---- check_same_model ----------------------------------------------------------------------

void check_same_model(Communicator& comm, const std::string& identity, const std::string& source) {
    // As in check_same_config, nothing may throw before the all-gather.
    const std::string id =
        identity.size() < k_model_identity_slot ? identity : fnv1a64_hex(identity);
    char host[64] = {};
    if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
    const size_t k_host = sizeof host;
    const size_t slot = k_model_identity_slot + k_host + k_model_source_slot;
    std::string mine(slot, '\0');
    std::memcpy(&mine[0], id.data(), id.size());
    std::memcpy(&mine[k_model_identity_slot], host, std::strlen(host));
    // The file as this host resolves it: the same relative path may name different files.
    std::string file = source;
    if (char* real = ::realpath(source.c_str(), nullptr)) {
        file = real;
        std::free(real);
    }
    std::memcpy(&mine[k_model_identity_slot + k_host], file.data(),
                std::min(file.size(), k_model_source_slot - 1));
    const int p = comm.size();
    std::string all(slot * p, '\0');
    {
        PhaseScope scope(comm, "startup");
        comm.all_gather(mine.data(), slot, all.data());
    }
    comm.watchdog().end_startup();

    auto field = [&](int r, size_t off, size_t cap) {
        const char* f = all.data() + slot * r + off;
        return std::string(f, strnlen(f, cap));
    };
    auto describe = [&](int r) {
        return "rank " + std::to_string(r) + " on " + field(r, k_model_identity_slot, k_host) +
               " loaded '" + field(r, k_model_identity_slot + k_host, k_model_source_slot) +
               "' (fingerprint " + field(r, 0, k_model_identity_slot) + ")";
    };
    const std::string ref = field(0, 0, k_model_identity_slot);
    std::vector<int> bad;
    for (int r = 1; r < p; ++r) {
        if (field(r, 0, k_model_identity_slot) != ref) bad.push_back(r);
    }
    if (bad.empty()) return;
    std::ostringstream os;
    os << "the model differs across ranks: " << describe(0);
    const size_t k_listed = 4;
    for (size_t i = 0; i < bad.size() && i < k_listed; ++i) os << "; " << describe(bad[i]);
    if (bad.size() > k_listed) os << "; and " << bad.size() - k_listed << " more ranks";
    os << "; every rank must load the same model file (same weights, shapes and tokenizer)";
    IF_FAIL(os.str());
}

// ---- factory -------------------------------------------------------------------------------

// The one #if on MPI (docs/style.md point 3): what the rest of this section may call.
namespace {
#if defined(INFOFLOW_HAVE_MPI)
constexpr bool k_have_mpi = true;
bool mpi_up() { return MpiEnv::initialized(); }
int mpi_world_rank() { return MpiEnv::world_rank(); }
int mpi_world_size() { return MpiEnv::world_size(); }
[[noreturn]] void mpi_abort(int code) { MpiEnv::abort_world(code); }
std::unique_ptr<CommEnv> mpi_env(int* argc, char*** argv) {
    return std::make_unique<MpiEnv>(argc, argv);
}
std::unique_ptr<Communicator> mpi_communicator(const WatchdogTimeouts& t) {
    return make_mpi_communicator(t);
}
#else
constexpr bool k_have_mpi = false;
bool mpi_up() { return false; }
int mpi_world_rank() { return 0; }
int mpi_world_size() { return 1; }
[[noreturn]] void mpi_abort(int code) { std::_Exit(code); }
std::unique_ptr<CommEnv> mpi_env(int*, char***) { IF_FAIL("MPI is not built"); }
std::unique_ptr<Communicator> mpi_communicator(const WatchdogTimeouts&) {
    IF_FAIL("MPI is not built");
}
#endif

// The one #if on NCCL (docs/style.md point 3).
#if defined(INFOFLOW_HAVE_NCCL)
constexpr bool k_have_nccl = true;
std::unique_ptr<Communicator> nccl_communicator(std::unique_ptr<Communicator> host,
                                                double timeout_s, double startup_timeout_s) {
    return make_nccl_communicator(std::move(host), timeout_s, startup_timeout_s);
}
#else
constexpr bool k_have_nccl = false;
std::unique_ptr<Communicator> nccl_communicator(std::unique_ptr<Communicator>, double, double) {
    IF_FAIL("NCCL is not built");
}
#endif

int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    return (end && *end == '\0' && x >= 0 && x < (1L << 30)) ? static_cast<int>(x) : fallback;
}

void check_kind(const std::string& kind, bool have_mpi = k_have_mpi, bool have_nccl = k_have_nccl) {
    IF_CHECK(kind == "auto" || kind == "mpi" || kind == "self" || kind == "nccl",
             "unknown communicator kind '" << kind << "' (expected auto, mpi, self or nccl)");
    IF_CHECK(kind != "nccl" || have_nccl,
             "communicator 'nccl' is not built in this binary (reconfigure with the CUDA toolkit "
             "and NCCL installed and INFOFLOW_ENABLE_CUDA=ON, INFOFLOW_ENABLE_NCCL=ON)");
    IF_CHECK(kind != "mpi" || have_mpi,
             "communicator 'mpi' is not built in this binary (reconfigure with MPI installed and "
             "INFOFLOW_ENABLE_MPI=ON)");
}

}  // namespace

bool comm_have_mpi() { return k_have_mpi; }

int launcher_world_size() {
    int n = env_int("OMPI_COMM_WORLD_SIZE", 0);
    if (n == 0) n = env_int("PMI_SIZE", 0);
    if (n == 0 && std::getenv("PMIX_RANK")) {
        n = env_int("SLURM_STEP_NUM_TASKS", env_int("SLURM_NTASKS", 1));
    }
    return n;
}

int launcher_world_rank() {
    return env_int("OMPI_COMM_WORLD_RANK", env_int("PMI_RANK", env_int("PMIX_RANK", 0)));
}

std::unique_ptr<CommEnv> init_comm(int* argc, char*** argv, const std::string& kind) {
    check_kind(kind);
    if (kind == "mpi" || (kind == "nccl" && k_have_mpi) ||
        (kind == "auto" && k_have_mpi && launcher_world_size() > 0)) {
        return mpi_env(argc, argv);
    }
    return std::make_unique<CommEnv>();
}

bool comm_have_nccl() { return k_have_nccl; }

std::string comm_choice(const std::string& kind, const std::string& backend, const CommWorld& w,
                        std::string* host_channel) {
    check_kind(kind, w.have_mpi, w.have_nccl);
    if (host_channel) host_channel->clear();
    if (kind == "self") return "self";
    if (kind == "mpi") {
        IF_CHECK(w.mpi_up,
                 "communicator 'mpi': MPI is not initialized (main must hold init_comm())");
        return "mpi";
    }
    // nccl and auto: the host side is MPI when it runs; otherwise one rank, unless a launcher
    // started several (then MPI must be initialized, or each would run alone).
    if (!w.mpi_up) {
        IF_CHECK(w.launcher_size <= 1,
                 "started by a launcher with "
                     << w.launcher_size << " ranks but MPI is not initialized"
                     << (w.have_mpi ? " (main must hold init_comm())"
                                    : " (this binary was built without MPI)"));
    }
    const std::string host = w.mpi_up ? "mpi" : "self";
    const int ranks = std::max(1, w.mpi_up ? w.mpi_size : w.launcher_size);
    if (kind == "nccl" || (backend == "cuda" && w.have_nccl && ranks > 1)) {
        if (host_channel) *host_channel = host;
        return "nccl";
    }
    return host;
}

Link default_link(const Communicator& comm) {
    const bool one_node = comm.local_size() == comm.size();
    LinkKind k = LinkKind::shm;
    if (std::string(comm.kind()) == "nccl") {
        k = one_node ? LinkKind::nvlink : LinkKind::ib;
    } else if (!one_node) {
        k = LinkKind::tcp;
    }
    return Link{k, link_defaults(k)};
}

namespace {

// True when some InfiniBand port of this node is ACTIVE (sysfs: "4: ACTIVE").
bool node_has_active_ib() {
    std::error_code ec;
    const std::filesystem::path root("/sys/class/infiniband");
    if (!std::filesystem::is_directory(root, ec)) return false;
    for (const auto& dev : std::filesystem::directory_iterator(root, ec)) {
        const std::filesystem::path ports = dev.path() / "ports";
        if (!std::filesystem::is_directory(ports, ec)) continue;
        for (const auto& port : std::filesystem::directory_iterator(ports, ec)) {
            std::ifstream f(port.path() / "state");
            std::string state;
            std::getline(f, state);
            if (state.find("ACTIVE") != std::string::npos) return true;
        }
    }
    return false;
}

}  // namespace

Link detect_link(Communicator& comm) {
    Link l = default_link(comm);
    if (l.kind != LinkKind::tcp) return l;
    int32_t ib = node_has_active_ib() ? 1 : 0;
    comm.all_reduce(&ib, 1, DType::i32, ReduceOp::min);
    if (ib) l = Link{LinkKind::ib, link_defaults(LinkKind::ib)};
    return l;
}

std::unique_ptr<Communicator> make_communicator(const std::string& kind,
                                                const CommOptions& options) {
    CommWorld w;
    w.have_mpi = k_have_mpi;
    w.have_nccl = k_have_nccl;
    w.mpi_up = mpi_up();
    w.launcher_size = launcher_world_size();
    w.mpi_size = w.mpi_up ? mpi_world_size() : 0;
    std::string host;
    const std::string choice = comm_choice(kind, options.backend, w, &host);
    const WatchdogTimeouts timeouts{options.timeout_s, options.startup_timeout_s};
    auto self = [&] {
        std::unique_ptr<Communicator> c = make_self_communicator();
        c->watchdog().set_timeouts(timeouts);
        return c;
    };
    std::unique_ptr<Communicator> c;
    if (choice == "self") {
        c = self();
    } else if (choice == "mpi") {
        c = mpi_communicator(timeouts);
    } else {
        c = nccl_communicator(host == "mpi" ? mpi_communicator(timeouts) : self(),
                              options.timeout_s,
                              options.startup_timeout_s);
    }
    c->set_link(default_link(*c));
    return c;
}

[[noreturn]] void abort_job(const std::string& msg, int code) {
    const bool mpi = mpi_up();
    int rank = 0, size = 1;
    if (mpi) {
        rank = mpi_world_rank();
        size = mpi_world_size();
    } else {
        rank = launcher_world_rank();
        size = std::max(1, launcher_world_size());
    }
    std::signal(SIGTERM, SIG_DFL);  // as in MpiComm::abort: no "interrupted" line after this
    std::signal(SIGINT, SIG_DFL);
    std::cout.flush();
    std::fflush(stdout);
    std::fprintf(stderr, "[rank %d/%d] error: %s\n", rank, size, msg.c_str());
    std::fflush(stderr);
    if (mpi) {
        // An error every rank finds at once (a config or model mismatch after an all-gather)
        // reaches abort_job on every rank together, and the first MPI_Abort kills the others,
        // perhaps before rank 0 has printed the line users read first. The other ranks give
        // rank 0 a moment; a job where rank 0 is healthy but stuck still ends, one second later.
        if (rank != 0 && size > 1) std::this_thread::sleep_for(std::chrono::seconds(1));
        mpi_abort(code);
    }
    std::_Exit(code);
}

}  // namespace infoflow
