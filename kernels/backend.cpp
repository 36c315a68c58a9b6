// Buffer release, the host KV conversions and the backend factory: the one place that knows which
// backends were built.
#include "kernels/backend.h"

#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "runtime/core/error.h"
#include "runtime/core/half.h"

namespace infoflow {

void kv_narrow(KvDtype t, const float* src, size_t n, void* dst) {
    if (t == KvDtype::f32) {
        std::memcpy(dst, src, n * sizeof(float));
        return;
    }
    uint16_t* h = static_cast<uint16_t*>(dst);
    size_t i = 0;
    if (t == KvDtype::f16) {
#if defined(__F16C__)
        for (; i + 8 <= n; i += 8) {
            const __m128i x = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), x);
        }
#endif
        for (; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
    } else {
        for (; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
    }
}

void kv_widen(KvDtype t, const void* src, size_t n, float* dst) {
    if (t == KvDtype::f32) {
        std::memcpy(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t* h = static_cast<const uint16_t*>(src);
    size_t i = 0;
    if (t == KvDtype::f16) {
#if defined(__F16C__)
        for (; i + 8 <= n; i += 8) {
            const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(x));
        }
#endif
        for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
    } else {
        for (; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
    }
}

void Backend::narrow_kv(KvDtype t, const float* src, size_t n, void* dst) {
    kv_narrow(t, src, n, dst);
}

void Backend::widen_kv(KvDtype t, const void* src, size_t n, float* dst) {
    kv_widen(t, src, n, dst);
}

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
