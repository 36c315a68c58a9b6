// Main of the NCCL GPU tests (label gpu). Exits 77 (CTest SKIP_RETURN_CODE) where no CUDA
// device is visible or where fewer GPUs than ranks are (ranks of one communicator never share a
// GPU, docs/formats.md §9.2). One NcclComm serves every test case (NCCL start-up is slow); its ranks'
// results are combined with MAX so every rank exits alike (docs/formats.md §11.3). Built with or without
// MPI: without, it runs one rank over SelfComm (the GPU machine has no MPI library).
//   tests_gpu_nccl [catch options]   the op tests
//   tests_gpu_nccl --watchdog-child  a collective stuck behind a 5 s host function on a
//                                    communicator with a 1 s deadline: the watchdog must end the
//                                    process (run by tests/gpu_nccl/run_watchdog_test.sh)
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "comm/communicator.h"
#include "comm/nccl_comm.h"
#include "tests/gpu_nccl/gpu_nccl_test.h"

namespace infoflow {
Communicator* g_nccl = nullptr;
}

using namespace infoflow;

namespace {

void CUDART_CB sleep_5s(void*) { std::this_thread::sleep_for(std::chrono::seconds(5)); }

int watchdog_child() {
    CommOptions opts;
    opts.backend = "cuda";
    opts.timeout_s = 1.0;
    auto comm = make_communicator("nccl", opts);
    cudaStream_t stream = nullptr;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 3;
    int32_t* buf = nullptr;
    if (cudaMalloc(&buf, sizeof(int32_t)) != cudaSuccess) return 3;
    if (cudaLaunchHostFunc(stream, sleep_5s, nullptr) != cudaSuccess) return 3;
    comm->set_phase("watchdog_test");
    comm->all_reduce(buf, 1, DType::i32, ReduceOp::sum, stream);
    std::printf("error: the all_reduce returned although its stream was blocked\n");
    return 4;
}

}  // namespace

int main(int argc, char** argv) {
    const bool watchdog = argc > 1 && std::strcmp(argv[1], "--watchdog-child") == 0;
    try {
        std::unique_ptr<CommEnv> env = init_comm(&argc, &argv, "nccl");
        std::string why;
        const int n_dev = nccl_visible_devices(&why);
        const int n_rank = std::max(1, launcher_world_size());
        if (n_dev == 0) {
            std::printf("no CUDA device visible (%s): skipping the NCCL GPU tests\n", why.c_str());
            return 77;
        }
        if (n_rank > n_dev) {
            std::printf("%d ranks but %d visible GPU(s): skipping the NCCL GPU tests\n", n_rank,
                        n_dev);
            return 77;
        }
        if (watchdog) return watchdog_child();

        CommOptions opts;
        opts.backend = "cuda";
        opts.timeout_s = 120.0;
        std::unique_ptr<Communicator> comm = make_communicator("nccl", opts);
        g_nccl = comm.get();
        Catch::Session session;
        int rc = session.applyCommandLine(argc, argv);
        if (rc == 0) rc = session.run();
        int32_t all = rc;
        comm->all_reduce(&all, 1, DType::i32, ReduceOp::max);  // host buffer: host channel
        g_nccl = nullptr;
        comm.reset();
        return all;
    } catch (const std::exception& e) {
        abort_job(e.what());
    }
}
