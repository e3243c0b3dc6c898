// CUDA launcher interface of grassmann_normals (no torch headers; driven by
// csrc/grassmann_normals_ops.cpp, which owns the output).
#pragma once
#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace repcap {
namespace cuda {

// out[b·per_basis + e] = normal e of basis first_basis + b (csrc/grassmann_normals.h), one thread
// per group of 4 normals. Returns nullptr on success, else a static error message.
const char* grassmann_normals_cuda(uint64_t seed, uint64_t first_basis, int64_t n_bases, int64_t per_basis,
                                   double* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace repcap
