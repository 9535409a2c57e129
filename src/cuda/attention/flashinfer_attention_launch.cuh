// Internal to the FlashInfer wrapper: the parameter block FlashInfer's FA2 paged batch-prefill
// kernel reads (the fields its Python glue declares, csrc/batch_prefill_customize_config.jinja of
// flashinfer-python 0.7.2.post1) and the launch for one head dim and KV element (BF16, or FP8 E4M3:
// FlashInfer's FA2 kernels convert FP8 K/V tiles to the query's BF16 as they load them),
// instantiated once per pair in flashinfer_attention_hd*.cu so the kernels compile in parallel.
// Included only by those files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/page.cuh>

#include <cstdint>
#include <vector>

// A named namespace, not an anonymous one: with these type aliases in an anonymous namespace, the
// host stubs nvcc generates for FlashInfer's kernel templates fail to compile (nvcc 13.0).
namespace nibble::cuda::flashinfer_glue {

using DTypeQ = __nv_bfloat16;
using DTypeO = __nv_bfloat16;
using IdType = int32_t;
using Fp8 = __nv_fp8_e4m3;

// FlashInfer's default variant multiplies its outputs by params.v_scale where the parameter block has
// one (variant_helper.cuh, has_v_scale_v): the FP8 cache's calibrated V scale; the BF16 block has none.
template <typename KV>
struct ValueScale {};
template <>
struct ValueScale<Fp8> {
  float v_scale = 1.0f;
};

template <typename KV>  // __nv_bfloat16 or Fp8
struct PagedParams : ValueScale<KV> {
  using DTypeQ = flashinfer_glue::DTypeQ;
  using DTypeKV = KV;
  using DTypeO = flashinfer_glue::DTypeO;
  using IdType = flashinfer_glue::IdType;

  DTypeQ* q;
  flashinfer::paged_kv_t<DTypeKV, IdType> paged_kv;
  IdType* q_indptr;
  DTypeO* o;
  float* lse;
  flashinfer::uint_fastdiv group_size;

  // The glue's "additional params" of the default FA2 variant (all unused here: null / neutral).
  uint8_t* maybe_custom_mask;
  int32_t* maybe_mask_indptr;
  float* maybe_alibi_slopes;
  uint32_t* maybe_prefix_len_ptr;
  uint16_t* maybe_token_pos_in_items_ptr;
  uint16_t* maybe_max_item_len_ptr;
  uint8_t* maybe_k_cache_sf;
  uint8_t* maybe_v_cache_sf;
  double logits_soft_cap;
  double sm_scale;
  double rope_rcp_scale;
  double rope_rcp_theta;
  int64_t token_pos_in_items_len;

  uint32_t num_qo_heads;
  IdType q_stride_n;
  IdType q_stride_h;
  uint32_t k_sf_stride_page;
  uint32_t k_sf_stride_n;
  uint32_t k_sf_stride_h;
  uint32_t v_sf_stride_page;
  uint32_t v_sf_stride_n;
  uint32_t v_sf_stride_h;
  int32_t window_left;

  IdType* request_indices;
  IdType* qo_tile_indices;
  IdType* kv_tile_indices;
  IdType* merge_indptr;
  IdType* o_indptr;
  bool* block_valid_mask;
  IdType* kv_chunk_size_ptr;
  uint32_t max_total_num_rows;
  uint32_t* total_num_rows;
  uint32_t padded_batch_size;
  bool partition_kv;

  __host__ __device__ __forceinline__ uint32_t get_qo_len(uint32_t batch_idx) const {
    return q_indptr[batch_idx + 1] - q_indptr[batch_idx];
  }
  __host__ __device__ __forceinline__ uint32_t get_kv_len(uint32_t batch_idx) const {
    return paged_kv.get_length(batch_idx);
  }
};

// Causal, no custom mask, no sliding window, no soft cap, no ALiBi.
using Variant = flashinfer::DefaultAttention<false, false, false, false>;

// Everything one launch needs besides the head dim.
template <typename KV>
struct LaunchArgs {
  PagedParams<KV> params;
  DTypeO* tmp_v;
  float* tmp_s;
  int64_t cta_tile_q;
  bool enable_pdl;
  cudaStream_t stream;
};

template <uint32_t HEAD_DIM, typename KV>
cudaError_t launch_paged(const LaunchArgs<KV>& a);

#ifdef NIBBLE_FLASHINFER_INSTANTIATE
// The CTA heights FlashInfer's planner picks below head dim 512 (FA2DetermineCtaTileQ): 16, 64, 128.
template <uint32_t HEAD_DIM, typename KV>
cudaError_t launch_paged(const LaunchArgs<KV>& a) {
  using flashinfer::MaskMode;
  using flashinfer::PosEncodingMode;
  switch (a.cta_tile_q) {
#define NIBBLE_FI_CASE(TILE)                                                                                        \
  case TILE:                                                                                                        \
    return flashinfer::BatchPrefillWithPagedKVCacheDispatched</*SAME_KV_STRIDES=*/true, TILE, HEAD_DIM, HEAD_DIM,   \
                                                              PosEncodingMode::kNone, false, MaskMode::kCausal,     \
                                                              Variant, PagedParams<KV>>(a.params, a.tmp_v, a.tmp_s, \
                                                                                        a.enable_pdl, a.stream);
    NIBBLE_FI_CASE(16)
    NIBBLE_FI_CASE(64)
    NIBBLE_FI_CASE(128)
#undef NIBBLE_FI_CASE
    default:
      return cudaErrorInvalidConfiguration;
  }
}
#endif

}  // namespace nibble::cuda::flashinfer_glue
