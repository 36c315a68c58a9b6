// MpiEnv: MPI_Init_thread / MPI_Finalize for one process, and the world-level queries and abort
// that the factory (comm/communicator.cpp) uses without including mpi.h.
#include "comm/mpi_env.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <system_error>
#include <thread>

#include "comm/mpi_comm.h"
#include "runtime/core/error.h"

namespace infoflow {

MpiEnv::MpiEnv(int* argc, char*** argv) : uncaught_at_init_(std::uncaught_exceptions()) {
    int init = 0, fin = 0;
    IF_MPI_CHECK(MPI_Initialized(&init));
    IF_MPI_CHECK(MPI_Finalized(&fin));
    IF_CHECK(!fin, "MPI has already been finalized; it cannot be initialized again");
    if (init) {
        IF_MPI_CHECK(MPI_Query_thread(&thread_level_));
    } else {
        IF_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &thread_level_));
        owns_init_ = true;
        IF_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    }
    IF_CHECK(thread_level_ >= MPI_THREAD_FUNNELED,
             "MPI provides thread level " << thread_level_ << ", below MPI_THREAD_FUNNELED");
}

MpiEnv::~MpiEnv() {
    if (!owns_init_) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    if (std::uncaught_exceptions() > uncaught_at_init_) {
        std::fflush(stdout);
        std::fprintf(stderr,
                     "[rank %d/%d] error: an exception left the MPI environment's scope without "
                     "abort_job; aborting the job\n",
                     world_rank(), world_size());
        std::fflush(stderr);
        abort_world(1);
    }
    MPI_Finalize();
}

bool MpiEnv::initialized() {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

int MpiEnv::world_rank() {
    int r = -1;
    if (MPI_Comm_rank(MPI_COMM_WORLD, &r) != MPI_SUCCESS) return -1;
    return r;
}

int MpiEnv::world_size() {
    int n = -1;
    if (MPI_Comm_size(MPI_COMM_WORLD, &n) != MPI_SUCCESS) return -1;
    return n;
}

void MpiEnv::arm_abort_deadline(int code) {
    // Rank and size now: the thread must not call MPI (MPI_THREAD_FUNNELED).
    const int rank = world_rank(), size = world_size();
    try {
        std::thread([code, rank, size] {
            std::this_thread::sleep_for(std::chrono::duration<double>(k_abort_grace_s));
            std::fprintf(stderr,
                         "[rank %d/%d] MPI_Abort did not end the job within %g s; exiting\n", rank,
                         size, k_abort_grace_s);
            std::fflush(stderr);
            std::_Exit(code);
        }).detach();
    } catch (const std::system_error&) {
        // No thread: MPI_Abort alone has to end the process.
    }
}

void MpiEnv::abort_world(int code) {
    arm_abort_deadline(code);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
}

}  // namespace infoflow
