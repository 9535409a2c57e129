// The MoE block's CUBLAS backend (moe_dequant_cublas.cuh): each active expert's gate, up and down
// dequantized to BF16, the sorted rows gathered, cublasGemmGroupedBatchedEx (or one cublasGemmEx a
// problem where the output is fp32), the SwiGLU between them.
#include "cuda/moe/moe_dequant_cublas.cuh"

#include <cuda_bf16.h>

#include <vector>

#include "cuda/common/check.cuh"
#include "cuda/nvfp4/nvfp4_layout.h"
#include "formats/bf16.h"

namespace nibble::cuda {
namespace {

constexpr int THREADS = 256;

// dst[r] = src[sorted_pairs[r] / top_k] (BF16 rows of `width`, 16-byte chunks).
__global__ void gather_rows_kernel(const uint16_t* __restrict__ src, const int32_t* __restrict__ sorted_pairs,
                                   int top_k, int width, uint16_t* __restrict__ dst) {
  const int r = blockIdx.x;
  const uint4* from = reinterpret_cast<const uint4*>(src + size_t(sorted_pairs[r] / top_k) * width);
  uint4* to = reinterpret_cast<uint4*>(dst + size_t(r) * width);
  for (int i = threadIdx.x; i < width / 8; i += THREADS) to[i] = from[i];
}

__device__ __forceinline__ float load_value(const uint16_t* p) { return formats::bf16_decode(*p); }
__device__ __forceinline__ float load_value(const float* p) { return *p; }

// act[r, i] = silu(g) · u with g = row_scale · gate_up[r, i], u = row_scale · gate_up[r, I + i] (the
// weight scales were the GEMM alphas); row_scale is that of the row's token (W4A4) or 1. W4A16 runs
// BF16 → BF16, W4A4 fp32 → fp32 (the re-quantization sees the values the reference sees).
template <class T>
__global__ void swiglu_kernel(const T* __restrict__ gate_up, const int32_t* __restrict__ sorted_pairs, int top_k,
                              const float* __restrict__ token_scales, int inter, T* __restrict__ act) {
  const int r = blockIdx.x;
  const float rs = token_scales ? token_scales[sorted_pairs[r] / top_k] : 1.0f;
  for (int i = threadIdx.x; i < inter; i += THREADS) {
    const float g = load_value(gate_up + size_t(r) * 2 * inter + i) * rs;
    const float u = load_value(gate_up + size_t(r) * 2 * inter + inter + i) * rs;
    const float v = g / (1.0f + expf(-g)) * u;
    if constexpr (sizeof(T) == 4)
      act[size_t(r) * inter + i] = v;
    else
      act[size_t(r) * inter + i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

// One cuBLAS grouped call: each non-empty expert e is one problem C_e = alpha_e · A_eᵀ · B_e with A_e a
// weight (col-major k × m, i.e. row-major [m, k]), B_e its rows of input, C_e its rows of output.
struct GroupedProblems {
  std::vector<int> m, n, k, lda, ldb, ldc, group_size;
  std::vector<float> alpha, beta;
  std::vector<cublasOperation_t> trans_a, trans_b;
  std::vector<const void*> a, b;
  std::vector<void*> c;
  void add(int rows_m, int cols_n, int depth, const void* w, const void* in, int ld_in, void* out, int ld_out,
           float scale) {
    m.push_back(rows_m), n.push_back(cols_n), k.push_back(depth);
    lda.push_back(depth), ldb.push_back(ld_in), ldc.push_back(ld_out), group_size.push_back(1);
    alpha.push_back(scale), beta.push_back(0.0f);
    trans_a.push_back(CUBLAS_OP_T), trans_b.push_back(CUBLAS_OP_N);
    a.push_back(w), b.push_back(in), c.push_back(out);
  }
  // BF16 in, fp32 compute; BF16 out through one grouped call, or fp32 out through one cublasGemmEx per
  // problem (the grouped call has no BF16 × BF16 → fp32 form).
  Status run(cublasHandle_t cublas, const void** device_pointers, bool out_fp32, cudaStream_t stream) {
    const size_t count = m.size();
    if (count == 0) return Status::ok();
    if (out_fp32) {
      cublasStatus_t s = cublasSetStream(cublas, stream);
      for (size_t i = 0; i < count && s == CUBLAS_STATUS_SUCCESS; ++i)
        s = cublasGemmEx(cublas, trans_a[i], trans_b[i], m[i], n[i], k[i], &alpha[i], a[i], CUDA_R_16BF, lda[i], b[i],
                         CUDA_R_16BF, ldb[i], &beta[i], c[i], CUDA_R_32F, ldc[i], CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
      return cublas_status(s, "moe (cublas): cublasGemmEx");
    }
    std::vector<const void*> all(a);
    all.insert(all.end(), b.begin(), b.end());
    all.insert(all.end(), c.begin(), c.end());
    NIB_RETURN_IF_ERROR(cuda_status(
        cudaMemcpyAsync(device_pointers, all.data(), all.size() * sizeof(void*), cudaMemcpyHostToDevice, stream),
        "moe (cublas): pointer upload"));
    // The pageable-memory copy above may return before it is done reading `all`; wait for it.
    NIB_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "moe (cublas): pointer upload"));
    cublasStatus_t s = cublasSetStream(cublas, stream);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasGemmGroupedBatchedEx(cublas, trans_a.data(), trans_b.data(), m.data(), n.data(), k.data(), alpha.data(),
                                     device_pointers, CUDA_R_16BF, lda.data(), device_pointers + count, CUDA_R_16BF,
                                     ldb.data(), beta.data(), const_cast<void* const*>(device_pointers + 2 * count),
                                     CUDA_R_16BF, ldc.data(), int(count), group_size.data(), CUBLAS_COMPUTE_32F);
    return cublas_status(s, "moe (cublas): cublasGemmGroupedBatchedEx");
  }
};

}  // namespace

Status moe_dequant_cublas(const uint16_t* gate_up_in, const float* token_scales, int64_t tokens,
                          const DeviceMoeWeights& w, formats::ActQuant mode, MoeWorkspace& ws, cudaStream_t stream,
                          cublasHandle_t cublas) {
  if (!ws.gate_bf16) return Status::error("moe_forward (cublas): the workspace was created without it");
  if (!cublas) return Status::error("moe_forward (cublas): no cuBLAS handle");
  const int64_t E = w.experts, H = w.hidden, I = w.intermediate, pairs = tokens * w.top_k;
  const bool w4a4 = mode != formats::ActQuant::NONE;
  ws.host_offsets.resize(size_t(E + 1));
  NIB_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(ws.host_offsets.data(), ws.groups.expert_offsets,
                                                  (E + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
                                  "moe (cublas): reading expert counts"));
  NIB_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "moe (cublas): reading expert counts"));
  gather_rows_kernel<<<unsigned(pairs), THREADS, 0, stream>>>(gate_up_in, ws.groups.sorted_pairs, int(w.top_k), int(H),
                                                              ws.x_sorted);
  NIB_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "moe gather launch"));

  GroupedProblems gate_up, down;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t row0 = ws.host_offsets[e], rows = ws.host_offsets[e + 1] - row0;
    if (rows == 0) continue;
    auto expert_view = [&](const DeviceNvfp4Experts& x) {
      return DeviceNvfp4Weight{x.packed + e * x.rows * x.cols / 2, x.block_scales + e * x.rows * x.cols / 16, x.rows,
                               x.cols, 1.0f};
    };
    uint16_t* gate_e = ws.gate_bf16 + e * I * H;
    uint16_t* up_e = ws.up_bf16 + e * I * H;
    uint16_t* down_e = ws.down_bf16 + e * H * I;
    NIB_RETURN_IF_ERROR(dequantize_nvfp4_bf16(expert_view(w.gate), gate_e, stream, expert_line_order(H)));
    NIB_RETURN_IF_ERROR(dequantize_nvfp4_bf16(expert_view(w.up), up_e, stream, expert_line_order(H)));
    NIB_RETURN_IF_ERROR(dequantize_nvfp4_bf16(expert_view(w.down), down_e, stream, expert_line_order(I)));
    const uint16_t* x_e = ws.x_sorted + row0 * H;
    void* out_e = w4a4 ? static_cast<void*>(static_cast<float*>(ws.gate_up) + row0 * 2 * I)
                       : static_cast<void*>(static_cast<uint16_t*>(ws.gate_up) + row0 * 2 * I);
    const size_t up_offset = size_t(I) * (w4a4 ? sizeof(float) : sizeof(uint16_t));
    gate_up.add(int(I), int(rows), int(H), gate_e, x_e, int(H), out_e, int(2 * I), w.gate_scales[size_t(e)]);
    gate_up.add(int(I), int(rows), int(H), up_e, x_e, int(H), static_cast<uint8_t*>(out_e) + up_offset, int(2 * I),
                w.up_scales[size_t(e)]);
  }
  NIB_RETURN_IF_ERROR(gate_up.run(cublas, ws.pointers, w4a4, stream));

  if (w4a4) {
    swiglu_kernel<float><<<unsigned(pairs), THREADS, 0, stream>>>(static_cast<const float*>(ws.gate_up),
                                                                  ws.groups.sorted_pairs, int(w.top_k), token_scales,
                                                                  int(I), static_cast<float*>(ws.act));
    NIB_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "moe swiglu launch"));
    NIB_RETURN_IF_ERROR(quantize_moe_act(w, mode, pairs, ws, stream, false));
  } else {
    swiglu_kernel<uint16_t><<<unsigned(pairs), THREADS, 0, stream>>>(static_cast<const uint16_t*>(ws.gate_up),
                                                                     ws.groups.sorted_pairs, int(w.top_k), nullptr,
                                                                     int(I), static_cast<uint16_t*>(ws.act));
    NIB_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "moe swiglu launch"));
  }
  const uint16_t* down_in = mode != formats::ActQuant::NONE ? ws.act_hat : static_cast<const uint16_t*>(ws.act);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t row0 = ws.host_offsets[e], rows = ws.host_offsets[e + 1] - row0;
    if (rows == 0) continue;
    down.add(int(H), int(rows), int(I), ws.down_bf16 + e * H * I, down_in + row0 * I, int(I),
             static_cast<uint16_t*>(ws.y) + row0 * H, int(H), w.down_scales[size_t(e)]);
  }
  return down.run(cublas, ws.pointers, false, stream);
}

}  // namespace nibble::cuda
