// FlashInfer's FA2 paged batch-prefill kernels for head dim 128 (see flashinfer_attention_launch.cuh).
#define NIBBLE_FLASHINFER_INSTANTIATE
#include "cuda/attention/flashinfer_attention_launch.cuh"

namespace nibble::cuda::flashinfer_glue {
template cudaError_t launch_paged<128, __nv_bfloat16>(const LaunchArgs<__nv_bfloat16>& a);
}  // namespace nibble::cuda::flashinfer_glue
