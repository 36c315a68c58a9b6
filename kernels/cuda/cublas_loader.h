// cuBLAS, loaded when the CUDA backend first needs it rather than when the program starts: a
// binary built with CUDA then runs on the CPU without mapping libcublas and libcublasLt, whose
// start-up alone holds ~150 MB resident (their static tables), and runs on machines that have
// no cuBLAS at all as long as `model.backend = "cpu"`. Only kernels/cuda/ sees this.
#pragma once

#include <cublas_v2.h>

namespace infoflow::cuda {

// The cuBLAS entry points the backend calls.
struct CublasApi {
    decltype(&cublasCreate_v2) create = nullptr;
    decltype(&cublasDestroy_v2) destroy = nullptr;
    decltype(&cublasSetStream_v2) set_stream = nullptr;
    // cublasGemmEx has a C++ overload in the header; this is the C entry point.
    using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                      int, int, const void*, const void*, cudaDataType, int,
                                      const void*, cudaDataType, int, const void*, void*,
                                      cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    GemmEx gemm_ex = nullptr;
    decltype(&cublasGetStatusName) status_name = nullptr;
    decltype(&cublasGetStatusString) status_string = nullptr;
};

// Loads the cuBLAS the binary was built against (libcublas.so.<major>) on the first call and
// resolves every entry point; later calls return the same table. Throws infoflow::Error naming
// the library and the loader's message when it or an entry point is missing.
const CublasApi& cublas();

// The library name cublas() opens, e.g. "libcublas.so.13".
const char* cublas_library_name();

}  // namespace infoflow::cuda
