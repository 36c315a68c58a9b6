// FlashInfer dense causal prefill kernels, head dim 128 (see flashinfer_attention_impl.cuh).
#include "kernels/cuda/flashinfer_attention_impl.cuh"

namespace infoflow {
namespace flashinfer_detail {
INFOFLOW_FLASHINFER_INSTANTIATE(128, flashinfer::MaskMode::kCausal)
}  // namespace flashinfer_detail
}  // namespace infoflow
