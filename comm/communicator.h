// The communicator: a small abstract interface with coarse ops (docs/style.md point 4) over which
// the sequence-parallel phases (docs/design.md §5.2) and ring attention (§5.4) move data, plus the
// byte and wait-time accounting of §5.5 and the fault helpers of §11. Implementations: `SelfComm`
// (one rank, no library; comm/self_comm.cpp), `MpiComm` (comm/mpi_comm.h) and `NcclComm`
// (comm/nccl_comm.h). This header
// is plain C++: it never includes mpi.h or nccl.h, and nothing here is a template.
//
// Memory and streams. Every data-moving call takes buffers in the communicator's
// `memory_space()` and an opaque `Stream` (a cudaStream_t for a device communicator):
//   - host communicators (self, mpi): host pointers; `stream` must be nullptr; a call returns
//     when it is complete (for isend/irecv: when the Request completes).
//   - device communicators (nccl): device pointers; the op is enqueued on `stream` and
//     completes in stream order; the host must synchronize the stream before reading results.
//     Wait time is then the host time spent enqueuing. NcclComm is stricter (every op returns
//     complete) and also takes host buffers for control data: comm/nccl_comm.h.
// Ordering. Collectives are called by every rank of the communicator, in the same order, with
// matching arguments (bytes, root, dtype, op; the size vectors of the *_v calls agree
// pairwise). Point-to-point messages between two ranks with the same tag match in posting order.
// One thread at a time calls a communicator (MPI is initialized FUNNELED).
// Ownership. The caller owns every buffer. Blocking calls use them only during the call; a
// buffer given to isend/irecv must stay valid (and, for isend, unmodified) until its Request
// has completed. Send and receive buffers must not overlap except where a call says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_model.h"
#include "comm/watchdog.h"

namespace infoflow {

// Element type of all_reduce.
enum class DType { f32, f64, i32, i64 };
// Reduction of all_reduce, elementwise.
enum class ReduceOp { sum, max, min };
// Where a communicator's buffers live.
enum class MemorySpace { host, device };
// Opaque stream handle (cudaStream_t for a device communicator; nullptr for host ones).
using Stream = void*;

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* reduce_op_name(ReduceOp op);

// Communication counted for one phase on one rank (docs/design.md §5.5). Bytes are *logical
// payload*, not what the library's algorithm puts on the wire; data a rank keeps for itself (its
// own block of an all-gather, its diagonal block of an all-to-all, a message to itself) is never
// counted. For rank r of P ranks:
//   barrier                        sent 0                       recv 0
//   broadcast(B bytes, root)       root: B·(P−1), others 0      root: 0, others B
//   all_gather(B per rank)         B·(P−1)                      B·(P−1)
//   all_gather_v(s, R[])           s·(P−1)                      Σ_{q≠r} R[q]
//   all_to_all_v(S[], R[])         Σ_{q≠r} S[q]                 Σ_{q≠r} R[q]
//   all_reduce(n elements of e bytes, B = n·e): counted as a reduce-scatter + all-gather in
//   which rank r owns chunk c_r = e·(n/P + (r < n%P ? 1 : 0)) bytes (integer division):
//                                  B + (P−2)·c_r                B + (P−2)·c_r
//     (= 2·B·(P−1)/P when P divides n: the ring all-reduce volume, nccl-tests "busbw" factor;
//     0 when P = 1)
//   isend(B, dest) / irecv(B, src) B if dest ≠ r, else 0        B if src ≠ r, else 0
//   sendrecv                       the isend and irecv rows together
// `calls` counts calls (isend and irecv one each, wait/test none). `wait_ms` is the wall time
// spent inside the calls (transfer and waiting for peers alike), for a Request: its post plus
// every wait()/test() on it; a Request charges the phase current when it was posted.
struct CommStats {
    uint64_t bytes_sent = 0;
    uint64_t bytes_recv = 0;
    double wait_ms = 0.0;
    uint64_t calls = 0;
};

struct PhaseStats {
    std::string phase;
    CommStats stats;
};

// One phase's stats on every rank: per_rank[r] is rank r's (zero where rank r never used it).
struct PhaseStatsAllRanks {
    std::string phase;
    std::vector<CommStats> per_rank;
};

class Communicator;

// Implementation side of a Request (one per library); callers use Request only.
class RequestImpl {
  public:
    virtual ~RequestImpl() = default;
    // Blocks until the operation has completed; throws infoflow::Error on failure.
    virtual void wait() = 0;
    // Non-blocking: true once the operation has completed; throws on failure.
    virtual bool test() = 0;
    // Called by ~Request for a request that never completed (error paths): cancel or release
    // without blocking. Must not throw.
    virtual void abandon() noexcept = 0;
};

// A pending isend/irecv. Move-only. A default-constructed or completed Request is done;
// wait() and test() on it return at once. The Communicator that posted it must outlive it.
// Destroying a pending Request abandons it (a receive is cancelled, a send is released and its
// buffer must stay valid until the job ends) and prints a warning unless an exception is
// unwinding: normal code waits for every request.
class Request {
  public:
    Request() = default;
    Request(std::unique_ptr<RequestImpl> impl, Communicator* owner, std::string phase);
    ~Request();
    Request(Request&& o) noexcept;
    Request& operator=(Request&& o) noexcept;
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;

