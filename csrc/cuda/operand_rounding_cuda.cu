// Operand rounding on the GPU (see operand_rounding_cuda.h); the rounding itself is the shared
// host/device code of csrc/operand_rounding.h.
#include <cuda_runtime.h>

#include <cstdint>

#include "../operand_rounding.h"
#include "operand_rounding_cuda.h"

namespace repcap {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// v_i ← round_operand(v_i, precision), a grid-stride loop.
__global__ void __launch_bounds__(kThreads) round_operands_kernel(float* __restrict__ v, int64_t n,
                                                                   Precision precision) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    v[i] = round_operand(v[i], precision);
  }
}

}  // namespace

const char* round_operands_cuda(float* v, int64_t n, Precision precision, cudaStream_t stream) {
  if (n <= 0 || precision == Precision::kHighest) return nullptr;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  round_operands_kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), kThreads, 0, stream>>>(
      v, n, precision);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace cuda
}  // namespace repcap
