// FlashInfer dense causal prefill kernels, head dim 64 (see flashinfer_attention_impl.cuh).
#include "kernels/cuda/flashinfer_attention_impl.cuh"

namespace infoflow {
namespace flashinfer_detail {
INFOFLOW_FLASHINFER_INSTANTIATE(64, flashinfer::MaskMode::kCausal)
}  // namespace flashinfer_detail
}  // namespace infoflow
