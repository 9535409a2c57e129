// How many bytes a second the SMs can pull from L2 and from DRAM, by access form: 16-byte loads that
// skip L1 (ld.global.cg), 16-byte cp.async into a shared-memory ring (the wgmma producer's form), and
// cp.async of 128-byte rows in scattered order (gate_up's activation gather). Buffers of 16 and 32 MB
// (L2-resident) and 4 GB (DRAM); prints a table row per (form, size, launch shape). Then the skinny
// MoE's weight stream from DRAM: a warp a 16 KB slice, read in row-strided or contiguous k-blocks.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e = (x);                                                              \
    if (e != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

// Every thread reads 16-byte words strided by the grid, UNROLL loads in flight, `passes` times over.
template <int UNROLL>
__global__ void load_cg(const uint4* __restrict__ data, size_t words, int passes, uint32_t* sink) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  for (int pass = 0; pass < passes; ++pass) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += stride * UNROLL) {
      uint4 v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const size_t j = i + u * stride;
        if (j < words)
          asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                       : "l"(data + j));
        else v[u] = make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads
}

// cp.async 16 bytes a thread into a ring of STAGES shared stages (blockDim.x × 16 bytes each), a
// commit group a stage, waiting only for the stage STAGES − 1 back: the copies never touch registers.
// GATHER: thread t of a stage copies chunk t % 8 of row h(r) (a multiplicative hash of r mod `rows`,
// no index load in the way), r = the stage's row t / 8: 128-byte rows in scattered order, as gate_up's
// producer copies its activation rows of a 64-wide k-step.
template <int STAGES, bool GATHER>
__global__ void copy_async(const uint8_t* __restrict__ data, size_t bytes, int rows, int passes, uint32_t* sink) {
  extern __shared__ __align__(16) uint8_t ring[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(ring)) + threadIdx.x * 16;
  const size_t stage_bytes = size_t(blockDim.x) * 16, step = stage_bytes * gridDim.x;
  const size_t per_pass = bytes / step;  // stages a CTA copies a pass
  int slot = 0;
  for (int pass = 0; pass < passes; ++pass) {
    for (size_t s = 0; s < per_pass; ++s) {
      const uint8_t* src;
      if constexpr (GATHER) {
        const size_t row = (size_t(blockIdx.x) + s * gridDim.x) * (blockDim.x / 8) + threadIdx.x / 8;
        src = data + size_t(uint32_t(row * 2654435761u) % uint32_t(rows)) * 128 + (threadIdx.x % 8) * 16;
      } else {
        src = data + s * step + blockIdx.x * stage_bytes + threadIdx.x * 16;
      }
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(base + slot * uint32_t(stage_bytes)), "l"(src) : "memory");
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 1) : "memory");
      if (++slot == STAGES) slot = 0;
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  if (ring[threadIdx.x] == 0x5a && threadIdx.x == 0x7fff) *sink = 1;
}

float time_ms(cudaStream_t stream, int reps, const auto& launch) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  launch();  // warm: the buffer into L2 where it fits
  CHECK(cudaEventRecord(a, stream));
  for (int r = 0; r < reps; ++r) launch();
  CHECK(cudaEventRecord(b, stream));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  CHECK(cudaGetLastError());
  return ms / reps;
}

// The cp.async forms at one CTA an SM of 4, 8 or 16 warps (the wgmma kernel's producer is 4), and
// two of 8: one table row each. `rows`: the gathered form's row count (its buffer is rows × 128 bytes).
template <bool GATHER>
void copy_rows(cudaStream_t stream, const uint8_t* data, size_t bytes, int rows, int passes, int sms, uint32_t* sink,
               size_t buffer_mb) {
  for (auto [ctas_per_sm, threads] : {std::pair{1, 128}, std::pair{1, 256}, std::pair{1, 512}, std::pair{2, 256}}) {
    const int ctas = sms * ctas_per_sm;
    constexpr int STAGES = 8;
    const int smem = STAGES * threads * 16;
    auto kernel = copy_async<STAGES, GATHER>;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const float ms = time_ms(stream, 5, [&] { kernel<<<ctas, threads, smem, stream>>>(data, bytes, rows, passes, sink); });
    const size_t stage = size_t(threads) * 16 * ctas, moved = bytes / stage * stage * passes;
    std::printf("| cp.async 16 B%s, 8 stages | %zu MB | %d x %d | %.2f |\n", GATHER ? " of gathered 128 B rows" : "",
                buffer_mb, ctas, threads, double(moved) / (ms * 1e-3) / 1e12);
  }
}


// The skinny MoE's weight reads (skinny_moe.cu's long warps): each warp streams one 16 KB slice of 16
// rows × 1 KB in 16 k-blocks, lane (g, c) = (lane / 4, lane % 4) taking 16 bytes of two rows a block.
// ROWS: the checkpoint's row-major layout (block kb of row r at r · 1 KB + kb · 64: each load touches 8
// rows 1 KB apart); otherwise the block's 1 KB is contiguous (a layout tiled by k-block). WINDOW blocks
// in flight (block kb + WINDOW issued once kb is used), then DELAY dependent integer ops a block in
// place of the decode and mma. 128 threads, 8 CTAs an SM, as the kernel runs at 16-row tiles.
// L2_FETCH: the loads' L2 prefetch size hint (0: none, 128 or 256 bytes).
template <int L2_FETCH>
__device__ __forceinline__ uint4 load_weights(const uint8_t* p) {
  uint4 v;
  if constexpr (L2_FETCH == 256)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z),
                 "=r"(v.w) : "l"(p));
  else if constexpr (L2_FETCH == 128)
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z),
                 "=r"(v.w) : "l"(p));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  return v;
}

