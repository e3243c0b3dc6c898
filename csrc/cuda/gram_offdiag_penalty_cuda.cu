// CUDA row epilogue of gram_offdiag_penalty over a Gram panel (see gram_offdiag_penalty_cuda.h).
// The elementwise math is the shared host/device code in gram_offdiag_penalty_epilogue.h.
#include <cuda_runtime.h>

#include <cstdint>

#include "../gram_offdiag_penalty_epilogue.h"
#include "../operand_rounding.h"
#include "block_reduce.cuh"
#include "gram_offdiag_penalty_cuda.h"

namespace repcap {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// One block per panel row r:
//   t = max_{c ≠ diag} |g_rc|,  m_new = max(m_old, t),  1/m_new,
//   s ← s·(m_old/m_new)^p + Σ_c min(|g_rc|/m_new, 1)^p   (float64),
//   g_rc ← round_operand(sign(g_rc)·min(|g_rc|/m_new, 1)^(p-1), rounding)   (0 on the diagonal).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    gram_offdiag_penalty_epilogue_kernel(T* __restrict__ g, int64_t ld, int64_t cols, int64_t row0,
                                         int64_t col0, int32_t p, T* __restrict__ row_max,
                                         double* __restrict__ row_sum, T* __restrict__ beta,
                                         bool write_weights, Precision rounding) {
  __shared__ double shared_sum[kThreads];
  __shared__ T shared_max[kThreads];
  __shared__ T shared_inv_max;
  const int64_t r = blockIdx.x;
  T* row = g + r * ld;
  const int64_t diag = row0 + r - col0;  // column of the diagonal entry, may be outside

  T local_max = T(0);
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    const T v = row[c];
    const T a = (c == diag) ? T(0) : (v < T(0) ? -v : v);
    local_max = a > local_max ? a : local_max;
  }
  const T tile_max = block_reduce<kThreads>(local_max, shared_max, MaxOp());
  const T m_old = row_max[r];
  const T m_new = tile_max > m_old ? tile_max : m_old;
  const PenaltyRescale<T> rescale = penalty_rescale(m_old, m_new, p);
  if (threadIdx.x == 0) shared_inv_max = rescale.inv_max;
  __syncthreads();
  const T inv_max = shared_inv_max;

  double local_sum = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    const T v = (c == diag) ? T(0) : row[c];
    const PenaltyTerm<T> t = penalty_term(v, inv_max, p);
    local_sum += static_cast<double>(t.term);
    if (write_weights) row[c] = round_operand(t.weight, rounding);
  }
  const double total = block_reduce<kThreads>(local_sum, shared_sum, SumOp());
  if (threadIdx.x == 0) {
    row_sum[r] = row_sum[r] * rescale.alpha + total;
    row_max[r] = m_new;
    beta[r] = rescale.beta;
  }
}

template <typename T>
const char* launch(T* g, int64_t ld, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                   int32_t p, T* row_max, double* row_sum, T* beta, bool write_weights,
                   Precision rounding, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return nullptr;
  if (rows > 0x7fffffffLL) return "gram_offdiag_penalty: too many rows in one panel";
  gram_offdiag_penalty_epilogue_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      g, ld, cols, row0, col0, p, row_max, row_sum, beta, write_weights, rounding);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace

const char* gram_offdiag_penalty_epilogue_cuda(float* g, int64_t ld, int64_t rows, int64_t cols,
                                              int64_t row0, int64_t col0, int32_t p, float* row_max,
                                              double* row_sum, float* beta, bool write_weights, Precision rounding,
                                              cudaStream_t stream) {
  return launch(g, ld, rows, cols, row0, col0, p, row_max, row_sum, beta, write_weights, rounding, stream);
}

const char* gram_offdiag_penalty_epilogue_cuda(double* g, int64_t ld, int64_t rows, int64_t cols,
                                              int64_t row0, int64_t col0, int32_t p, double* row_max,
                                              double* row_sum, double* beta, bool write_weights, Precision rounding,
                                              cudaStream_t stream) {
  return launch(g, ld, rows, cols, row0, col0, p, row_max, row_sum, beta, write_weights, rounding, stream);
}

}  // namespace cuda
}  // namespace repcap
