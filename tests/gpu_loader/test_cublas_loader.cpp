// cuBLAS is opened when the CUDA backend first needs it, not when the program starts
// (kernels/cuda/cublas_loader.h): a CUDA-enabled binary running on the CPU must not map libcublas
// (its static tables alone hold ~150 MB resident). Needs the toolkit's libraries, no device.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "kernels/backend.h"
#include "kernels/cuda/cublas_loader.h"

namespace {

bool mapped(const std::string& lib) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        if (line.find(lib) != std::string::npos) return true;
    }
    return false;
}

}  // namespace

TEST_CASE("cuBLAS is loaded on first use, with every entry point", "[cublas]") {
    // The CPU backend of a CUDA build works without it.
    std::unique_ptr<infoflow::Backend> cpu = infoflow::make_backend("cpu", 1, 0);
    REQUIRE(cpu != nullptr);
    CHECK_FALSE(mapped("libcublas"));  // libcublas.so and libcublasLt.so alike

    const infoflow::cuda::CublasApi& api = infoflow::cuda::cublas();
    CHECK(mapped(infoflow::cuda::cublas_library_name()));
    CHECK(api.create != nullptr);
    CHECK(api.destroy != nullptr);
    CHECK(api.set_stream != nullptr);
    CHECK(api.gemm_ex != nullptr);
    REQUIRE(api.status_name != nullptr);
    REQUIRE(api.status_string != nullptr);
    CHECK(std::string(api.status_name(CUBLAS_STATUS_SUCCESS)) == "CUBLAS_STATUS_SUCCESS");
    CHECK(std::string(api.status_name(CUBLAS_STATUS_NOT_INITIALIZED)) ==
          "CUBLAS_STATUS_NOT_INITIALIZED");
    CHECK(&infoflow::cuda::cublas() == &api);  // loaded once
}
