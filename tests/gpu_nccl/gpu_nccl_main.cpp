// Main of the NCCL GPU tests (label gpu). Exits 77 (CTest SKIP_RETURN_CODE) where no CUDA
// device is visible or where fewer GPUs than ranks are (ranks of one communicator never share a
// GPU, docs/formats.md §9.2). One NcclComm serves every test case (NCCL start-up is slow); its
// ranks' results are combined with MAX so every rank exits alike (docs/formats.md §11.3). Built
// with or without MPI: without, it runs one rank over SelfComm (the GPU machine has no MPI
// library).
//   tests_gpu_nccl [catch options]   the op tests
//   tests_gpu_nccl --watchdog-child  a collective stuck behind a 5 s host function on a
//                                    communicator with a 1 s deadline: the watchdog must end the
//                                    process (run by tests/gpu_nccl/run_watchdog_test.sh)
//   tests_gpu_nccl --init-timeout-child
//                                    NCCL initialization of a 2-rank communicator whose rank 1
//                                    never arrives, with a 1 s start-up deadline: the
//                                    non-blocking init must be aborted and the process end
//                                    (run by the same script)
// Each child prints "child: ready" on stderr just before the step that must time out, so the
// script times the deadline from there, not from the process start (CUDA context creation and
// NCCL's library load may take seconds on a fresh machine).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl_comm.h"
#include "tests/catch_session.h"
#include "tests/gpu_nccl/gpu_nccl_test.h"

namespace infoflow {
Communicator* g_nccl = nullptr;
}

using namespace infoflow;

namespace {

void CUDART_CB sleep_5s(void*) { std::this_thread::sleep_for(std::chrono::seconds(5)); }

void ready() {
    std::fprintf(stderr, "child: ready\n");
    std::fflush(stderr);
}

int watchdog_child() {
    CommOptions opts;
    opts.backend = "cuda";
    opts.timeout_s = 1.0;
    auto comm = make_communicator("nccl", opts);
    cudaStream_t stream = nullptr;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 3;
    int32_t* buf = nullptr;
    if (cudaMalloc(&buf, sizeof(int32_t)) != cudaSuccess) return 3;
    ready();
    if (cudaLaunchHostFunc(stream, sleep_5s, nullptr) != cudaSuccess) return 3;
    comm->set_phase("watchdog_test");
    comm->all_reduce(buf, 1, DType::i32, ReduceOp::sum, stream);
    std::printf("error: the all_reduce returned although its stream was blocked\n");
    return 4;
}

// A host channel of two ranks of which only rank 0 exists: its collectives fill rank 1's part
// with zeros (in the NCCL bootstrap's start-up record: no host, no device, no problem) and a
// broadcast from rank 0 has nothing to deliver. NCCL's initialization then waits for rank 1.
class LoneRankComm final : public Communicator {
  public:
    LoneRankComm() : Communicator(0, 2, 0, 2) {}
    const char* kind() const override { return "lone"; }
    MemorySpace memory_space() const override { return MemorySpace::host; }
    [[noreturn]] void abort(int code, const std::string& msg) override {
        std::fprintf(stderr, "[rank 0/2] error: %s\n", msg.c_str());
        std::fflush(stderr);
        std::_Exit(code);
    }

  protected:
    void do_barrier(Stream) override {}
    void do_broadcast(void*, size_t, int, Stream) override {}
    void do_all_reduce(void*, size_t, DType, ReduceOp, Stream) override {}
    void do_all_gather(const void* send, size_t bytes, void* recv, Stream) override {
        std::memcpy(recv, send, bytes);
        std::memset(static_cast<char*>(recv) + bytes, 0, bytes);
    }
    void do_all_gather_v(const void*, size_t, void*, const std::vector<size_t>&, Stream) override {
        throw std::runtime_error("LoneRankComm: all_gather_v not used by the bootstrap");
    }
    void do_all_to_all_v(const void*, const std::vector<size_t>&, void*, const std::vector<size_t>&,
                         Stream) override {
        throw std::runtime_error("LoneRankComm: all_to_all_v not used by the bootstrap");
    }
    std::unique_ptr<RequestImpl> do_isend(const void*, size_t, int, int, Stream) override {
        throw std::runtime_error("LoneRankComm: isend not used by the bootstrap");
    }
    std::unique_ptr<RequestImpl> do_irecv(void*, size_t, int, int, Stream) override {
        throw std::runtime_error("LoneRankComm: irecv not used by the bootstrap");
    }
};

int init_timeout_child() {
    // CUDA's context first, so the ready line follows it (the deadline covers NCCL alone).
    if (cudaFree(nullptr) != cudaSuccess) return 3;
    ready();
    auto comm = make_nccl_communicator(std::make_unique<LoneRankComm>(), 60.0, 1.0);
    std::printf("error: NCCL initialization completed although rank 1 never arrived\n");
    return 4;
}

}  // namespace

int main(int argc, char** argv) {
    const bool watchdog = argc > 1 && std::strcmp(argv[1], "--watchdog-child") == 0;
    const bool init_timeout = argc > 1 && std::strcmp(argv[1], "--init-timeout-child") == 0;
    try {
        // The children need no MPI (one process); the op tests use it where built.
        std::unique_ptr<CommEnv> env =
            init_comm(&argc, &argv, watchdog || init_timeout ? "self" : "nccl");
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
        if (init_timeout) return init_timeout_child();

        CommOptions opts;
        opts.backend = "cuda";
        opts.timeout_s = 120.0;
        std::unique_ptr<Communicator> comm = make_communicator("nccl", opts);
        g_nccl = comm.get();
        int rc = infoflow::testing::run_catch_session(argc, argv);
        int32_t all = rc;
        comm->all_reduce(&all, 1, DType::i32, ReduceOp::max);  // host buffer: host channel
        g_nccl = nullptr;
        comm.reset();
        return all;
    } catch (const std::exception& e) {
        abort_job(e.what());
    }
}
