// The CUDA kernel of grassmann_normals: one thread per group of 4 normals, the same
// philox::fill_group as the CPU kernel (csrc/grassmann_normals.h), so the words are bitwise the
// CPU's and the normals differ from them only by the device's log, cos and sin rounding.
#include <cuda_runtime.h>

#include "grassmann_normals_cuda.h"
#include "../grassmann_normals.h"

namespace repcap {
namespace cuda {
namespace {

constexpr int kThreads = 256;

__global__ void grassmann_normals_kernel(uint64_t seed, uint64_t first_basis, int64_t per_basis,
                                         int64_t groups_per_basis, int64_t groups, double* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    philox::fill_group(seed, first_basis, per_basis, groups_per_basis, g, out);
  }
}

}  // namespace

const char* grassmann_normals_cuda(uint64_t seed, uint64_t first_basis, int64_t n_bases, int64_t per_basis,
                                   double* out, cudaStream_t stream) {
  const int64_t groups_per_basis = (per_basis + 3) / 4;
  const int64_t groups = n_bases * groups_per_basis;
  if (groups == 0) return nullptr;
  const int64_t wanted = (groups + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(wanted < 65535 * 16 ? wanted : 65535 * 16);  // grid-stride beyond
  grassmann_normals_kernel<<<blocks, kThreads, 0, stream>>>(seed, first_basis, per_basis, groups_per_basis, groups,
                                                            out);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace cuda
}  // namespace repcap
