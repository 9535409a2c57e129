// NIB_HD marks functions compiled for both the host and CUDA devices; plain inline in host-only code.
#pragma once

#if defined(__CUDACC__)
#define NIB_HD __host__ __device__ __forceinline__
#else
#define NIB_HD inline
#endif
