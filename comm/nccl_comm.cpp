// NcclComm: every Communicator op as NCCL calls (one group per op) on the caller's stream,
// completed under the watchdog; host-buffer calls through the owned host channel; the bootstrap
// of docs/formats.md §9.2-9.3. The rules (memory, blocking, deferred point-to-point, watchdog) are in
// comm/nccl_comm.h. Every CUDA and NCCL return code is checked (IF_CUDA_CHECK, IF_NCCL_CHECK:
// file:line, the call and the library's error string).
#include "comm/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iomanip>
#include <sstream>
#include <thread>
#include <vector>

#include "runtime/core/error.h"

namespace infoflow {

namespace detail {

[[noreturn]] void throw_cuda_error(const char* file, int line, const char* call, cudaError_t rc) {
    std::ostringstream os;
    os << "CUDA call failed: " << cudaGetErrorName(rc) << ": " << cudaGetErrorString(rc);
    cudaGetLastError();  // clear a non-sticky error so later calls do not report it again
    throw_error(file, line, call, os.str());
}

[[noreturn]] void throw_nccl_error(const char* file, int line, const char* call, ncclResult_t rc) {
    std::ostringstream os;
    os << "NCCL call failed: " << ncclGetErrorString(rc);
    const char* last = ncclGetLastError(nullptr);
    if (last && *last) os << " (" << last << ")";
    throw_error(file, line, call, os.str());
}

}  // namespace detail

}  // namespace infoflow

