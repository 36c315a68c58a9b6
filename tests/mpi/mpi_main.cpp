// Catch2 main for the MPI tests (docs/formats.md §11.3): MPI is initialized through MpiEnv, every rank
// runs the same test cases in the same order, and the ranks' results are combined with MAX so
// that all ranks exit alike. Run under mpiexec with 1-4 ranks, or alone as a 1-rank singleton.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>

#include "comm/mpi_env.h"

int main(int argc, char** argv) {
    infoflow::MpiEnv env(&argc, &argv);
    Catch::Session session;
    int rc = session.applyCommandLine(argc, argv);
    if (rc == 0) rc = session.run();
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return rc;
}
