// FlashInfer's FA2 paged batch-prefill kernels for head dim 128 over an FP8 E4M3 KV cache (see
// flashinfer_attention_launch.cuh); a file of its own so that it compiles beside the BF16 one.
#define NIBBLE_FLASHINFER_INSTANTIATE
#include "cuda/attention/flashinfer_attention_launch.cuh"

namespace nibble::cuda::flashinfer_glue {
template cudaError_t launch_paged<128, Fp8>(const LaunchArgs<Fp8>& a);
}  // namespace nibble::cuda::flashinfer_glue
