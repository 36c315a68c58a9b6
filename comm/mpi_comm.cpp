// MpiComm: every Communicator op as one MPI call on a private duplicate of the base
// communicator, data as MPI_BYTE (reductions as their MPI type), host buffers only. Counts and
// displacements are MPI ints: a call whose sizes do not fit is refused with an error naming them
// (the largest exchange, a layer's selected K/V, is far below 2 GiB). Every return code is
// checked (IF_MPI_CHECK); the duplicate has MPI_ERRORS_RETURN so errors reach us as codes.
#include "comm/mpi_comm.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "comm/mpi_env.h"
#include "runtime/core/error.h"

namespace infoflow {

namespace detail {

std::string mpi_error_string(int code) {
    char buf[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS || len <= 0) {
        return "MPI error " + std::to_string(code);
    }
    return std::string(buf, len);
}

void throw_mpi_error(const char* file, int line, const char* call, int code) {
    std::ostringstream os;
    os << "MPI call failed: " << mpi_error_string(code);
    throw_error(file, line, call, os.str());
}

}  // namespace detail

namespace {

int to_int(size_t v, const char* what) {
    IF_CHECK(v <= static_cast<size_t>(INT_MAX),
             what << " of " << v << " bytes exceeds the MPI count limit (" << INT_MAX << ")");
    return static_cast<int>(v);
}

// Counts and prefix-sum displacements of a *_v call, as MPI ints.
void counts_displs(const std::vector<size_t>& bytes, const char* what, std::vector<int>& counts,
                   std::vector<int>& displs) {
    counts.resize(bytes.size());
    displs.resize(bytes.size());
    size_t off = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
        counts[i] = to_int(bytes[i], what);
        displs[i] = to_int(off, what);
        off += bytes[i];
    }
    to_int(off, what);
}

MPI_Datatype mpi_type(DType t) {
    switch (t) {
        case DType::f32:
            return MPI_FLOAT;
        case DType::f64:
            return MPI_DOUBLE;
        case DType::i32:
            return MPI_INT32_T;
        case DType::i64:
            return MPI_INT64_T;
    }
    IF_FAIL("unknown DType " << static_cast<int>(t));
}

MPI_Op mpi_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum:
            return MPI_SUM;
        case ReduceOp::max:
            return MPI_MAX;
        case ReduceOp::min:
            return MPI_MIN;
    }
    IF_FAIL("unknown ReduceOp " << static_cast<int>(op));
}

bool mpi_finalized() {
    int fin = 0;
    MPI_Finalized(&fin);
    return fin != 0;
}

// One isend/irecv, completed under the watchdog. A receive checks on completion that the
// message had the posted size.
class MpiRequest : public RequestImpl {
  public:
    MpiRequest(MPI_Request req, bool is_recv, size_t bytes, int peer, int tag, Watchdog* watchdog,
               std::string phase)
        : req_(req),
          is_recv_(is_recv),
          bytes_(bytes),
          peer_(peer),
          tag_(tag),
          watchdog_(watchdog),
          phase_(std::move(phase)) {}

    void wait() override {
        const std::string op =
            std::string(is_recv_ ? "wait irecv from rank " : "wait isend to rank ") +
            std::to_string(peer_);
        watchdog_->wait([this] { return test(); }, phase_, op, false);
    }
    bool test() override {
        int flag = 0;
        MPI_Status st;
        check(MPI_Test(&req_, &flag, &st), st);
        return flag != 0;
    }
    void abandon() noexcept override {
        if (req_ == MPI_REQUEST_NULL || mpi_finalized()) return;
        if (is_recv_) {
            MPI_Cancel(&req_);
            MPI_Wait(&req_, MPI_STATUS_IGNORE);  // a cancelled receive completes locally
        } else {
            MPI_Request_free(&req_);
        }
    }

  private:
    void check(int rc, const MPI_Status& st) const {
        if (rc != MPI_SUCCESS) {
            IF_FAIL((is_recv_ ? "irecv from" : "isend to")
                    << " rank " << peer_ << " (tag " << tag_ << ", " << bytes_
                    << " bytes) failed: " << detail::mpi_error_string(rc));
        }
        if (!is_recv_ || req_ != MPI_REQUEST_NULL) return;  // a send, or not complete yet
        int got = 0;
        IF_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &got));
        IF_CHECK(static_cast<size_t>(got) == bytes_,
                 "irecv from rank " << peer_ << " (tag " << tag_ << ") posted " << bytes_
                                    << " bytes but the message has " << got);
    }

    MPI_Request req_;
    bool is_recv_;
    size_t bytes_;
    int peer_;
    int tag_;
    Watchdog* watchdog_;
    std::string phase_;
};

