// CUDA error handling: launchers turn CUDA and cuBLAS errors into a Status naming the call; NIB_CUDA_CHECK is
// for programmer errors only (it aborts with file:line).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/status.h"

namespace nibble::cuda {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return Status::error(std::string(what) + ": " + cudaGetErrorString(err));
}

inline Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status::error(std::string(what) + ": cuBLAS " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) +
                       ")");
}

}  // namespace nibble::cuda

#define NIB_CUDA_CHECK(call)                                                                                         \
  do {                                                                                                               \
    cudaError_t nib_err_ = (call);                                                                                   \
    if (nib_err_ != cudaSuccess) {                                                                                   \
      std::fprintf(stderr, "%s:%d: CUDA error %s in %s\n", __FILE__, __LINE__, cudaGetErrorString(nib_err_), #call); \
      std::abort();                                                                                                  \
    }                                                                                                                \
  } while (0)
