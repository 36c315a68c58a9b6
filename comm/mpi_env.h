// MPI start-up and shutdown for one process (RAII around MPI_Init_thread / MPI_Finalize) and the
// few world-level calls the factory needs. Plain C++: this header does not include mpi.h, so the
// factory can name it; it is compiled only when CMake found MPI (comm/mpi_env.cpp). Code outside
// comm/ reaches it through init_comm() and abort_job() in comm/communicator.h.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace infoflow {

// One per process, held for the life of main (directly or through init_comm()). Not copyable or
// movable (own it by unique_ptr to pass it around).
class MpiEnv : public CommEnv {
  public:
    // MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED) unless MPI is already initialized (then
    // this object owns nothing). Throws infoflow::Error when MPI was already finalized or
    // provides less than FUNNELED (OpenMP threads compute; only the main thread communicates).
    MpiEnv(int* argc, char*** argv);
    // MPI_Finalize when this object initialized MPI and it is not finalized yet. If an exception
    // is unwinding through the destructor (a rank failing without abort_job), calls
    // MPI_Abort(MPI_COMM_WORLD, 1) instead: a finalize would wait forever for ranks still inside
    // a collective.
    ~MpiEnv() override;
    MpiEnv(const MpiEnv&) = delete;
    MpiEnv& operator=(const MpiEnv&) = delete;

    // True when this object called MPI_Init_thread (and will finalize).
    bool owns_init() const { return owns_init_; }
    // The thread level MPI provides (an MPI_THREAD_* value).
    int thread_level() const { return thread_level_; }

    // MPI_Initialized and not MPI_Finalized.
    static bool initialized();
    // Rank and size in MPI_COMM_WORLD; MPI must be initialized.
    static int world_rank();
    static int world_size();
    // MPI_Abort(MPI_COMM_WORLD, code); falls back to _Exit(code) if that returns or takes
    // longer than k_abort_grace_s (arm_abort_deadline).
    [[noreturn]] static void abort_world(int code);
    // Makes sure this process ends with `code` within k_abort_grace_s from now, whatever
    // MPI_Abort does: a detached thread sleeps that long, then calls _Exit(code). Call it right
    // before MPI_Abort. Why: MPI_Abort hands the abort to the launcher (Open MPI's daemon on
    // this node, which passes it to mpirun) and waits for it; where that daemon hangs or waits
    // itself for a node it cannot reach -- the kind of fault the watchdog reports -- MPI_Abort
    // never returns and the rank would stay after having named the fault (the CTest case
    // multinode_cutlink_hung). A working launcher ends the job well within the grace period.
    static void arm_abort_deadline(int code);
    static constexpr double k_abort_grace_s = 2.0;

  private:
    bool owns_init_ = false;
    int thread_level_ = 0;
    int uncaught_at_init_ = 0;
};

// MpiComm over a duplicate of MPI_COMM_WORLD (collective). MPI must be initialized.
std::unique_ptr<Communicator> make_mpi_communicator(const WatchdogTimeouts& timeouts = {});

}  // namespace infoflow
