// Catch2 main for the MPI tests (docs/formats.md §11.3): MPI is initialized through MpiEnv, every rank
// runs the same test cases in the same order, and the ranks' results are combined with MAX so
// that all ranks exit alike. Run under mpiexec with 1-4 ranks, or alone as a 1-rank singleton.
#include <mpi.h>

#include "comm/mpi_env.h"
#include "tests/catch_session.h"

int main(int argc, char** argv) {
    infoflow::MpiEnv env(&argc, &argv);
    int rc = infoflow::testing::run_catch_session(argc, argv);
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return rc;
}
