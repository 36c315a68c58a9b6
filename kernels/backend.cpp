// Buffer release and the backend factory: the one place that knows which backends were built.
#include "kernels/backend.h"

#include "runtime/core/error.h"

namespace infoflow {

Buffer::~Buffer() {
    if (owner_ && ptr_) owner_->release(ptr_);
}

void Backend::matmul_native(const float*, const NativeMatrix&, const float*, int, float*, bool) {
    IF_FAIL("backend '" << name() << "': weights in their stored type (model.weights = \"native\") "
                        << "are not implemented yet on this backend; use model.weights = \"f32\"");
}

void Backend::embed_native(const NativeMatrix&, const int32_t*, int, float*) {
    IF_FAIL("backend '" << name() << "': weights in their stored type (model.weights = \"native\") "
                        << "are not implemented yet on this backend; use model.weights = \"f32\"");
}

#if defined(INFOFLOW_HAVE_CUDA)
std::unique_ptr<Backend> make_cuda_backend(int n_threads, int local_rank);
int cuda_visible_devices();
#endif

int cuda_device_count() {
#if defined(INFOFLOW_HAVE_CUDA)
    return cuda_visible_devices();
#else
    return 0;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name, int n_threads, int local_rank) {
    if (name == "cpu") return make_cpu_backend(n_threads);
    if (name == "cuda") {
#if defined(INFOFLOW_HAVE_CUDA)
        return make_cuda_backend(n_threads, local_rank);
#else
        (void)local_rank;
        IF_FAIL("backend 'cuda' was not built into this binary (configure with nvcc available)");
#endif
    }
    IF_FAIL("unknown backend '" << name << "' (expected cpu or cuda)");
}

}  // namespace infoflow
