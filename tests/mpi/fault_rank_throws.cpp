// Fault-injection program for tests/mpi/run_fault_test.sh (docs/design.md §11): rank 1 throws in the
// middle of a sequence of all-reduces while the other ranks wait inside one. Modes (argv[1]):
//   abort_job  main catches the error and calls abort_job (the path main() uses): the job must
//              end non-zero, promptly, with "[rank 1/P] error: ..." on stderr.
//   unwind     the error escapes the MPI environment's scope before it is caught: MpiEnv's
//              destructor must abort the job rather than finalize (which would hang).
//   config     rank 1 has a different config hash: check_same_config throws on every rank and
//              every rank reports it through abort_job.
#include <cstdio>
#include <exception>
#include <string>

#include "comm/communicator.h"
#include "runtime/core/error.h"

using namespace infoflow;

namespace {

void work(Communicator& comm) {
    for (int step = 0; step < 10; ++step) {
        if (comm.rank() == 1 && step == 3) {
            IF_FAIL("injected failure on rank 1 at step " << step);
        }
        double x = comm.rank() + step;
        comm.all_reduce(&x, 1, DType::f64, ReduceOp::sum);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "abort_job";
    if (mode == "unwind") {
        try {
            auto env = init_comm(&argc, &argv, "mpi");
            auto comm = make_communicator("mpi");
            work(*comm);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "caught after the MPI environment closed: %s\n", e.what());
            return 3;
        }
        return 0;
    }
    auto env = init_comm(&argc, &argv, "mpi");
    try {
        auto comm = make_communicator("mpi");
        if (mode == "config") {
            check_same_config(*comm, comm->rank() == 1 ? "feedfacefeedface" : "0123456789abcdef");
        } else {
            work(*comm);
        }
        return 0;
    } catch (const std::exception& e) {
        abort_job(e.what());
    }
}
