// MpiComm: the Communicator over an MPI communicator (host buffers only: Debian's Open MPI is not
// CUDA-aware, docs/formats.md §9.4), and IF_MPI_CHECK, which turns a failed MPI call into an
// infoflow::Error with file:line, the call and MPI's error string. This header includes mpi.h:
// only comm/*.cpp may include it (docs/style.md point 2); everything else uses comm/communicator.h.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/watchdog.h"

namespace infoflow {

namespace detail {
// MPI_Error_string of `code` ("MPI error N" when MPI cannot describe it).
std::string mpi_error_string(int code);
[[noreturn]] void throw_mpi_error(const char* file, int line, const char* call, int code);
}  // namespace detail

// Checks the return code of an MPI call. Communicators used here have MPI_ERRORS_RETURN, so
// errors come back as codes instead of aborting inside the library.
#define IF_MPI_CHECK(call)                                                              \
    do {                                                                                \
        const int if_mpi_rc_ = (call);                                                  \
        if (if_mpi_rc_ != MPI_SUCCESS) {                                                \
            ::infoflow::detail::throw_mpi_error(__FILE__, __LINE__, #call, if_mpi_rc_); \
        }                                                                               \
    } while (0)

// The watchdog's side channel over MPI (comm/watchdog.h): questions and answers are small
// point-to-point messages on `comm`, which the channel owns (frees it) and which must carry no
// other traffic. Also the side channel of a device communicator over its bootstrap MPI
// communicator. `comm` must have MPI_ERRORS_RETURN.
std::unique_ptr<WatchdogChannel> make_mpi_watchdog_channel(MPI_Comm comm);

// Every op is posted non-blocking (MPI_Ibarrier, MPI_Iallgather, ..., MPI_Isend/MPI_Irecv) and
// completed by polling MPI_Test under the watchdog (comm/watchdog.h): a peer that does not
// arrive within the deadline ends the job with a message naming it, instead of a hang.
class MpiComm final : public Communicator {
  public:
    // Collective over `base`: duplicates it twice with MPI_Comm_idup (data, and the watchdog's
    // side channel; waited for at most timeouts.startup_timeout_s), so this communicator's
    // traffic cannot match other libraries' messages; sets MPI_ERRORS_RETURN on the duplicates,
    // and finds the node-local rank with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). MPI must be
    // initialized.
    explicit MpiComm(MPI_Comm base = MPI_COMM_WORLD, const WatchdogTimeouts& timeouts = {});
    // Frees the duplicate (unless MPI is already finalized).
    ~MpiComm() override;

    const char* kind() const override { return "mpi"; }
    MemorySpace memory_space() const override { return MemorySpace::host; }
    // "[rank r/P] error: msg" to stderr, then MPI_Abort on this communicator.
    [[noreturn]] void abort(int code, const std::string& msg) override;

    MPI_Comm handle() const { return comm_; }

  protected:
    void do_barrier(Stream stream) override;
    void do_broadcast(void* buf, size_t bytes, int root, Stream stream) override;
    void do_all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream) override;
    void do_all_gather(const void* send, size_t bytes_per_rank, void* recv, Stream stream) override;
    void do_all_gather_v(const void* send, size_t send_bytes, void* recv,
                         const std::vector<size_t>& recv_bytes, Stream stream) override;
    void do_all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                         const std::vector<size_t>& recv_bytes, Stream stream) override;
    std::unique_ptr<RequestImpl> do_isend(const void* buf, size_t bytes, int dest, int tag,
                                          Stream stream) override;
    std::unique_ptr<RequestImpl> do_irecv(void* buf, size_t bytes, int src, int tag,
                                          Stream stream) override;
    void do_sendrecv(const void* send, size_t send_bytes, int dest, void* recv, size_t recv_bytes,
                     int src, int tag, Stream stream) override;

  private:
    struct Setup;
    static Setup setup(MPI_Comm base, const WatchdogTimeouts& timeouts);
    MpiComm(const Setup& s, const WatchdogTimeouts& timeouts);
    // Completes a posted collective under the watchdog.
    void wait_collective(MPI_Request* req, const char* op);
    int tag_ub_ = 32767;  // largest tag MPI allows (MPI_TAG_UB, at least 32767)
    MPI_Comm comm_ = MPI_COMM_NULL;
    std::unique_ptr<WatchdogChannel> channel_;
};

}  // namespace infoflow