// The watchdog's side channel: a question is the asker's collective count (8 bytes, tag 1), an
// answer a fixed-size WireAnswer (tag 2). Sends are non-blocking; their buffers live in
// `pending_` until they complete (or, on the way to MPI_Abort, forever).
constexpr int k_tag_question = 1;
constexpr int k_tag_answer = 2;

struct WireAnswer {
    uint64_t collectives = 0;
    uint64_t waiting = 0;
    char phase[64] = {};
    char op[64] = {};
};

void copy_field(char* dst, size_t cap, const std::string& s) {
    const size_t n = std::min(s.size(), cap - 1);
    std::memcpy(dst, s.data(), n);
    dst[n] = '\0';
}

class MpiWatchdogChannel final : public WatchdogChannel {
  public:
    explicit MpiWatchdogChannel(MPI_Comm comm) : comm_(comm) {
        IF_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
        IF_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    }
    ~MpiWatchdogChannel() override {
        if (mpi_finalized()) return;
        for (auto& p : pending_) {
            if (p->req != MPI_REQUEST_NULL) MPI_Request_free(&p->req);
        }
        if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    }
    MpiWatchdogChannel(const MpiWatchdogChannel&) = delete;
    MpiWatchdogChannel& operator=(const MpiWatchdogChannel&) = delete;

    void serve(const WatchdogPosition& here) override {
        prune();
        for (;;) {
            int flag = 0;
            MPI_Status st;
            IF_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, k_tag_question, comm_, &flag, &st));
            if (!flag) return;
            uint64_t question = 0;
            IF_MPI_CHECK(MPI_Recv(&question, sizeof question, MPI_BYTE, st.MPI_SOURCE,
                                  k_tag_question, comm_, MPI_STATUS_IGNORE));
            auto p = std::make_unique<Pending>();
            p->answer.collectives = here.collectives;
            p->answer.waiting = here.waiting ? 1 : 0;
            copy_field(p->answer.phase, sizeof p->answer.phase, here.phase);
            copy_field(p->answer.op, sizeof p->answer.op, here.op);
            IF_MPI_CHECK(MPI_Isend(&p->answer, sizeof p->answer, MPI_BYTE, st.MPI_SOURCE,
                                   k_tag_answer, comm_, &p->req));
            pending_.push_back(std::move(p));
        }
    }

    std::vector<std::optional<WatchdogPosition>> survey(const WatchdogPosition& here,
                                                        double grace_s) override {
        std::vector<std::optional<WatchdogPosition>> out(size_);
        std::vector<WireAnswer> in(size_);
        std::vector<MPI_Request> recv(size_, MPI_REQUEST_NULL);
        question_ = here.collectives;
        for (int q = 0; q < size_; ++q) {
            if (q == rank_) continue;
            IF_MPI_CHECK(
                MPI_Irecv(&in[q], sizeof in[q], MPI_BYTE, q, k_tag_answer, comm_, &recv[q]));
            auto p = std::make_unique<Pending>();
            IF_MPI_CHECK(MPI_Isend(&question_, sizeof question_, MPI_BYTE, q, k_tag_question, comm_,
                                   &p->req));
            pending_.push_back(std::move(p));
        }
        const auto t0 = std::chrono::steady_clock::now();
        for (;;) {
            bool all = true;
            for (int q = 0; q < size_; ++q) {
                if (recv[q] == MPI_REQUEST_NULL) continue;
                int flag = 0;
                IF_MPI_CHECK(MPI_Test(&recv[q], &flag, MPI_STATUS_IGNORE));
                if (!flag) {
                    all = false;
                    continue;
                }
                in[q].phase[sizeof in[q].phase - 1] = '\0';
                in[q].op[sizeof in[q].op - 1] = '\0';
                out[q] =
                    WatchdogPosition{in[q].collectives, in[q].phase, in[q].op, in[q].waiting != 0};
            }
            serve(here);
            const double waited =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (all || waited > grace_s) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        for (MPI_Request& r : recv) {
            if (r == MPI_REQUEST_NULL) continue;
            MPI_Cancel(&r);
            MPI_Wait(&r, MPI_STATUS_IGNORE);  // a cancelled receive completes locally
        }
        return out;
    }

  private:
    struct Pending {
        WireAnswer answer;
        MPI_Request req = MPI_REQUEST_NULL;
    };
    void prune() {
        for (size_t i = 0; i < pending_.size();) {
            int flag = 0;
            IF_MPI_CHECK(MPI_Test(&pending_[i]->req, &flag, MPI_STATUS_IGNORE));
            if (flag) {
                pending_[i] = std::move(pending_.back());
                pending_.pop_back();
            } else {
                ++i;
            }
        }
    }

    MPI_Comm comm_;
    int rank_ = 0;
    int size_ = 1;
    uint64_t question_ = 0;
    std::vector<std::unique_ptr<Pending>> pending_;
};

}  // namespace

