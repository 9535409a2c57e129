// FlashInfer's SM90 paged prefill kernel (attention/hopper/prefill_sm90.cuh of the pinned wheel),
// causal, head dim 128, BF16: the parameter block its Python glue fills (BatchPrefillPagedParams of
// hopper/default_params.cuh) from our plan, and the launch. FlashInfer throws: caught here.
#include "cuda/attention/flashinfer_attention_sm90.cuh"

#include <cutlass/numeric_types.h>
#include <flashinfer/attention/hopper/default_params.cuh>
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>
#include <flashinfer/attention/mask.cuh>

#include <exception>
#include <string>

#include "cuda/common/check.cuh"

namespace nibble::cuda::flashinfer_sm90 {

// CuTe picks its GMMA atoms by CUTLASS's element types (FlashInfer's glue maps BF16 so too).
using BF16 = cutlass::bfloat16_t;
using Params = flashinfer::BatchPrefillPagedParams<BF16, BF16, BF16, int32_t>;

Status launch_paged_hd128(const Args& a) {
  constexpr int D = 128;
  Params p{};
  p.q_ptr = reinterpret_cast<BF16*>(const_cast<uint16_t*>(a.q));
  p.k_ptr = reinterpret_cast<BF16*>(const_cast<uint16_t*>(a.k_cache));
  p.v_ptr = reinterpret_cast<BF16*>(const_cast<uint16_t*>(a.v_cache));
  p.o_ptr = reinterpret_cast<BF16*>(a.out);
  p.lse_ptr = nullptr;
  p.qo_tile_indices = a.qo_tile_indices, p.qo_indptr = a.qo_indptr, p.kv_indptr = a.kv_indptr;
  p.kv_indices = a.kv_indices, p.qo_lens = a.qo_lens, p.kv_lens = a.kv_lens;
  p.head_indices = a.head_indices, p.work_indptr = a.work_indptr, p.batch_indices = a.batch_indices;
  p.additional_params.logits_soft_cap = 0.0f;
  p.additional_params.sm_scale = a.sm_scale;
  // NHD pages: a token's heads are consecutive, a page's tokens too.
  p.q_stride_n = int64_t{a.n_heads} * D, p.q_stride_h = D;
  p.o_stride_n = int64_t{a.n_heads} * D, p.o_stride_h = D;
  p.k_stride_n = p.v_stride_n = int64_t{a.n_kv_heads} * D;
  p.k_stride_h = p.v_stride_h = D;
  p.k_page_stride = p.v_page_stride = int64_t{a.page_size} * a.n_kv_heads * D;
  p.nnz_qo = a.rows;
  p.num_qo_heads = a.n_heads, p.num_kv_heads = a.n_kv_heads, p.group_size = a.n_heads / a.n_kv_heads;
  p.page_size = a.page_size;
  p.window_left = -1;
  p.causal = true;
  using Variant = flashinfer::StandardAttention;
  using flashinfer::MaskMode;
  try {
    const cudaError_t e =
        a.same_schedule_for_all_heads
            ? flashinfer::BatchPrefillWithPagedKVCacheDispatched<D, D, MaskMode::kCausal, false, true, Variant>(
                  p, /*enable_pdl=*/false, a.stream)
            : flashinfer::BatchPrefillWithPagedKVCacheDispatched<D, D, MaskMode::kCausal, false, false, Variant>(
                  p, /*enable_pdl=*/false, a.stream);
    return cuda_status(e, "FlashInfer SM90 paged attention");
  } catch (const std::exception& error) {
    return Status::error(std::string("FlashInfer SM90 paged attention: ") + error.what());
  }
}

}  // namespace nibble::cuda::flashinfer_sm90