#define IF_CUDA_CHECK(call)                                                               \
    do {                                                                                  \
        const cudaError_t if_cuda_rc_ = (call);                                           \
        if (if_cuda_rc_ != cudaSuccess) {                                                 \
            ::infoflow::detail::throw_cuda_error(__FILE__, __LINE__, #call, if_cuda_rc_); \
        }                                                                                 \
    } while (0)

#define IF_NCCL_CHECK(call)                                                               \
    do {                                                                                  \
        const ncclResult_t if_nccl_rc_ = (call);                                          \
        if (if_nccl_rc_ != ncclSuccess) {                                                 \
            ::infoflow::detail::throw_nccl_error(__FILE__, __LINE__, #call, if_nccl_rc_); \
        }                                                                                 \
    } while (0)

// A call on the non-blocking communicator: ncclInProgress is not an error (the caller settles
// the communicator before the next NCCL call or the event that marks completion).
#define IF_NCCL_ENQUEUE(call)                                                             \
    do {                                                                                  \
        const ncclResult_t if_nccl_rc_ = (call);                                          \
        if (if_nccl_rc_ != ncclSuccess && if_nccl_rc_ != ncclInProgress) {                \
            ::infoflow::detail::throw_nccl_error(__FILE__, __LINE__, #call, if_nccl_rc_); \
        }                                                                                 \
    } while (0)

namespace infoflow {

// ---- pointer classification ----------------------------------------------------------------

const char* pointer_space_name(PointerSpace s) {
    switch (s) {
        case PointerSpace::none:
            return "none";
        case PointerSpace::host:
            return "host";
        case PointerSpace::device:
            return "device";
    }
    return "?";
}

PointerSpace classify_pointer(const void* p, const char* what) {
    if (p == nullptr) return PointerSpace::none;
    cudaPointerAttributes a{};
    const cudaError_t rc = cudaPointerGetAttributes(&a, p);
    if (rc == cudaErrorInsufficientDriver || rc == cudaErrorNoDevice) {
        cudaGetLastError();
        return PointerSpace::host;  // no device, so no device memory
    }
    if (rc != cudaSuccess) {
        cudaGetLastError();
        IF_FAIL("cannot tell whether " << what << " " << p << " is host or device memory: "
                                       << cudaGetErrorName(rc) << ": " << cudaGetErrorString(rc));
    }
    switch (a.type) {
        case cudaMemoryTypeDevice:
        case cudaMemoryTypeManaged:
            return PointerSpace::device;
        case cudaMemoryTypeHost:
        case cudaMemoryTypeUnregistered:
            return PointerSpace::host;
    }
    IF_FAIL("unknown CUDA memory type " << static_cast<int>(a.type) << " of " << what << " " << p);
}

PointerSpace call_space(const char* call, std::initializer_list<PointerSpace> spaces) {
    bool host = false, device = false;
    for (PointerSpace s : spaces) {
        host = host || s == PointerSpace::host;
        device = device || s == PointerSpace::device;
    }
    IF_CHECK(!(host && device), "NCCL communicator: " << call
                                                      << " was given host and device buffers "
                                                         "together; pass all host or all device "
                                                         "buffers");
    return host ? PointerSpace::host : device ? PointerSpace::device : PointerSpace::none;
}

// ---- watchdog ------------------------------------------------------------------------------

WatchdogVerdict watchdog_verdict(const WatchdogPoll& poll, double elapsed_s, double timeout_s) {
    if (poll.failed) return WatchdogVerdict::failed;
    if (poll.complete) return WatchdogVerdict::complete;
    if (elapsed_s >= timeout_s) return WatchdogVerdict::timed_out;
    return WatchdogVerdict::poll_again;
}

std::string watchdog_timeout_message(const std::string& op, const std::string& phase,
                                     double timeout_s) {
    std::ostringstream os;
    os << "NCCL " << op << " in phase " << phase << " did not complete within " << timeout_s
       << " s";
    return os.str();
}

std::string nccl_init_timeout_message(double startup_timeout_s, double waited_s) {
    std::ostringstream os;
    os << "communicator 'nccl': NCCL initialization (ncclCommInitRankConfig) did not complete "
          "within parallel.startup_timeout_s = "
       << startup_timeout_s << " s (waited " << std::fixed << std::setprecision(1) << waited_s
       << " s): a rank did not arrive or NCCL's bootstrap could not connect";
    return os.str();
}

WatchdogVerdict watchdog_wait(const std::function<WatchdogPoll()>& poll, double timeout_s,
                              const std::function<double()>& now_s,
                              const std::function<void(double)>& sleep, WatchdogPoll* last) {
    const double t0 = now_s();
    // Spin briefly (a collective often completes within microseconds of its enqueue), then
    // back off to sleeps of up to 100 µs so a long wait does not hold a core.
    const int k_spin = 64;
    double pause = 1e-6;
    for (int i = 0;; ++i) {
        WatchdogPoll p = poll();
        const WatchdogVerdict v = watchdog_verdict(p, now_s() - t0, timeout_s);
        if (v != WatchdogVerdict::poll_again) {
            if (last) *last = std::move(p);
            return v;
        }
        if (i >= k_spin) {
            sleep(pause);
            pause = std::min(pause * 2, 1e-4);
        }
    }
}

// ---- CUDA/NCCL handles -----------------------------------------------------------------------

int nccl_visible_devices(std::string* why) {
    int n = 0;
    const cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        if (why) *why = std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
        cudaGetLastError();
        return 0;
    }
    if (n <= 0 && why) *why = "cudaGetDeviceCount returned 0";
    return n > 0 ? n : 0;
}

namespace {

using Clock = std::chrono::steady_clock;

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// ncclCommAbort, waiting for it at most max_s seconds. On an error path the job must end even
// when the abort itself stalls (it may wait for device work that never finishes); the process
// ends right after, so a call still running is left behind (then: ncclInProgress).
constexpr double k_abort_wait_s = 2.0;
// ncclCommFinalize of a communicator whose operations have all completed has nothing to wait for;
// past this it is aborted instead.
constexpr double k_finalize_wait_s = 10.0;

ncclResult_t abort_bounded(ncclComm_t comm, double max_s) {
    struct State {
        std::atomic<bool> done{false};
        ncclResult_t rc = ncclSuccess;
    };
    auto st = std::make_shared<State>();
    try {
        std::thread([comm, st] {
            st->rc = ncclCommAbort(comm);
            st->done = true;
        }).detach();
    } catch (const std::exception&) {  // no thread: abort in this one
        return ncclCommAbort(comm);
    }
    const double t0 = now_s();
    while (!st->done && now_s() - t0 < max_s) sleep_s(1e-3);
    return st->done ? st->rc : ncclInProgress;
}

// A CUDA event for completion only (no timing). Move-only.
class CudaEvent {
  public:
    CudaEvent() { IF_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
    ~CudaEvent() {
        if (e_) cudaEventDestroy(e_);
    }
    CudaEvent(CudaEvent&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
    CudaEvent& operator=(CudaEvent&&) = delete;
    CudaEvent(const CudaEvent&) = delete;
    CudaEvent& operator=(const CudaEvent&) = delete;
    cudaEvent_t get() const { return e_; }

  private:
    cudaEvent_t e_ = nullptr;
};

// A non-blocking CUDA stream on the current device. Not copyable.
class CudaStream {
  public:
    CudaStream() { IF_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    ~CudaStream() {
        if (s_) cudaStreamDestroy(s_);
    }
    CudaStream(const CudaStream&) = delete;
    CudaStream& operator=(const CudaStream&) = delete;
    cudaStream_t get() const { return s_; }

  private:
    cudaStream_t s_ = nullptr;
};

// One poll of the non-blocking communicator's state: complete once it is ncclSuccess (the
// initialization, or the enqueue of the calls before, is done), failed on an error.
WatchdogPoll poll_state(ncclComm_t comm) {
    WatchdogPoll p;
    ncclResult_t st = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &st);
    if (rc != ncclSuccess) {
        p.failed = true;
        p.error = std::string("ncclCommGetAsyncError failed: ") + ncclGetErrorString(rc);
    } else if (st == ncclSuccess) {
        p.complete = true;
    } else if (st != ncclInProgress) {
        p.failed = true;
        const char* last = ncclGetLastError(comm);
        p.error = std::string(ncclGetErrorString(st)) +
                  (last && *last ? std::string(" (") + last + ")" : std::string());
    }
    return p;
}

// A device allocation. Move-only.
class DeviceBuffer {
  public:
    explicit DeviceBuffer(size_t bytes) { IF_CUDA_CHECK(cudaMalloc(&p_, bytes)); }
    ~DeviceBuffer() {
        if (p_) cudaFree(p_);
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    void* get() const { return p_; }

  private:
    void* p_ = nullptr;
};

ncclDataType_t nccl_type(DType t) {
    switch (t) {
        case DType::f32:
            return ncclFloat32;
        case DType::f64:
            return ncclFloat64;
        case DType::i32:
            return ncclInt32;
        case DType::i64:
            return ncclInt64;
    }
    IF_FAIL("unknown DType " << static_cast<int>(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum:
            return ncclSum;
        case ReduceOp::max:
            return ncclMax;
        case ReduceOp::min:
            return ncclMin;
    }
    IF_FAIL("unknown ReduceOp " << static_cast<int>(op));
}

cudaStream_t cuda_stream(Stream s) { return static_cast<cudaStream_t>(s); }

const char* at(const void* base, size_t off) { return static_cast<const char*>(base) + off; }
char* at(void* base, size_t off) { return static_cast<char*>(base) + off; }

size_t total(const std::vector<size_t>& bytes) {
    size_t t = 0;
    for (size_t b : bytes) t += b;
    return t;
}

// A buffer of zero bytes takes part in no transfer and is not classified: its pointer may be
// null or one past the end of an allocation (an empty in-place block), which CUDA does not
// know as device memory.
PointerSpace buffer_space(const void* p, size_t bytes, const char* what) {
    return bytes == 0 ? PointerSpace::none : classify_pointer(p, what);
}

std::vector<size_t> offsets(const std::vector<size_t>& bytes) {
    std::vector<size_t> off(bytes.size(), 0);
    for (size_t i = 1; i < bytes.size(); ++i) off[i] = off[i - 1] + bytes[i - 1];
    return off;
}

// One rank's start-up record, all-gathered over the host channel before NCCL starts so that a
// rank that cannot start fails every rank alike instead of leaving them in ncclCommInitRank.
struct BootRecord {
    char host[64];
    char bus[32];
    char problem[160];
};

void copy_str(char* dst, size_t cap, const std::string& s) {
    std::memset(dst, 0, cap);
    std::memcpy(dst, s.data(), std::min(s.size(), cap - 1));
}

// A started group of deferred isend/irecv: the Requests of the group share its event.
struct P2pGroup {
    CudaEvent event;                // on the communicator's p2p stream
    cudaStream_t caller = nullptr;  // the stream the messages were posted on
    bool started = false;
    bool broken = false;  // the group failed to start (its messages were dropped)
    double t0 = 0.0;
    std::string ops;  // for messages: "isend to rank 1, irecv from rank 3"
};

// A queued isend/irecv not started yet.
struct P2pPending {
    uint64_t id = 0;
    bool is_send = false;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t bytes = 0;
    int peer = 0;
    int tag = 0;
    cudaStream_t stream = nullptr;
};

class NcclComm;

class NcclRequest : public RequestImpl {
  public:
    NcclRequest(NcclComm* comm, std::shared_ptr<P2pGroup> group, uint64_t id)
        : comm_(comm), group_(std::move(group)), id_(id) {}
    void wait() override;
    bool test() override;
    void abandon() noexcept override;

  private:
    NcclComm* comm_;
    std::shared_ptr<P2pGroup> group_;
    uint64_t id_;
};

// A host-channel Request seen through the NCCL communicator's Request.
class HostRequest : public RequestImpl {
  public:
    explicit HostRequest(Request r) : r_(std::move(r)) {}
    void wait() override { r_.wait(); }
    bool test() override { return r_.test(); }
    void abandon() noexcept override { r_ = Request(); }

  private:
    Request r_;
};

class NcclComm final : public Communicator {
  public:
    struct Boot {
        int device = 0;
        ncclComm_t comm = nullptr;
    };

    NcclComm(std::unique_ptr<Communicator> host, double timeout_s, double startup_timeout_s)
        : NcclComm(boot(*host, timeout_s, startup_timeout_s), std::move(host), timeout_s) {}

    ~NcclComm() override {
        if (!comm_) return;
        cudaSetDevice(device_);
        pending_.clear();
        // A peer may never join a clean shutdown while an exception unwinds, and an abandoned
        // started group may never complete: abort then. Otherwise finalize (non-blocking: polled
        // for at most k_finalize_wait_s, then aborted) and destroy.
        bool error_path = std::uncaught_exceptions() > uncaught_at_init_ || dirty_;
        const char* what = "ncclCommAbort";
        ncclResult_t rc = ncclSuccess;
        if (!error_path) {
            what = "ncclCommFinalize";
            rc = ncclCommFinalize(comm_);
            if (rc == ncclSuccess || rc == ncclInProgress) {
                WatchdogPoll last;
                const WatchdogVerdict v = watchdog_wait([&] { return poll_state(comm_); },
                                                        k_finalize_wait_s, now_s, sleep_s, &last);
                rc = v == WatchdogVerdict::complete ? ncclSuccess : ncclInternalError;
            }
            if (rc == ncclSuccess) {
                what = "ncclCommDestroy";
                rc = ncclCommDestroy(comm_);
            } else {
                error_path = true;
            }
        }
        if (error_path) {
            const ncclResult_t arc = abort_bounded(comm_, k_abort_wait_s);
            if (rc == ncclSuccess) rc = arc;
        }
        if (rc != ncclSuccess) {
            std::fprintf(stderr, "warning: %s failed: %s\n", what,
                         rc == ncclInProgress ? "still running" : ncclGetErrorString(rc));
        }
        comm_ = nullptr;
    }

    const char* kind() const override { return "nccl"; }
    MemorySpace memory_space() const override { return MemorySpace::device; }

    [[noreturn]] void abort(int code, const std::string& msg) override {
        if (comm_) {
            abort_bounded(comm_, k_abort_wait_s);
            comm_ = nullptr;
        }
        host_->abort(code, msg);
        std::_Exit(code);  // not reached: the host channel's abort ends the process
    }

    // Starts every queued isend/irecv as one group (see the header).
    void flush_p2p();
    // Enqueues one group of messages (flush_p2p's work).
    void start_group(const std::vector<P2pPending>& msgs, P2pGroup& g);
    // Removes a queued message (an abandoned Request); a started one is left to complete.
    void forget(uint64_t id) noexcept;
    // Polls `event` under the watchdog; throws on failure, ends the job at the deadline.
    void wait_event(cudaEvent_t event, const std::string& op, double t0);
    // One poll (for Request::test), with the deadline counted from t0.
    bool test_event(cudaEvent_t event, const std::string& op, double t0);
    void mark_dirty() noexcept { dirty_ = true; }

  protected:
    void do_barrier(Stream stream) override {
        run_device("barrier", stream, [&](cudaStream_t s) {
            IF_NCCL_ENQUEUE(
                ncclAllReduce(scratch_.get(), scratch_.get(), 1, ncclInt32, ncclSum, comm_, s));
        });
    }

    void do_broadcast(void* buf, size_t bytes, int root, Stream stream) override {
        if (space("broadcast", {buffer_space(buf, bytes, "broadcast buffer")}) ==
            PointerSpace::host) {
            sync_stream("broadcast", stream);
            host_->broadcast(buf, bytes, root);
            return;
        }
        run_device("broadcast", stream, [&](cudaStream_t s) {
            if (bytes == 0) return;
            IF_NCCL_ENQUEUE(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, s));
        });
    }

    void do_all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream) override {
        if (space("all_reduce", {buffer_space(buf, count, "all_reduce buffer")}) ==
            PointerSpace::host) {
            sync_stream("all_reduce", stream);
            host_->all_reduce(buf, count, dtype, op);
            return;
        }
        run_device("all_reduce", stream, [&](cudaStream_t s) {
            if (count == 0) return;
            IF_NCCL_ENQUEUE(
                ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), comm_, s));
        });
    }

    void do_all_gather(const void* send, size_t bytes_per_rank, void* recv,
                       Stream stream) override {
        if (space("all_gather", {buffer_space(send, bytes_per_rank, "all_gather send buffer"),
                                 buffer_space(recv, bytes_per_rank, "all_gather recv buffer")}) ==
            PointerSpace::host) {
            sync_stream("all_gather", stream);
            host_->all_gather(send, bytes_per_rank, recv);
            return;
        }
        run_device("all_gather", stream, [&](cudaStream_t s) {
            if (bytes_per_rank == 0) return;
            IF_NCCL_ENQUEUE(ncclAllGather(send, recv, bytes_per_rank, ncclUint8, comm_, s));
        });
    }

    void do_all_gather_v(const void* send, size_t send_bytes, void* recv,
                         const std::vector<size_t>& recv_bytes, Stream stream) override {
        if (space("all_gather_v",
                  {buffer_space(send, send_bytes, "all_gather_v send buffer"),
                   buffer_space(recv, total(recv_bytes), "all_gather_v recv buffer")}) ==
            PointerSpace::host) {
            sync_stream("all_gather_v", stream);
            host_->all_gather_v(send, send_bytes, recv, recv_bytes);
            return;
        }
        // One broadcast per rank with data, grouped; recv_bytes is identical on every rank, so
        // every rank skips the same empty blocks.
        const std::vector<size_t> off = offsets(recv_bytes);
        run_device("all_gather_v", stream, [&](cudaStream_t s) {
            IF_NCCL_ENQUEUE(ncclGroupStart());
            for (int q = 0; q < size(); ++q) {
                if (recv_bytes[q] == 0) continue;
                const void* src = q == rank() ? send : at(recv, off[q]);
                IF_NCCL_ENQUEUE(
                    ncclBroadcast(src, at(recv, off[q]), recv_bytes[q], ncclUint8, q, comm_, s));
            }
            IF_NCCL_ENQUEUE(ncclGroupEnd());
        });
    }

    void do_all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                         const std::vector<size_t>& recv_bytes, Stream stream) override {
        if (space("all_to_all_v",
                  {buffer_space(send, total(send_bytes), "all_to_all_v send buffer"),
                   buffer_space(recv, total(recv_bytes), "all_to_all_v recv buffer")}) ==
            PointerSpace::host) {
            sync_stream("all_to_all_v", stream);
            host_->all_to_all_v(send, send_bytes, recv, recv_bytes);
            return;
        }
        const std::vector<size_t> soff = offsets(send_bytes), roff = offsets(recv_bytes);
        run_device("all_to_all_v", stream, [&](cudaStream_t s) {
            const int r = rank();
            if (send_bytes[r] > 0) {  // the diagonal block is a local copy
                IF_CUDA_CHECK(cudaMemcpyAsync(at(recv, roff[r]), at(send, soff[r]), send_bytes[r],
                                              cudaMemcpyDeviceToDevice, s));
            }
            IF_NCCL_ENQUEUE(ncclGroupStart());
            for (int q = 0; q < size(); ++q) {
                if (q == r) continue;
                if (send_bytes[q] > 0) {
                    IF_NCCL_ENQUEUE(
                        ncclSend(at(send, soff[q]), send_bytes[q], ncclUint8, q, comm_, s));
                }
                if (recv_bytes[q] > 0) {
                    IF_NCCL_ENQUEUE(
                        ncclRecv(at(recv, roff[q]), recv_bytes[q], ncclUint8, q, comm_, s));
                }
            }
            IF_NCCL_ENQUEUE(ncclGroupEnd());
        });
    }

    std::unique_ptr<RequestImpl> do_isend(const void* buf, size_t bytes, int dest, int tag,
                                          Stream stream) override {
        if (space("isend", {buffer_space(buf, bytes, "isend buffer")}) == PointerSpace::host) {
            sync_stream("isend", stream);
            return std::make_unique<HostRequest>(host_->isend(buf, bytes, dest, tag));
        }
        return post(true, buf, nullptr, bytes, dest, tag, stream);
    }

    std::unique_ptr<RequestImpl> do_irecv(void* buf, size_t bytes, int src, int tag,
                                          Stream stream) override {
        if (space("irecv", {buffer_space(buf, bytes, "irecv buffer")}) == PointerSpace::host) {
            sync_stream("irecv", stream);
            return std::make_unique<HostRequest>(host_->irecv(buf, bytes, src, tag));
        }
        return post(false, nullptr, buf, bytes, src, tag, stream);
    }

    void do_sendrecv(const void* send, size_t send_bytes, int dest, void* recv, size_t recv_bytes,
                     int src, int tag, Stream stream) override {
        if (space("sendrecv", {buffer_space(send, send_bytes, "sendrecv send buffer"),
                               buffer_space(recv, recv_bytes, "sendrecv recv buffer")}) ==
            PointerSpace::host) {
            sync_stream("sendrecv", stream);
            host_->sendrecv(send, send_bytes, dest, recv, recv_bytes, src, tag);
            return;
        }
        const int r = rank();
        IF_CHECK((dest == r) == (src == r),
                 "sendrecv: a message to self (rank "
                     << r << ") is received only by a receive from self; this call sends to rank "
                     << dest << " and receives from rank " << src << ", so it would deadlock");
        IF_CHECK(dest != r || send_bytes == recv_bytes,
                 "sendrecv from rank " << r << " (tag " << tag << ") expected " << recv_bytes
                                       << " bytes but the message has " << send_bytes);
        run_device("sendrecv", stream, [&](cudaStream_t s) {
            if (dest == r) {
                if (send_bytes > 0 && send != recv) {
                    IF_CUDA_CHECK(
                        cudaMemcpyAsync(recv, send, send_bytes, cudaMemcpyDeviceToDevice, s));
                }
                return;
            }
            IF_NCCL_ENQUEUE(ncclGroupStart());
            if (send_bytes > 0)
                IF_NCCL_ENQUEUE(ncclSend(send, send_bytes, ncclUint8, dest, comm_, s));
            if (recv_bytes > 0)
                IF_NCCL_ENQUEUE(ncclRecv(recv, recv_bytes, ncclUint8, src, comm_, s));
            IF_NCCL_ENQUEUE(ncclGroupEnd());
        });
    }

  private:
    NcclComm(Boot b, std::unique_ptr<Communicator>&& host, double timeout_s)
        : Communicator(host->rank(), host->size(), host->local_rank(), host->local_size()),
          host_(std::move(host)),
          timeout_s_(timeout_s),
          device_(b.device),
          comm_(b.comm),
          uncaught_at_init_(std::uncaught_exceptions()),
          scratch_(sizeof(int32_t)) {
        IF_CUDA_CHECK(cudaMemset(scratch_.get(), 0, sizeof(int32_t)));
    }

    static Boot boot(Communicator& host, double timeout_s, double startup_timeout_s);

    // After NCCL calls on the non-blocking communicator: polls until their enqueue is done (the
    // state leaves ncclInProgress), so the event recorded next follows the NCCL work. Throws on
    // an NCCL error; ends the job when the deadline (from t0) passes.
    void settle(const std::string& op, double t0) {
        WatchdogPoll last;
        const WatchdogVerdict v = watchdog_wait([&] { return poll_state(comm_); },
                                                timeout_s_ - (now_s() - t0), now_s, sleep_s, &last);
        if (v == WatchdogVerdict::complete) return;
        if (v == WatchdogVerdict::failed) {
            IF_FAIL("NCCL " << op << " in phase " << phase() << " failed: " << last.error);
        }
        abort(1, watchdog_timeout_message(op, phase(), timeout_s_));
    }

    PointerSpace space(const char* call, std::initializer_list<PointerSpace> spaces) const {
        return call_space(call, spaces);
    }

    // Before a host-buffer call: the work already enqueued on `stream` (which may write the
    // host buffers) completes first.
    void sync_stream(const char* op, Stream stream) {
        flush_p2p();
        const double t0 = now_s();
        IF_CUDA_CHECK(cudaEventRecord(event_.get(), cuda_stream(stream)));
        wait_event(event_.get(), std::string(op) + " (the stream before its host buffers)", t0);
    }

    template <class F>
    void run_device(const char* op, Stream stream, F enqueue) {
        flush_p2p();
        const cudaStream_t s = cuda_stream(stream);
        // After the last point-to-point group on every rank alike: two NCCL kernels of one
        // communicator on two streams are not guaranteed to make progress side by side.
        if (last_group_ && last_group_->started) {
            IF_CUDA_CHECK(cudaStreamWaitEvent(s, last_group_->event.get(), 0));
        }
        const double t0 = now_s();
        enqueue(s);
        settle(op, t0);
        IF_CUDA_CHECK(cudaEventRecord(event_.get(), s));
        wait_event(event_.get(), op, t0);
    }

    std::unique_ptr<RequestImpl> post(bool is_send, const void* send, void* recv, size_t bytes,
                                      int peer, int tag, Stream stream) {
        const cudaStream_t s = cuda_stream(stream);
        if (!pending_.empty() && pending_.front().stream != s) flush_p2p();
        if (!open_) open_ = std::make_shared<P2pGroup>();
        P2pPending m;
        m.id = ++next_id_;
        m.is_send = is_send;
        m.send = send;
        m.recv = recv;
        m.bytes = bytes;
        m.peer = peer;
        m.tag = tag;
        m.stream = s;
        pending_.push_back(m);
        open_->ops += std::string(open_->ops.empty() ? "" : ", ") +
                      (is_send ? "isend to rank " : "irecv from rank ") + std::to_string(peer);
        return std::make_unique<NcclRequest>(this, open_, m.id);
    }

    std::unique_ptr<Communicator> host_;
    double timeout_s_;
    int device_;
    ncclComm_t comm_;
    int uncaught_at_init_;
    bool dirty_ = false;
    DeviceBuffer scratch_;  // the barrier's one int32
    CudaEvent event_;       // completion of the current blocking op
    // Point-to-point groups run on their own stream, after the work the caller's stream had
    // queued when the group started (p2p_ready_), so they overlap what the caller queues next
    // (ring attention's block exchange and its attention, docs/design.md §5.4).
    CudaStream p2p_stream_;
    CudaEvent p2p_ready_;
    std::vector<P2pPending> pending_;
    std::shared_ptr<P2pGroup> open_;  // the group the queued messages will start as
    std::shared_ptr<P2pGroup> last_group_;  // the group started last
    uint64_t next_id_ = 0;
};

NcclComm::Boot NcclComm::boot(Communicator& host, double timeout_s, double startup_timeout_s) {
    IF_CHECK(host.memory_space() == MemorySpace::host,
             "the NCCL communicator's control channel must be a host communicator, not '"
                 << host.kind() << "'");
    IF_CHECK(std::isfinite(timeout_s) && timeout_s > 0,
             "NCCL communicator: timeout " << timeout_s << " s must be > 0");
    IF_CHECK(std::isfinite(startup_timeout_s) && startup_timeout_s > 0,
             "NCCL communicator: start-up timeout " << startup_timeout_s << " s must be > 0");
    Boot b;
    std::string why, problem, bus;
    const int n = nccl_visible_devices(&why);
    if (n == 0) {
        problem = "no CUDA device visible (" + why + ")";
    } else {
        b.device = n == 1 ? 0 : host.local_rank() % n;
        char id[32] = {0};
        cudaError_t rc = cudaSetDevice(b.device);
        if (rc == cudaSuccess) rc = cudaDeviceGetPCIBusId(id, sizeof id, b.device);
        if (rc != cudaSuccess) {
            problem = "cannot use CUDA device " + std::to_string(b.device) + " (" +
                      cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc) + ")";
            cudaGetLastError();
        }
        bus = id;
    }
    char hostname[64] = {0};
    gethostname(hostname, sizeof hostname - 1);

    const int p = host.size();
    BootRecord mine;
    copy_str(mine.host, sizeof mine.host, hostname);
    copy_str(mine.bus, sizeof mine.bus, bus);
    copy_str(mine.problem, sizeof mine.problem, problem);
    std::vector<BootRecord> all(p);
    host.all_gather(&mine, sizeof mine, all.data());
    for (int r = 0; r < p; ++r) {
        IF_CHECK(all[r].problem[0] == '\0', "communicator 'nccl': rank " << r << " on host "
                                                                         << all[r].host << ": "
                                                                         << all[r].problem);
    }
    for (int r = 0; r < p; ++r) {
        for (int q = 0; q < r; ++q) {
            IF_CHECK(std::strcmp(all[q].host, all[r].host) != 0 ||
                         std::strcmp(all[q].bus, all[r].bus) != 0,
                     "communicator 'nccl': ranks "
                         << q << " and " << r << " on host " << all[r].host
                         << " would share the GPU at PCI " << all[r].bus
                         << " (one GPU per rank: start at most as many ranks per host as it has "
                            "visible GPUs)");
        }
    }

    // Rank 0's unique id travels with a flag, so a failed ncclGetUniqueId fails every rank.
    struct {
        int32_t ok;
        ncclUniqueId id;
    } msg{};
    std::string id_error;
    if (host.rank() == 0) {
        const ncclResult_t rc = ncclGetUniqueId(&msg.id);
        msg.ok = rc == ncclSuccess ? 1 : 0;
        if (rc != ncclSuccess) id_error = ncclGetErrorString(rc);
    }
    host.broadcast(&msg, sizeof msg, 0);
    IF_CHECK(msg.ok == 1, "communicator 'nccl': ncclGetUniqueId failed on rank 0"
                              << (id_error.empty() ? "" : ": " + id_error));
    // Non-blocking initialization, polled against the start-up deadline: a rank that never
    // arrives (or a bootstrap that cannot connect) ends the job instead of hanging in it.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const double t0 = now_s();
    const ncclResult_t rc = ncclCommInitRankConfig(&b.comm, p, msg.id, host.rank(), &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
        if (b.comm) abort_bounded(b.comm, k_abort_wait_s);
        detail::throw_nccl_error(__FILE__, __LINE__, "ncclCommInitRankConfig", rc);
    }
    WatchdogPoll last;
    const WatchdogVerdict v =
        watchdog_wait([&] { return poll_state(b.comm); }, startup_timeout_s, now_s, sleep_s, &last);
    if (v == WatchdogVerdict::complete) return b;
    abort_bounded(b.comm, k_abort_wait_s);
    if (v == WatchdogVerdict::failed) {
        IF_FAIL("communicator 'nccl': NCCL initialization failed on rank " << host.rank() << ": "
                                                                           << last.error);
    }
    host.abort(1, nccl_init_timeout_message(startup_timeout_s, now_s() - t0));
    std::_Exit(1);  // not reached: the host channel's abort ends the process
}

void NcclComm::flush_p2p() {
    if (pending_.empty()) return;
    std::vector<P2pPending> msgs;
    msgs.swap(pending_);
    std::shared_ptr<P2pGroup> group = std::move(open_);
    open_.reset();
    try {
        start_group(msgs, *group);
    } catch (...) {
        group->broken = true;
        throw;
    }
    last_group_ = std::move(group);
}

void NcclComm::start_group(const std::vector<P2pPending>& msgs, P2pGroup& g) {
    const int r = rank();
    // Messages to self pair up by tag in posting order and become device copies; one without a
    // partner in this group could never complete.
    std::vector<std::pair<const P2pPending*, const P2pPending*>> self_pairs;
    std::vector<bool> used(msgs.size(), false);
    for (size_t i = 0; i < msgs.size(); ++i) {
        if (msgs[i].peer != r || used[i]) continue;
        size_t j = i + 1;
        while (j < msgs.size() &&
               (used[j] || msgs[j].peer != r || msgs[j].is_send == msgs[i].is_send ||
                msgs[j].tag != msgs[i].tag)) {
            ++j;
        }
        IF_CHECK(j < msgs.size(),
                 "NCCL communicator: " << (msgs[i].is_send ? "send to" : "receive from") << " rank "
                                       << r << " with tag " << msgs[i].tag << " has no matching "
                                       << (msgs[i].is_send ? "receive" : "send")
                                       << " posted before the transfer started; it would deadlock");
        used[i] = used[j] = true;
        const P2pPending* s = msgs[i].is_send ? &msgs[i] : &msgs[j];
        const P2pPending* v = msgs[i].is_send ? &msgs[j] : &msgs[i];
        IF_CHECK(s->bytes == v->bytes, "irecv from rank "
                                           << r << " (tag " << v->tag << ") posted " << v->bytes
                                           << " bytes but the message has " << s->bytes);
        self_pairs.push_back({s, v});
    }
    // The group runs on the communicator's own stream once the caller's stream has done what it
    // had queued (the send buffers are written, the receive buffers free).
    const cudaStream_t s = p2p_stream_.get();
    g.t0 = now_s();
    IF_CUDA_CHECK(cudaEventRecord(p2p_ready_.get(), msgs.front().stream));
    IF_CUDA_CHECK(cudaStreamWaitEvent(s, p2p_ready_.get(), 0));
    for (const auto& pr : self_pairs) {
        if (pr.first->bytes > 0) {
            IF_CUDA_CHECK(cudaMemcpyAsync(pr.second->recv, pr.first->send, pr.first->bytes,
                                          cudaMemcpyDeviceToDevice, s));
        }
    }
    IF_NCCL_ENQUEUE(ncclGroupStart());
    for (const P2pPending& m : msgs) {
        if (m.peer == r || m.bytes == 0) continue;
        if (m.is_send) {
            IF_NCCL_ENQUEUE(ncclSend(m.send, m.bytes, ncclUint8, m.peer, comm_, s));
        } else {
            IF_NCCL_ENQUEUE(ncclRecv(m.recv, m.bytes, ncclUint8, m.peer, comm_, s));
        }
    }
    IF_NCCL_ENQUEUE(ncclGroupEnd());
    settle(g.ops, g.t0);
    IF_CUDA_CHECK(cudaEventRecord(g.event.get(), s));
    g.caller = msgs.front().stream;
    g.started = true;
}

void NcclComm::forget(uint64_t id) noexcept {
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if (it->id == id) {
            pending_.erase(it);
            if (pending_.empty()) open_.reset();
            return;
        }
    }
}

WatchdogPoll poll_once(cudaEvent_t event, ncclComm_t comm) {
    WatchdogPoll p;
    const cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) {
        p.complete = true;
    } else if (q != cudaErrorNotReady) {
        p.failed = true;
        p.error = std::string("CUDA error ") + cudaGetErrorName(q) + ": " + cudaGetErrorString(q);
        cudaGetLastError();
        return p;
    }
    ncclResult_t st = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &st);
    if (rc != ncclSuccess) {
        p.failed = true;
        p.error = std::string("ncclCommGetAsyncError failed: ") + ncclGetErrorString(rc);
    } else if (st != ncclSuccess && st != ncclInProgress) {
        p.failed = true;
        const char* last = ncclGetLastError(comm);
        p.error = std::string("NCCL asynchronous error: ") + ncclGetErrorString(st) +
                  (last && *last ? std::string(" (") + last + ")" : std::string());
    }
    return p;
}

