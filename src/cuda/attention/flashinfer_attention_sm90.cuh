// Internal to the FlashInfer wrapper: the launch of FlashInfer's SM90 (FA3-style, warp-specialized
// TMA + wgmma) paged prefill kernel for head dim 128, compiled in its own unit
// (flashinfer_attention_sm90.cu: its Hopper headers define names the FA2 ones define too, and it
// needs CUTLASS/CuTe). No FlashInfer types here, so the FA2 unit can fill them from its plan.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace nibble::cuda::flashinfer_sm90 {

struct Args {
  const uint16_t* q;        // BF16 [rows, n_heads, head_dim]
  const uint16_t* k_cache;  // BF16 [pages, page_size, n_kv_heads, head_dim]
  const uint16_t* v_cache;
  uint16_t* out;        // BF16 [rows, n_heads · head_dim]
  int32_t* kv_indices;  // page ids, by the requests' page indptr
  // PrefillSM90Plan's schedule on the device (PrefillPlanSM90Info's arrays).
  int32_t *qo_tile_indices, *qo_indptr, *kv_indptr, *qo_lens, *kv_lens, *head_indices, *work_indptr, *batch_indices;
  bool same_schedule_for_all_heads;
  int64_t rows;
  int n_heads, n_kv_heads, page_size;
  float sm_scale;
  cudaStream_t stream;
};

Status launch_paged_hd128(const Args& a);

}  // namespace nibble::cuda::flashinfer_sm90
