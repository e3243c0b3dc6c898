// Block-wide reductions shared by the CUDA kernels. Plain CUDA, no torch headers.
#pragma once

namespace repcap {
namespace cuda {

// Fixed-order tree reduction over a block of kThreads threads (a power of two), so the result
// does not depend on the schedule: every thread passes its value and gets the block's result.
// `shared` holds kThreads values; it may be passed to the next call (the last barrier frees it).
template <int kThreads, typename V, typename Op>
__device__ V block_reduce(V value, V* shared, Op op) {
  static_assert((kThreads & (kThreads - 1)) == 0, "kThreads must be a power of two");
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + stride]);
    __syncthreads();
  }
  const V out = shared[0];
  __syncthreads();
  return out;
}

struct SumOp {
  template <typename V>
  __device__ V operator()(V a, V b) const { return a + b; }
};
struct MaxOp {
  template <typename V>
  __device__ V operator()(V a, V b) const { return a > b ? a : b; }
};
struct MinOp {
  template <typename V>
  __device__ V operator()(V a, V b) const { return a < b ? a : b; }
};

}  // namespace cuda
}  // namespace repcap