    // Blocks until complete. For an irecv, throws if the message's size differs from the
    // posted size. After a throw the request is done (it must not be waited again).
    void wait();
    // True when complete (then the buffer may be reused). Never blocks.
    bool test();
    bool done() const { return impl_ == nullptr; }

  private:
    void release() noexcept;
    std::unique_ptr<RequestImpl> impl_;
    Communicator* owner_ = nullptr;
    std::string phase_;
};

// Waits for every request in order (the first error is thrown after all were waited).
void wait_all(std::vector<Request>& requests);

class Communicator {
  public:
    virtual ~Communicator() = default;
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }
    // Rank among the ranks on this node (GPU selection, docs/formats.md §9.2) and their count.
    int local_rank() const { return local_rank_; }
    int local_size() const { return local_size_; }
    // "self" | "mpi" | "nccl".
    virtual const char* kind() const = 0;
    // The link the ranks talk over, for cost models (runtime/parallel/recompute_balance.h): set
    // by make_communicator from what it knows without messages (one node or several), refined
    // by detect_link at start-up; the same on every rank.
    const Link& link() const { return link_; }
    void set_link(const Link& l) { link_ = l; }
    virtual MemorySpace memory_space() const = 0;

    // Returns on a rank once every rank has entered.
    void barrier(Stream stream = nullptr);

    // buf [bytes]: root's bytes are copied into every other rank's buf. root in [0, P).
    void broadcast(void* buf, size_t bytes, int root, Stream stream = nullptr);

