// Shared bits of the NCCL GPU tests: the communicator made by the test main and a device buffer.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace infoflow {

// The NCCL communicator of the whole run (set by tests/gpu_nccl/gpu_nccl_main.cpp).
extern Communicator* g_nccl;

inline void cuda_ok(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) {
        throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
    }
}

// A device allocation with host upload/download. Move-only.
class DevBuf {
  public:
    explicit DevBuf(size_t bytes) : bytes_(bytes) {
        if (bytes > 0) cuda_ok(cudaMalloc(&p_, bytes), "cudaMalloc");
    }
    ~DevBuf() {
        if (p_) cudaFree(p_);
    }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    char* get() const { return static_cast<char*>(p_); }
    size_t bytes() const { return bytes_; }
    void upload(const void* src, size_t n, size_t off = 0) {
        if (n > 0) cuda_ok(cudaMemcpy(get() + off, src, n, cudaMemcpyHostToDevice), "upload");
    }
    template <class T>
    std::vector<T> download() const {
        std::vector<T> out(bytes_ / sizeof(T));
        if (bytes_ > 0) {
            cuda_ok(cudaMemcpy(out.data(), p_, out.size() * sizeof(T), cudaMemcpyDeviceToHost),
                    "download");
        }
        return out;
    }

  private:
    void* p_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace infoflow
