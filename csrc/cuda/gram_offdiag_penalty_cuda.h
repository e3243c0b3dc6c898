// CUDA launcher interface of gram_offdiag_penalty's row epilogue (no torch headers; driven by
// csrc/gram_offdiag_penalty_ops.cpp, which forms the Gram panels and the weight products with
// cuBLAS through ATen).
#pragma once
#include <cstdint>

#include "../kernel_settings.h"

typedef struct CUstream_st* cudaStream_t;

namespace repcap {
namespace cuda {

// For each row r of a rows x cols panel g (leading dimension ld) of Gram entries
// g[r][c] = x_{row0+r}·x_{col0+c}: the diagonal entry (row0 + r == col0 + c) counts as 0;
// row_max[r] ← m_new = max(row_max[r], max_c |g[r][c]|);
// row_sum[r] ← row_sum[r]·(m_old/m_new)^p + Σ_c (|g[r][c]|/m_new)^p;
// beta[r] = (m_old/m_new)^(p-1), the factor for the row's accumulated gradient direction;
// when write_weights, g[r][c] ← round_operand(sign(g)·(|g|/m_new)^(p-1), rounding)
// (csrc/operand_rounding.h: the weights as the next GEMM's TF32 or bfloat16 operand; float64
// panels are never rounded). One block per row, fixed-order reductions (deterministic). Returns
// nullptr on success, else a static error message.
const char* gram_offdiag_penalty_epilogue_cuda(float* g, int64_t ld, int64_t rows, int64_t cols,
                                              int64_t row0, int64_t col0, int32_t p, float* row_max,
                                              double* row_sum, float* beta, bool write_weights, Precision rounding,
                                              cudaStream_t stream);
const char* gram_offdiag_penalty_epilogue_cuda(double* g, int64_t ld, int64_t rows, int64_t cols,
                                              int64_t row0, int64_t col0, int32_t p, double* row_max,
                                              double* row_sum, double* beta, bool write_weights, Precision rounding,
                                              cudaStream_t stream);

}  // namespace cuda
}  // namespace repcap