    // buf [count] of `dtype`, in place: every rank ends with the elementwise reduction of all
    // ranks' buf. Sums of floating-point values may differ in the last bits from a sequential
    // sum, but every rank gets the same bits.
    void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream = nullptr);

    // send [bytes_per_rank] -> recv [P, bytes_per_rank]: recv block q is rank q's send.
    // In place: send == recv + rank·bytes_per_rank.
    void all_gather(const void* send, size_t bytes_per_rank, void* recv, Stream stream = nullptr);

    // send [send_bytes] -> recv [Σ recv_bytes]: rank q's send lands at offset
    // Σ_{j<q} recv_bytes[j]. recv_bytes has P entries, identical on every rank, and
    // recv_bytes[rank] == send_bytes; entries may be 0. In place: send == recv + own offset.
    void all_gather_v(const void* send, size_t send_bytes, void* recv,
                      const std::vector<size_t>& recv_bytes, Stream stream = nullptr);

    // send: P blocks, block q ([send_bytes[q]], at offset Σ_{j<q} send_bytes[j]) goes to rank q;
    // recv: P blocks, block q ([recv_bytes[q]]) comes from rank q. recv_bytes[q] on this rank
    // equals send_bytes[rank] on rank q; entries may be 0. No overlap of send and recv.
    void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                      const std::vector<size_t>& recv_bytes, Stream stream = nullptr);

    // Non-blocking point-to-point. The matching irecv must post exactly `bytes`. tag >= 0.
    // Posting returns at once; the buffer is in use until the Request completes.
    Request isend(const void* buf, size_t bytes, int dest, int tag = 0, Stream stream = nullptr);
    Request irecv(void* buf, size_t bytes, int src, int tag = 0, Stream stream = nullptr);

    // Blocking exchange: send [send_bytes] to dest while receiving [recv_bytes] from src (a
    // ring shift without deadlock). The message from src must be exactly recv_bytes.
    void sendrecv(const void* send, size_t send_bytes, int dest, void* recv, size_t recv_bytes,
                  int src, int tag = 0, Stream stream = nullptr);

    // Prints "[rank r/P] error: msg" to stderr and ends every rank of the job with `code`
    // (MPI_Abort for MPI). Never returns.
    [[noreturn]] virtual void abort(int code, const std::string& msg) = 0;

    // ---- accounting (docs/design.md §5.5) ----
    // Calls from now on are counted under `phase` (non-empty, printable, no tabs or newlines).
    // The phase before the first set_phase is "other".
    void set_phase(const std::string& phase);
    const std::string& phase() const { return phase_; }
    // Every phase this rank has counted, in order of first use.
    std::vector<PhaseStats> stats() const;
    // One phase (zeros if never used) and the sum over all phases.
    CommStats stats(const std::string& phase) const;
    CommStats total_stats() const;
    void reset_stats();

    // Used by Request to charge its wait time.
    void add_wait(const std::string& phase, double ms);

    // ---- watchdog (docs/design.md §11, comm/watchdog.h) ----
    // The deadlines of this communicator's waits: set_timeouts() after construction, and
    // end_startup() once the start-up checks are done (check_same_model does it). SelfComm
    // never waits for a peer, so its watchdog is never consulted.
    Watchdog& watchdog() { return watchdog_; }

  protected:
    Communicator(int rank, int size, int local_rank, int local_size);

    // Implementations move data only; the public methods validate arguments, time the call
    // and count bytes. Vectors have P entries; arguments are already checked.
    virtual void do_barrier(Stream stream) = 0;
    virtual void do_broadcast(void* buf, size_t bytes, int root, Stream stream) = 0;
    virtual void do_all_reduce(void* buf, size_t count, DType dtype, ReduceOp op,
                               Stream stream) = 0;
    virtual void do_all_gather(const void* send, size_t bytes_per_rank, void* recv,
                               Stream stream) = 0;
    virtual void do_all_gather_v(const void* send, size_t send_bytes, void* recv,
                                 const std::vector<size_t>& recv_bytes, Stream stream) = 0;
    virtual void do_all_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                                 void* recv, const std::vector<size_t>& recv_bytes,
                                 Stream stream) = 0;
    virtual std::unique_ptr<RequestImpl> do_isend(const void* buf, size_t bytes, int dest, int tag,
                                                  Stream stream) = 0;
    virtual std::unique_ptr<RequestImpl> do_irecv(void* buf, size_t bytes, int src, int tag,
                                                  Stream stream) = 0;
    // Default: post the receive, then the send, and wait for both (deadlock-free for any pairing
    // of peers); MPI and NCCL override it with their own fused call.
    virtual void do_sendrecv(const void* send, size_t send_bytes, int dest, void* recv,
                             size_t recv_bytes, int src, int tag, Stream stream) {
        std::unique_ptr<RequestImpl> r = do_irecv(recv, recv_bytes, src, tag, stream);
        std::unique_ptr<RequestImpl> s = do_isend(send, send_bytes, dest, tag, stream);
        s->wait();
        r->wait();
    }
    // Called by set_phase after the phase changed (ThreadComm closes a timed compute segment
    // there); the default does nothing.
    virtual void on_set_phase(const std::string& /*phase*/) {}

  private:
    void check_stream(Stream stream) const;
    void check_peer(int peer, const char* what) const;
    void count(uint64_t sent, uint64_t recv, double ms);

    int rank_ = 0;
    int size_ = 1;
    int local_rank_ = 0;
    int local_size_ = 1;
    Link link_;
    std::string phase_ = "other";
    std::vector<std::string> phase_order_;
    std::map<std::string, CommStats> stats_;
    Watchdog watchdog_;
};

// Counts calls under `phase` for its lifetime, then restores the previous phase.
class PhaseScope {
  public:
    PhaseScope(Communicator& comm, const std::string& phase);
    ~PhaseScope();
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;

  private:
    Communicator& comm_;
    std::string previous_;
};

// Collective: every rank's stats() (a snapshot taken on entry) on every rank, for the per-rank
// JSON columns of docs/design.md §9. Phases in order of first appearance on rank 0, then on rank 1,
// ... The gather's own traffic is counted afterwards under the phase "comm_stats".
std::vector<PhaseStatsAllRanks> gather_stats(Communicator& comm);

// The fixed-size slot check_same_config compares (exposed for tests).
constexpr size_t k_config_hash_slot = 64;

// Collective start-up check (docs/design.md §11): all-gathers every rank's `config_hash` (a string
// of at most 64 bytes; a longer one is compared by its FNV-1a hex) and, when any rank's differs
// from rank 0's, throws infoflow::Error on every rank naming the differing ranks and hashes.
void check_same_config(Communicator& comm, const std::string& config_hash);

// Slots check_same_model compares (exposed for tests): the identity and the file name.
constexpr size_t k_model_identity_slot = 64;
constexpr size_t k_model_source_slot = 960;

// Collective start-up check (docs/design.md §11) of the model every rank loaded: `identity` is a
// fingerprint of what was loaded (architecture, shapes, tensor bytes, tokenizer; a longer one is
// compared by its FNV-1a hex), `source` the file it came from (reported as this host resolves
// it, realpath, since one relative path may name different files; truncated to the slot). When any
// rank's identity differs from rank 0's, throws infoflow::Error on every rank naming rank 0 and
// each differing rank with its host, file and identity. Then ends the watchdog's start-up period
// (later waits get parallel.timeout_s).
void check_same_model(Communicator& comm, const std::string& identity, const std::string& source);

