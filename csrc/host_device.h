// REPCAP_HD marks the inline math shared by the C++ CPU kernels and the CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define REPCAP_HD __host__ __device__ __forceinline__
#else
#define REPCAP_HD inline
#endif