void NcclComm::wait_event(cudaEvent_t event, const std::string& op, double t0) {
    WatchdogPoll last;
    const double spent = now_s() - t0;  // the deadline counts from the enqueue
    const WatchdogVerdict v = watchdog_wait([&] { return poll_once(event, comm_); },
                                            timeout_s_ - spent, now_s, sleep_s, &last);
    switch (v) {
        case WatchdogVerdict::complete:
            return;
        case WatchdogVerdict::failed:
            IF_FAIL("NCCL " << op << " in phase " << phase() << " failed: " << last.error);
        case WatchdogVerdict::timed_out:
        case WatchdogVerdict::poll_again:
            break;
    }
    abort(1, watchdog_timeout_message(op, phase(), timeout_s_));
}

bool NcclComm::test_event(cudaEvent_t event, const std::string& op, double t0) {
    const WatchdogPoll p = poll_once(event, comm_);
    switch (watchdog_verdict(p, now_s() - t0, timeout_s_)) {
        case WatchdogVerdict::complete:
            return true;
        case WatchdogVerdict::failed:
            IF_FAIL("NCCL " << op << " in phase " << phase() << " failed: " << p.error);
        case WatchdogVerdict::timed_out:
            abort(1, watchdog_timeout_message(op, phase(), timeout_s_));
        case WatchdogVerdict::poll_again:
            break;
    }
    return false;
}

void NcclRequest::wait() {
    if (!group_->started) comm_->flush_p2p();
    IF_CHECK(!group_->broken, "NCCL communicator: " << group_->ops << " never started");
    comm_->wait_event(group_->event.get(), group_->ops, group_->t0);
    // The host saw the group complete; the caller's stream is ordered after it as well.
    IF_CUDA_CHECK(cudaStreamWaitEvent(group_->caller, group_->event.get(), 0));
}

bool NcclRequest::test() {
    if (!group_->started) comm_->flush_p2p();
    IF_CHECK(!group_->broken, "NCCL communicator: " << group_->ops << " never started");
    return comm_->test_event(group_->event.get(), group_->ops, group_->t0);
}

void NcclRequest::abandon() noexcept {
    if (group_->started) {
        comm_->mark_dirty();  // cannot be cancelled; the communicator is aborted at the end
    } else {
        comm_->forget(id_);
    }
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                     double timeout_s, double startup_timeout_s) {
    IF_CHECK(host != nullptr, "make_nccl_communicator: no host communicator");
    return std::make_unique<NcclComm>(std::move(host), timeout_s, startup_timeout_s);
}

}  // namespace infoflow
