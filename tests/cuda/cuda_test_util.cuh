// GPU test helpers: skip visibly where there is no CUDA device; random inputs; relative errors; device
// buffers that free themselves; NVFP4 codes and scales uploaded as the model loads them (repacked into the GPU layout).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda/common/check.cuh"
#include "cuda/gemm/linear_nvfp4.cuh"
#include "formats/bf16.h"

#define NIB_SKIP_WITHOUT_GPU()                                                   \
  do {                                                                           \
    int nib_n_devices_ = 0;                                                      \
    if (cudaGetDeviceCount(&nib_n_devices_) != cudaSuccess || nib_n_devices_ == 0) \
      GTEST_SKIP() << "no CUDA device: GPU test skipped";                         \
  } while (0)

namespace nibble::test {

// n normal(0, sd) values.
inline std::vector<float> random_f32(size_t n, std::mt19937_64& rng, float sd) {
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> out(n);
  for (auto& v : out) v = normal(rng);
  return out;
}

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) { NIB_CUDA_CHECK(cudaMalloc(&ptr_, n * sizeof(T) + 1)); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    NIB_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() { return ptr_; }
  std::vector<T> to_host() const {
    std::vector<T> out(n_);
    NIB_CUDA_CHECK(cudaMemcpy(out.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng, float mean, float sd) {
  std::normal_distribution<float> normal(mean, sd);
  std::vector<uint16_t> out(n);
  for (auto& v : out) v = formats::bf16_encode(normal(rng));
  return out;
}

// Max |a - b| / (|b| + floor) over all values.
inline double max_rel(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]) / (std::fabs(b[i]) + floor));
  return worst;
}

inline std::vector<float> decode(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = formats::bf16_decode(bits[i]);
  return out;
}

// A checkpoint's NVFP4 codes and E4M3 block scales on the GPU in its layout (cuda::repack_nvfp4), as
// the model's upload leaves them (line_order: an expert weight's, nvfp4_layout.h).
struct DeviceNvfp4 {
  DeviceBuffer<uint8_t> packed, scales;
  DeviceNvfp4(const std::vector<uint8_t>& host_packed, const std::vector<uint8_t>& host_scales, bool line_order = false)
      : packed(host_packed), scales(host_scales) {
    const Status s = host_packed.size() == 8 * host_scales.size()
                         ? cuda::repack_nvfp4(packed.get(), scales.get(), host_scales.size(), nullptr, line_order)
                         : Status::error("codes and scales differ in block count");
    if (!s.is_ok() || cudaStreamSynchronize(nullptr) != cudaSuccess) {
      std::fprintf(stderr, "DeviceNvfp4: %s\n", s.is_ok() ? "repack failed" : s.message().c_str());
      std::abort();
    }
  }
};

}  // namespace nibble::test