std::unique_ptr<WatchdogChannel> make_mpi_watchdog_channel(MPI_Comm comm) {
    return std::make_unique<MpiWatchdogChannel>(comm);
}

struct MpiComm::Setup {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm watchdog = MPI_COMM_NULL;
    int rank = 0, size = 1, local_rank = 0, local_size = 1;
};

MpiComm::Setup MpiComm::setup(MPI_Comm base, const WatchdogTimeouts& timeouts) {
    IF_CHECK(MpiEnv::initialized(), "MpiComm: MPI is not initialized (hold an MpiEnv)");
    Setup s;
    IF_MPI_CHECK(MPI_Comm_rank(base, &s.rank));
    IF_MPI_CHECK(MPI_Comm_size(base, &s.size));
    // No side channel exists yet, so a rank missing here cannot be named.
    Watchdog wd(s.rank, s.size, timeouts);
    wd.set_on_expired([](const std::string& msg) { abort_job(msg); });
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    IF_MPI_CHECK(MPI_Comm_idup(base, &s.comm, &req[0]));
    IF_MPI_CHECK(MPI_Comm_idup(base, &s.watchdog, &req[1]));
    wd.wait(
        [&] {
            int flag = 0;
            IF_MPI_CHECK(MPI_Testall(2, req, &flag, MPI_STATUSES_IGNORE));
            return flag != 0;
        },
        "startup", "communicator set-up", true);
    IF_MPI_CHECK(MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN));
    IF_MPI_CHECK(MPI_Comm_set_errhandler(s.watchdog, MPI_ERRORS_RETURN));
    IF_MPI_CHECK(MPI_Comm_rank(s.comm, &s.rank));
    IF_MPI_CHECK(MPI_Comm_size(s.comm, &s.size));
    MPI_Comm node = MPI_COMM_NULL;
    IF_MPI_CHECK(MPI_Comm_split_type(s.comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    IF_MPI_CHECK(MPI_Comm_rank(node, &s.local_rank));
    IF_MPI_CHECK(MPI_Comm_size(node, &s.local_size));
    IF_MPI_CHECK(MPI_Comm_free(&node));
    return s;
}

MpiComm::MpiComm(MPI_Comm base, const WatchdogTimeouts& timeouts)
    : MpiComm(setup(base, timeouts), timeouts) {}

MpiComm::MpiComm(const Setup& s, const WatchdogTimeouts& timeouts)
    : Communicator(s.rank, s.size, s.local_rank, s.local_size),
      comm_(s.comm),
      channel_(make_mpi_watchdog_channel(s.watchdog)) {
    watchdog().set_timeouts(timeouts);
    watchdog().set_channel(channel_.get());
    watchdog().set_on_expired([this](const std::string& msg) { abort(1, msg); });
    void* ub = nullptr;
    int flag = 0;
    IF_MPI_CHECK(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag));
    if (flag && ub) tag_ub_ = *static_cast<int*>(ub);
}

MpiComm::~MpiComm() {
    watchdog().set_channel(nullptr);
    channel_.reset();
    if (comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
}

void MpiComm::wait_collective(MPI_Request* req, const char* op) {
    watchdog().wait(
        [req] {
            int flag = 0;
            IF_MPI_CHECK(MPI_Test(req, &flag, MPI_STATUS_IGNORE));
            return flag != 0;
        },
        phase(), op, true);
}

void MpiComm::abort(int code, const std::string& msg) {
    // The launcher ends the other processes with SIGTERM; this one is ending anyway, so its
    // interrupt handler (if any) must not add an "interrupted" line to the error.
    std::signal(SIGTERM, SIG_DFL);
    std::signal(SIGINT, SIG_DFL);
    std::fflush(stdout);
    std::fprintf(stderr, "[rank %d/%d] error: %s\n", rank(), size(), msg.c_str());
    std::fflush(stderr);
    MpiEnv::arm_abort_deadline(code);  // MPI_Abort may block over a dead link (see there)
    MPI_Abort(comm_, code);
    std::_Exit(code);
}

void MpiComm::do_barrier(Stream) {
    MPI_Request req = MPI_REQUEST_NULL;
    IF_MPI_CHECK(MPI_Ibarrier(comm_, &req));
    wait_collective(&req, "barrier");
}

void MpiComm::do_broadcast(void* buf, size_t bytes, int root, Stream) {
    MPI_Request req = MPI_REQUEST_NULL;
    IF_MPI_CHECK(MPI_Ibcast(buf, to_int(bytes, "broadcast"), MPI_BYTE, root, comm_, &req));
    wait_collective(&req, "broadcast");
}

void MpiComm::do_all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream) {
    const int n = to_int(count, "all_reduce element count");
    MPI_Request req = MPI_REQUEST_NULL;
    IF_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, n, mpi_type(dtype), mpi_op(op), comm_, &req));
    wait_collective(&req, "all_reduce");
}

