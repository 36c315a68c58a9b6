// NcclComm: the device Communicator (`parallel.comm = "nccl"`), one GPU per rank, data moved by
// NCCL on the caller's CUDA stream; plus the two pieces of its host-side logic that are plain
// functions so they can be tested without a GPU (the pointer classification and the watchdog's
// decision). This header is plain C++ (no cuda_runtime.h, no nccl.h): the factory
// (comm/communicator.cpp) and the tests name it; it is compiled only when CMake found CUDA and
// NCCL (comm/nccl_comm.cpp).
//
// Bootstrap (docs/formats.md §9.2, §9.3). NcclComm owns a host communicator (MpiComm when MPI runs,
// SelfComm for a 1-rank job without MPI) that is its control channel: construction selects the
// device (node-local rank modulo the visible devices, cudaSetDevice before any other CUDA call
// but the device count), checks on every rank that the job can start (a device on every rank, no
// two ranks of one host on one GPU) and fails on every rank alike if not, broadcasts rank 0's
// ncclUniqueId over the host channel (a 1-rank job makes its own) and starts a non-blocking
// ncclCommInitRankConfig (config.blocking = 0), polled with ncclCommGetAsyncError until it is done
// or parallel.startup_timeout_s has passed: then the communicator is aborted and the job ends
// with "[rank r/P] error: communicator 'nccl': NCCL initialization ... did not complete within
// ..." (the host channel's abort), so a rank that never arrives cannot hang the others in NCCL.
// The communicator stays non-blocking: an NCCL call may return ncclInProgress, and every group
// of calls is settled (state polled back to ncclSuccess, under the watchdog's deadline) before
// the event that marks its completion is recorded.
//
// Which library moves a call's data: the memory rule. Debian's Open MPI is not CUDA-aware
// (docs/formats.md §9.4), so a device pointer never reaches MPI. Each call's non-null buffers are
// classified with classify_pointer() (buffers of zero bytes are not):
//   - all device (or managed) memory: NCCL, on `stream`;
//   - all host memory (pageable or pinned): the host channel (MPI, or copies for one rank),
//     after the host waited for `stream` (nullptr: the legacy default stream), so host buffers
//     written by earlier stream work (an async device-to-host copy) are complete;
//   - host and device mixed: an infoflow::Error naming the call;
//   - no buffer with data (a zero-byte call, barrier): NCCL.
// Every rank must classify a collective alike: pass host buffers for small control data
// (scores, statistics, config hashes) on every rank, and let every rank of a host-buffer
// collective have data in at least one buffer (a rank with nothing to send or receive in an
// all_to_all_v would take the NCCL path; recv buffers of gathers always hold data).
// Bytes, calls and wait time are counted by the Communicator base class whichever path runs
// (the host channel's own statistics are internal and never reported).
//
// Blocking semantics. Stronger than the device contract of comm/communicator.h: every collective
// and sendrecv enqueues its NCCL calls (one group) on `stream`, records an event and returns only
// once that event has completed, so on return its results are visible to later stream work and
// to the host alike. The host waits by polling the event and ncclCommGetAsyncError (the
// watchdog below); wait_ms therefore includes the time for the work enqueued on `stream` before
// the call. isend/irecv are deferred: posting queues the message; the first wait()/test() of
// any pending Request, or the next collective or sendrecv, starts every queued message as one
// NCCL group (so a ring step's isend and irecv cannot deadlock one another) and the Requests
// complete with that group's event. The group runs on the communicator's own point-to-point
// stream, ordered after the work the posting stream had queued when it started, so kernels the
// caller queues afterwards (ring attention on the current block) run while it transfers; wait()
// returns once the group has completed and orders the posting stream after it. Call test() once
// after posting to start the transfer before queueing the work it should overlap. A collective
// waits (on the device) for the last started group, so two NCCL kernels of the communicator never
// depend on running side by side.
// Messages between two ranks match in posting order; tags are checked for range only, and the
// sizes of a matched pair are not checked across ranks (NCCL has no envelope); a message to self
// is a device copy and is checked (size, a partner posted) like SelfComm's.
//
// Watchdog (docs/design.md §11). A device operation that has not completed `timeout_s` seconds
// after it was enqueued ends the job: ncclCommAbort (waited for at most 2 s: it may itself wait for
// the stuck device work), then "[rank r/P] error: NCCL <op> in phase <phase> did not complete
// within N s" and the host channel's abort (MPI_Abort: every rank ends; one rank without MPI:
// _Exit). An asynchronous NCCL error (a peer died, a network failure) or a CUDA error on the op's
// event throws infoflow::Error naming the op and the phase. Destruction: ncclCommDestroy normally,
// ncclCommAbort (bounded the same way) while an exception is unwinding or after a started
// isend/irecv was abandoned (a peer may never join a clean shutdown).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace infoflow {

