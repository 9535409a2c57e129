// Which cuBLASLt algorithms run the dense BF16 GEMMs of decode-sized batches fastest: for each shape
// (the model's q/k/v as one weight, o_proj) and M rows, the time of cublasGemmEx's default (what
// linear_bf16 runs) and of every candidate cublasLtMatmulAlgoGetHeuristic returns, weights rotated
// through copies larger than L2 so every launch reads them from DRAM. Prints one row per (shape, M).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                          \
  do {                                                                                    \
    if ((x) != 0) {                                                                       \
      std::fprintf(stderr, "%s:%d %s failed (%d)\n", __FILE__, __LINE__, #x, int(x));   \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace {

template <class F>
float time_us(F&& launch, int copies, cudaStream_t stream) {
  for (int i = 0; i < 2 * copies; ++i) launch(i % copies);  // warm up
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  const int iterations = 20 * copies;
  cudaEventRecord(a, stream);
  for (int i = 0; i < iterations; ++i) launch(i % copies);
  cudaEventRecord(b, stream);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a), cudaEventDestroy(b);
  return ms * 1000.0f / iterations;
}

}  // namespace

int main() {
  struct Shape {
    const char* name;
    int n, k;
  };
  const Shape shapes[] = {{"qkv 5120x2048", 5120, 2048}, {"o_proj 2048x4096", 2048, 4096}, {"q_proj 4096x2048", 4096, 2048}};
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cublasHandle_t blas;
  CHECK(cublasCreate(&blas));
  CHECK(cublasSetStream(blas, stream));
  cublasLtHandle_t lt;
  CHECK(cublasLtCreate(&lt));
  const size_t workspace_bytes = 64 << 20;
  void* workspace = nullptr;
  CHECK(cudaMalloc(&workspace, workspace_bytes));
  CHECK(cublasSetWorkspace(blas, workspace, workspace_bytes));
  std::printf("%-18s %4s %10s %10s %6s  %s\n", "shape", "M", "GemmEx", "best Lt", "algos", "best: tile id, stages, split-k");
  for (const Shape& s : shapes) {
    const size_t bytes = size_t(s.n) * s.k * 2;
    const int copies = int(std::max<size_t>(2, (120u << 20) / bytes + 1));
    std::vector<void*> w(copies);
    for (void*& p : w) {
      CHECK(cudaMalloc(&p, bytes));
      CHECK(cudaMemset(p, 0x3c, bytes));
    }
    void *x = nullptr, *y = nullptr;
    CHECK(cudaMalloc(&x, size_t(64) * s.k * 2));
    CHECK(cudaMemset(x, 0x3c, size_t(64) * s.k * 2));
    CHECK(cudaMalloc(&y, size_t(64) * s.n * 4));
    for (int m : {33, 40, 48, 56, 64}) {
      const float one = 1.0f, zero = 0.0f;
      const float t_default = time_us(
          [&](int c) {
            cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, m, s.k, &one, w[c], CUDA_R_16BF, s.k, x, CUDA_R_16BF, s.k,
                         &zero, y, CUDA_R_32F, s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          },
          copies, stream);
      // The same GEMM through cuBLASLt: yᵀ[N, M] = Wᵀ (K × N col-major, transposed) · xᵀ (K × M).
      cublasLtMatmulDesc_t desc;
      CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      cublasLtMatrixLayout_t la, lb, lc;
      CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k));
      CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, m, s.k));
      CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, s.n, m, s.n));
      cublasLtMatmulPreference_t pref;
      CHECK(cublasLtMatmulPreferenceCreate(&pref));
      CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                 sizeof(workspace_bytes)));
      cublasLtMatmulHeuristicResult_t results[64];
      int found = 0;
      CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 64, results, &found));
      float best = 1e30f;
      int best_i = -1;
      for (int i = 0; i < found; ++i) {
        if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
        const float t = time_us(
            [&](int c) {
              cublasLtMatmul(lt, desc, &one, w[c], la, x, lb, &zero, y, lc, y, lc, &results[i].algo, workspace,
                             workspace_bytes, stream);
            },
            copies, stream);
        if (t < best) best = t, best_i = i;
      }
      int tile = -1, stages = -1, split = -1;
      size_t written = 0;
      if (best_i >= 0) {
        cublasLtMatmulAlgoConfigGetAttribute(&results[best_i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written);
        cublasLtMatmulAlgoConfigGetAttribute(&results[best_i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &written);
        cublasLtMatmulAlgoConfigGetAttribute(&results[best_i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split), &written);
      }
      std::printf("%-18s %4d %8.2fus %8.2fus %6d  #%d tile %d stages %d split %d\n", s.name, m, t_default, best, found, best_i,
                  tile, stages, split);
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(desc);
    }
    for (void* p : w) cudaFree(p);
    cudaFree(x), cudaFree(y);
  }
  return 0;
}