void MpiComm::do_all_gather(const void* send, size_t bytes_per_rank, void* recv, Stream) {
    const int n = to_int(bytes_per_rank, "all_gather block");
    to_int(bytes_per_rank * size(), "all_gather result");
    const bool in_place = send == static_cast<const char*>(recv) + bytes_per_rank * rank();
    MPI_Request req = MPI_REQUEST_NULL;
    IF_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, MPI_BYTE, recv, n, MPI_BYTE,
                                comm_, &req));
    wait_collective(&req, "all_gather");
}

void MpiComm::do_all_gather_v(const void* send, size_t send_bytes, void* recv,
                              const std::vector<size_t>& recv_bytes, Stream) {
    std::vector<int> counts, displs;
    counts_displs(recv_bytes, "all_gather_v", counts, displs);
    const bool in_place = send == static_cast<const char*>(recv) + displs[rank()];
    MPI_Request req = MPI_REQUEST_NULL;
    IF_MPI_CHECK(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, counts[rank()], MPI_BYTE, recv,
                                 counts.data(), displs.data(), MPI_BYTE, comm_, &req));
    wait_collective(&req, "all_gather_v");
    (void)send_bytes;  // == recv_bytes[rank()], checked by Communicator::all_gather_v
}

void MpiComm::do_all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                              const std::vector<size_t>& recv_bytes, Stream) {
    std::vector<int> scounts, sdispls, rcounts, rdispls;
    counts_displs(send_bytes, "all_to_all_v send", scounts, sdispls);
    counts_displs(recv_bytes, "all_to_all_v recv", rcounts, rdispls);
    MPI_Request req = MPI_REQUEST_NULL;
    IF_MPI_CHECK(MPI_Ialltoallv(send, scounts.data(), sdispls.data(), MPI_BYTE, recv,
                                rcounts.data(), rdispls.data(), MPI_BYTE, comm_, &req));
    wait_collective(&req, "all_to_all_v");
}

std::unique_ptr<RequestImpl> MpiComm::do_isend(const void* buf, size_t bytes, int dest, int tag,
                                               Stream) {
    IF_CHECK(tag <= tag_ub_, "isend: tag " << tag << " above MPI_TAG_UB " << tag_ub_);
    MPI_Request req = MPI_REQUEST_NULL;
    IF_MPI_CHECK(MPI_Isend(buf, to_int(bytes, "isend"), MPI_BYTE, dest, tag, comm_, &req));
    return std::make_unique<MpiRequest>(req, false, bytes, dest, tag, &watchdog(), phase());
}

std::unique_ptr<RequestImpl> MpiComm::do_irecv(void* buf, size_t bytes, int src, int tag, Stream) {
    IF_CHECK(tag <= tag_ub_, "irecv: tag " << tag << " above MPI_TAG_UB " << tag_ub_);
    MPI_Request req = MPI_REQUEST_NULL;
    IF_MPI_CHECK(MPI_Irecv(buf, to_int(bytes, "irecv"), MPI_BYTE, src, tag, comm_, &req));
    return std::make_unique<MpiRequest>(req, true, bytes, src, tag, &watchdog(), phase());
}

void MpiComm::do_sendrecv(const void* send, size_t send_bytes, int dest, void* recv,
                          size_t recv_bytes, int src, int tag, Stream stream) {
    IF_CHECK(tag <= tag_ub_, "sendrecv: tag " << tag << " above MPI_TAG_UB " << tag_ub_);
    // A receive and a send posted together and completed under the watchdog: the blocking
    // MPI_Sendrecv, with a deadline.
    std::unique_ptr<RequestImpl> r = do_irecv(recv, recv_bytes, src, tag, stream);
    std::unique_ptr<RequestImpl> s;
    try {
        s = do_isend(send, send_bytes, dest, tag, stream);
        r->wait();
        s->wait();
    } catch (...) {
        r->abandon();
        if (s) s->abandon();
        throw;
    }
}

std::unique_ptr<Communicator> make_mpi_communicator(const WatchdogTimeouts& timeouts) {
    return std::make_unique<MpiComm>(MPI_COMM_WORLD, timeouts);
}

}  // namespace infoflow
