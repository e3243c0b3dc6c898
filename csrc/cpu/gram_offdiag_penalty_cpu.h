// C++ CPU kernel of gram_offdiag_penalty: the row epilogue over a tile of Gram entries.
// Plain C++ (no torch headers); the tile GEMMs are done by the caller (BLAS, in
// csrc/gram_offdiag_penalty_ops.cpp).
#pragma once
#include <cstdint>

#include "../gram_offdiag_penalty_epilogue.h"
#include "../kernel_settings.h"

namespace repcap {
namespace cpu {

// One row of a Gram tile, g[0..cols) = x_i·x_j for j in [col0, col0 + cols); diag = i - col0
// when the diagonal lies in the tile, else -1 (the diagonal entry is set to 0 and skipped).
// Updates the row's running maximum *row_max and *row_sum (s = Σ r^p, rescaled to the new
// maximum); when write_weights, overwrites g with the weights sign(g)·r^(p-1). Returns beta, the
// factor by which the caller must rescale the row's accumulated gradient direction first.
template <typename T>
T penalty_row_update(T* g, int64_t cols, int64_t diag, int32_t p, T* row_max, double* row_sum,
                     bool write_weights);

// v[0..n) ← round_operand(v, precision) (csrc/operand_rounding.h): the CPU emulation of the
// tensor-core operand formats, applied to x and to each tile of weights before the GEMMs.
void round_operands(float* v, int64_t n, Precision precision);

}  // namespace cpu
}  // namespace repcap