// ---- pointer classification ----------------------------------------------------------------

enum class PointerSpace { none, host, device };
const char* pointer_space_name(PointerSpace s);

// nullptr -> none. Otherwise cudaPointerGetAttributes: device or managed memory -> device, pinned
// or unregistered host memory -> host. Without a driver or device (cudaErrorInsufficientDriver,
// cudaErrorNoDevice; the error is cleared) no device memory can exist: host. Any other CUDA error
// throws infoflow::Error naming `what`.
PointerSpace classify_pointer(const void* p, const char* what = "pointer");

// The space of a call from its buffers' spaces (none entries ignored): host, device, none when
// every buffer is none; throws infoflow::Error naming `call` when host and device are mixed.
PointerSpace call_space(const char* call, std::initializer_list<PointerSpace> spaces);

// ---- watchdog ------------------------------------------------------------------------------

// One poll of an enqueued operation: its completion event and the communicator's async error.
struct WatchdogPoll {
    bool complete = false;  // the event has completed
    bool failed = false;    // an asynchronous NCCL error (or a CUDA error on the event)
    std::string error;      // its text when failed
};

enum class WatchdogVerdict { complete, failed, timed_out, poll_again };

// The decision after one poll, `elapsed_s` seconds after the operation was enqueued. A failure
// wins over completion (the data cannot be trusted), completion over the deadline (an operation
// that completed is never aborted), and the deadline is reached at elapsed_s >= timeout_s.
WatchdogVerdict watchdog_verdict(const WatchdogPoll& poll, double elapsed_s, double timeout_s);

// The message the job ends with when the deadline passes (without the "[rank r/P] error: "
// prefix that Communicator::abort adds), e.g. "NCCL all_gather in phase recompute did not
// complete within 600 s".
std::string watchdog_timeout_message(const std::string& op, const std::string& phase,
                                     double timeout_s);
// The same for an NCCL initialization still in progress after parallel.startup_timeout_s.
std::string nccl_init_timeout_message(double startup_timeout_s, double waited_s);

// The host wait: polls until the verdict is not poll_again, sleeping between polls (a short
// spin first, then sleeps of up to 100 µs). `now_s` is a monotonic clock in seconds and `sleep`
// is given the seconds to pause (tests pass a fake clock). Returns the verdict and, through
// `last`, the final poll.
WatchdogVerdict watchdog_wait(const std::function<WatchdogPoll()>& poll, double timeout_s,
                              const std::function<double()>& now_s,
                              const std::function<void(double)>& sleep, WatchdogPoll* last);

// ---- the communicator -----------------------------------------------------------------------

// Collective over `host` (every rank of the host channel becomes a rank of the NCCL
// communicator, same rank numbers). `host` must be a host communicator. timeout_s > 0 is the
// watchdog deadline of one device operation, startup_timeout_s > 0 that of NCCL's
// initialization. Throws infoflow::Error (on every rank alike) when a rank has no CUDA device or
// two ranks of one host would share a GPU.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                     double timeout_s,
                                                     double startup_timeout_s = 300.0);

// Number of visible CUDA devices; 0 when there is none or no driver (the reason in `why`).
int nccl_visible_devices(std::string* why = nullptr);

}  // namespace infoflow