template <int WINDOW, bool ROWS, int DELAY, int L2_FETCH = 0>
__global__ void __launch_bounds__(128, 8) weight_stream(const uint8_t* __restrict__ data, uint32_t* sink) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const uint8_t* slice = data + (size_t(blockIdx.x) * 4 + (threadIdx.x >> 5)) * 16384;
  auto at = [&](int kb, int h) {
    return ROWS ? slice + (g + 8 * h) * 1024 + kb * 64 + c * 16 : slice + kb * 1024 + h * 512 + lane * 16;
  };
  uint4 v[WINDOW][2];
#pragma unroll
  for (int j = 0; j < WINDOW; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) v[j][h] = load_weights<L2_FETCH>(at(j, h));
  uint32_t acc = lane;
#pragma unroll
  for (int kb = 0; kb < 16; ++kb) {
    const int j = kb % WINDOW;
    acc ^= v[j][0].x ^ v[j][0].y ^ v[j][0].z ^ v[j][0].w ^ v[j][1].x ^ v[j][1].y ^ v[j][1].z ^ v[j][1].w;
#pragma unroll
    for (int d = 0; d < DELAY; ++d) acc = acc * 0x9e3779b1u + uint32_t(d);
    if (kb + WINDOW < 16)
#pragma unroll
      for (int h = 0; h < 2; ++h) v[j][h] = load_weights<L2_FETCH>(at(kb + WINDOW, h));
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

template <int WINDOW, bool ROWS, int DELAY, int L2_FETCH = 0>
void stream_row(cudaStream_t stream, const uint8_t* data, size_t bytes, uint32_t* sink) {
  const int ctas = int(bytes / (4 * 16384));
  const float ms =
      time_ms(stream, 5, [&] { weight_stream<WINDOW, ROWS, DELAY, L2_FETCH><<<ctas, 128, 0, stream>>>(data, sink); });
  std::printf("| weight stream, %s k-blocks, window %d, %d ops a block, L2 fetch %d | %zu MB | %d x 128 | %.2f |\n",
              ROWS ? "row-strided" : "contiguous", WINDOW, DELAY, L2_FETCH, bytes >> 20, ctas,
              double(bytes) / (ms * 1e-3) / 1e12);
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s: %d SMs, L2 %.0f MB\n", prop.name, sms, prop.l2CacheSize / 1e6);
  const size_t max_bytes = size_t(4) << 30;
  uint8_t* data = nullptr;
  uint32_t* sink = nullptr;
  CHECK(cudaMalloc(&data, max_bytes));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(data, 1, max_bytes));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  const size_t sizes[] = {size_t(16) << 20, size_t(32) << 20, max_bytes};
  std::printf("| form | buffer | CTAs x threads | TB/s |\n");
  for (size_t bytes : sizes) {
    // Passes so that each timed launch moves ≥ 4 GB.
    const int passes = int(std::max<size_t>(1, (size_t(4) << 30) / bytes));
    for (int ctas_per_sm : {2, 4}) {
      const int ctas = sms * ctas_per_sm, threads = 512;
      const float ms = time_ms(stream, 5, [&] {
        load_cg<8><<<ctas, threads, 0, stream>>>(reinterpret_cast<const uint4*>(data), bytes / 16, passes, sink);
      });
      std::printf("| ld.global.cg x8 | %zu MB | %d x %d | %.2f |\n", bytes >> 20, ctas, threads,
                  double(bytes) * passes / (ms * 1e-3) / 1e12);
    }
    copy_rows<false>(stream, data, bytes, 1, passes, sms, sink, bytes >> 20);
  }
  // Gathered 128-byte rows from a 16 MB activation buffer (gate_up at T = 2,048 reads 2,048 rows × 4 KB;
  // each k-step a CTA takes 128 bytes of N rows): 256 MB of them a pass.
  copy_rows<true>(stream, data, size_t(256) << 20, (16 << 20) / 128, 4, sms, sink, 16);
  // The skinny MoE's weight stream, over 2 GB (DRAM) and 256 MB (a layer's experts: DRAM too).
  for (size_t bytes : {size_t(2) << 30, size_t(256) << 20}) {
    stream_row<1, true, 0>(stream, data, bytes, sink);
    stream_row<1, false, 0>(stream, data, bytes, sink);
    stream_row<1, true, 64>(stream, data, bytes, sink);
    stream_row<1, false, 64>(stream, data, bytes, sink);
    stream_row<2, true, 64>(stream, data, bytes, sink);
    stream_row<2, false, 64>(stream, data, bytes, sink);
    stream_row<4, true, 64>(stream, data, bytes, sink);
    stream_row<4, false, 64>(stream, data, bytes, sink);
    stream_row<1, true, 64, 128>(stream, data, bytes, sink);
    stream_row<1, true, 64, 256>(stream, data, bytes, sink);
    stream_row<1, false, 64, 256>(stream, data, bytes, sink);
  }
  CHECK(cudaFree(data));
  return 0;
}