// ---- construction (the factory file is the only place that knows what is built) ----

// True when this binary was built with the MPI communicator.
bool comm_have_mpi();

// World size announced by a launcher in the environment (Open MPI's mpirun:
// OMPI_COMM_WORLD_SIZE; Hydra and Slurm PMI-2: PMI_SIZE; srun --mpi=pmix: PMIX_RANK with
// SLURM_STEP_NUM_TASKS), or 0 when not started by a launcher. Needs no library.
int launcher_world_size();
// This process's rank announced by the launcher (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK), 0
// when none. Needs no library.
int launcher_world_rank();

// Keeps the communication library initialized while it lives (MPI: an MpiEnv). Move-only.
class CommEnv {
  public:
    CommEnv() = default;
    virtual ~CommEnv() = default;
    CommEnv(const CommEnv&) = delete;
    CommEnv& operator=(const CommEnv&) = delete;
};

// For main(), before anything else: kind "mpi" initializes MPI (error when not built); "nccl"
// initializes it when built with MPI (a build without MPI runs NCCL on one rank) and errors when
// NCCL is not built; "auto" initializes it when built with MPI and started by a launcher
// (launcher_world_size() > 0); "self" initializes nothing. Hold the result until main returns.
std::unique_ptr<CommEnv> init_comm(int* argc, char*** argv, const std::string& kind = "auto");

// What make_communicator needs beyond the kind.
struct CommOptions {
    std::string backend = "cpu";  // model.backend: "auto" picks nccl for "cuda" on 2+ ranks
    double timeout_s = 600.0;     // parallel.timeout_s: deadline of one wait or device operation
    double startup_timeout_s = 300.0;  // parallel.startup_timeout_s: waits before the start-up
                                       // checks are done (check_same_model ends that period)
};

// kind: "auto" | "mpi" | "self" | "nccl".
//   auto: NcclComm when the backend is "cuda", NCCL is built and the job has more than one rank
//         (one rank moves nothing between GPUs: NCCL's library, bootstrap and memory are not
//         brought up for it); otherwise MpiComm over
//         MPI_COMM_WORLD when built with MPI and MPI is initialized; otherwise, if a launcher
//         announced more than one rank, an error (MPI is not initialized: the job would silently
//         run P independent one-rank jobs); otherwise SelfComm.
//   mpi:  MpiComm over MPI_COMM_WORLD; error when not built or MPI is not initialized.
//   self: SelfComm (one rank).
//   nccl: NcclComm (comm/nccl_comm.h) over a host channel: MpiComm when MPI is initialized,
//         else SelfComm (one rank: the same launcher check as auto); error when not built, and
//         on every rank when a rank has no CUDA device.
// Collective for every kind but "self" (duplicates the world communicator).
std::unique_ptr<Communicator> make_communicator(const std::string& kind,
                                                const CommOptions& options = {});

// The factory's decision, as a pure function of what is built and running (exposed for tests):
// "self" | "mpi" | "nccl" for the communicator, and in *host_channel the host communicator an
// NcclComm would run over ("mpi" | "self"; "" for the others). Throws infoflow::Error with the
// factory's message where it refuses.
struct CommWorld {
    bool have_mpi = false;   // built with MPI
    bool have_nccl = false;  // built with NCCL (and CUDA)
    bool mpi_up = false;     // MPI is initialized
    int launcher_size = 0;   // launcher_world_size()
    int mpi_size = 0;        // MPI_COMM_WORLD's size when MPI is initialized
};
std::string comm_choice(const std::string& kind, const std::string& backend, const CommWorld& w,
                        std::string* host_channel = nullptr);

// True when this binary was built with the NCCL communicator.
bool comm_have_nccl();

// The link of a communicator from what every rank knows alike: NCCL within one node nvlink,
// across nodes ib; MPI within one node shm, across nodes tcp; one rank shm.
Link default_link(const Communicator& comm);
// default_link, refined with a collective (one all-reduce, every rank calls it): ranks on
// several nodes over MPI talk over ib when every rank's node has an active InfiniBand port
// (/sys/class/infiniband/*/ports/*/state), else tcp.
Link detect_link(Communicator& comm);

// SelfComm directly (also what make_communicator("self") returns).
std::unique_ptr<Communicator> make_self_communicator();

// For main()'s catch: prints "[rank r/P] error: msg" to stderr (r and P from MPI_COMM_WORLD when
// MPI is initialized, else from the launcher's environment, else 0/1), flushes stdout and
// stderr, and ends the job with exit code `code`: MPI_Abort(MPI_COMM_WORLD) when MPI is
// initialized, so no rank is left waiting in a collective; otherwise _Exit.
[[noreturn]] void abort_job(const std::string& msg, int code = 1);

}  // namespace infoflow
