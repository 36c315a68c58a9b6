#include "kernels/cuda/cublas_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "runtime/core/error.h"

#define IF_STR2(x) #x
#define IF_STR(x) IF_STR2(x)

namespace infoflow::cuda {
namespace {

template <typename F>
void resolve(void* lib, const char* symbol, F& out) {
    dlerror();
    void* p = dlsym(lib, symbol);
    const char* err = dlerror();
    IF_CHECK(p != nullptr && err == nullptr, cublas_library_name()
                                                 << ": no entry point " << symbol << " ("
                                                 << (err ? err : "null symbol") << ")");
    out = reinterpret_cast<F>(p);
}

CublasApi load() {
    // RTLD_LOCAL: the symbols serve this table only; RTLD_NOW: a broken install fails here, at
    // backend creation, not in the middle of a forward pass.
    void* lib = dlopen(cublas_library_name(), RTLD_NOW | RTLD_LOCAL);
    IF_CHECK(lib != nullptr, "backend 'cuda': cannot load cuBLAS " << cublas_library_name() << " ("
                                                                   << dlerror() << ")");
    CublasApi api;
    resolve(lib, "cublasCreate_v2", api.create);
    resolve(lib, "cublasDestroy_v2", api.destroy);
    resolve(lib, "cublasSetStream_v2", api.set_stream);
    resolve(lib, "cublasGemmEx", api.gemm_ex);
    resolve(lib, "cublasGetStatusName", api.status_name);
    resolve(lib, "cublasGetStatusString", api.status_string);
    return api;  // the library stays loaded for the life of the process
}

}  // namespace

const char* cublas_library_name() { return "libcublas.so." IF_STR(CUBLAS_VER_MAJOR); }

const CublasApi& cublas() {
    // A failed load throws out of call_once and is retried (and reported again) next time.
    static std::once_flag once;
    static CublasApi api;
    std::call_once(once, [] { api = load(); });
    return api;
}

}  // namespace infoflow::cuda
