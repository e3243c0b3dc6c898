// C++ CPU kernel of pairwise_cosine_stats: the fused epilogue over tiles of dot products.
// Plain C++ (no torch headers); the tile GEMMs are done by the caller (csrc/pairwise_cosine_stats_ops.cpp, BLAS).
#pragma once
#include <cstdint>
#include <vector>

#include "../pairwise_cosine_stats_epilogue.h"

namespace repcap {
namespace cpu {

// What one thread accumulates: the histogram slots (bins, then below, above) and a row buffer.
struct ThreadCounts {
  ThreadCounts(const HistogramSpec& spec, int64_t max_cols)
      : slots(static_cast<size_t>(spec.bins) + 2, 0), row_slots(static_cast<size_t>(max_cols)) {}
  std::vector<int64_t> slots;
  std::vector<int32_t> row_slots;
  int64_t pairs = 0;
};

// One tile, on the calling thread. dots: rows x cols (leading dimension ld) of a_i·b_j for
// i in [row0, row0+rows), j in [col0, col0+cols); upper_only keeps only j > i.
// Row r's Σc, Σc², min, max are merged into row_partials[r]: tiles of one row must be given in
// column order, so the float64 sums do not depend on the thread that runs them.
void reduce_tile(const float* dots, int64_t ld, int64_t rows, int64_t cols, int64_t row0,
                 int64_t col0, bool upper_only, const float* a_inv_norm, const float* b_inv_norm,
                 const HistogramSpec& spec, ThreadCounts* counts, CosinePartial* row_partials);

}  // namespace cpu
}  // namespace repcap
