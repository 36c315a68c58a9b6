// Return-code checks for CUDA runtime and cuBLAS calls: throw infoflow::Error naming file:line,
// the call and the library's error string. Only for files in kernels/cuda/.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/cublas_loader.h"
#include "runtime/core/error.h"

#define IF_CUDA_CHECK(call)                                                        \
    do {                                                                           \
        const cudaError_t if_cuda_err_ = (call);                                   \
        if (if_cuda_err_ != cudaSuccess) {                                         \
            IF_FAIL(#call << " failed: " << cudaGetErrorName(if_cuda_err_) << ": " \
                          << cudaGetErrorString(if_cuda_err_));                    \
        }                                                                          \
    } while (0)

#define IF_CUBLAS_CHECK(call)                                                          \
    do {                                                                               \
        const cublasStatus_t if_cublas_st_ = (call);                                   \
        if (if_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                  \
            IF_FAIL(#call << " failed: " << ::infoflow::cuda::cublas().status_name(if_cublas_st_) \
                          << ": " << ::infoflow::cuda::cublas().status_string(if_cublas_st_)); \
        }                                                                              \
    } while (0)

// After a kernel launch: the launch error, if any.
#define IF_CUDA_LAUNCH_CHECK(name)                                                                 \
    do {                                                                                           \
        const cudaError_t if_cuda_err_ = cudaGetLastError();                                       \
        if (if_cuda_err_ != cudaSuccess) {                                                         \
            IF_FAIL("launch of kernel " << (name) << " failed: " << cudaGetErrorName(if_cuda_err_) \
                                        << ": " << cudaGetErrorString(if_cuda_err_));              \
        }                                                                                          \
    } while (0)
