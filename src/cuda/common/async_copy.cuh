// cp.async copies and shared-memory mbarriers for producer/consumer kernels on sm_90 (PTX ISA,
// "Data Movement and Conversion Instructions: cp.async" and "Parallel Synchronization and
// Communication Instructions: mbarrier").
#pragma once

#include <cstdint>

namespace nibble::cuda {

__device__ __forceinline__ uint32_t smem_address(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// SIZE bytes (4, 8 or 16) global → shared (a shared-state-space address, smem_address), of which the
// first bytes_valid are read and the rest zero-filled (0: a zero chunk, nothing read). 16-byte copies
// bypass L1 (.cg; smaller sizes cannot).
template <int SIZE>
__device__ __forceinline__ void cp_async_shared(uint32_t smem, const void* gmem, int bytes_valid) {
  static_assert(SIZE == 4 || SIZE == 8 || SIZE == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (SIZE == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(bytes_valid));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem), "l"(gmem), "n"(SIZE), "r"(bytes_valid));
}
// The same, every byte read (no zero-fill operand).
template <int SIZE>
__device__ __forceinline__ void cp_async_shared(uint32_t smem, const void* gmem) {
  static_assert(SIZE == 4 || SIZE == 8 || SIZE == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (SIZE == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem), "l"(gmem), "n"(SIZE));
}
template <int SIZE>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem, int bytes_valid) {
  cp_async_shared<SIZE>(smem_address(smem), gmem, bytes_valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void barrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// Arrives on the barrier at shared address `bar` once every cp.async this thread issued so far has
// landed (counted in its init).
__device__ __forceinline__ void barrier_arrive_on_copies_shared(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void barrier_arrive_on_copies(uint64_t* bar) {
  barrier_arrive_on_copies_shared(smem_address(bar));
}
// Arrives on the barrier and adds `bytes` to the transfer count its phase waits for (bulk copies below).
__device__ __forceinline__ void barrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// Adds `bytes` to the transfer count of the barrier's current phase, without arriving (the copies are
// another thread's arrival's: PTX mbarrier.expect_tx).
__device__ __forceinline__ void barrier_expect_tx_shared(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// The copy engine brings the box at coordinates (x, y) of a 2-D tensor map (a __grid_constant__ kernel
// parameter or global memory) to shared address `smem`, counted on `bar` (PTX cp.async.bulk.tensor).
__device__ __forceinline__ void tma_load_2d(uint32_t smem, const void* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(smem),
      "l"(map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
// Makes barrier_init's barriers visible to the bulk-copy (async) proxy; then a __syncthreads before use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// The copy engine (TMA) moves `bytes` (a multiple of 16; both addresses 16-byte aligned) global → shared
// and counts them on `bar` (PTX cp.async.bulk ... mbarrier::complete_tx::bytes).
__device__ __forceinline__ void bulk_copy_to_shared(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_address(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_address(bar)), "r"(parity)
                 : "memory");
}

}  // namespace nibble::cuda
