// C++ CPU kernel of pairwise_cosine_stats: the fused epilogue over one tile of dot products.
// Plain C++ (no torch headers); the tile GEMM is done by the caller (csrc/bindings.cpp, BLAS).
#pragma once
#include <cstdint>
#include <vector>

#include "../pairwise_cosine_stats_epilogue.h"

namespace repcap {
namespace cpu {

// Accumulates count, Σc, Σc², min, max and the histogram of the cosines of dot-product tiles.
// Deterministic whatever the thread count: each tile row is reduced by one thread into its own
// float64 slot, and the slots are merged in row order; histogram counts are integers.
class PairwiseCosineStatsAccumulator {
 public:
  PairwiseCosineStatsAccumulator(HistogramSpec spec, int64_t max_tile_rows);

  // dots: rows x cols (leading dimension ld) of a_i·b_j for i in [row0, row0+rows),
  // j in [col0, col0+cols). upper_only keeps only j > i.
  void accumulate_tile(const float* dots, int64_t ld, int64_t rows, int64_t cols, int64_t row0,
                       int64_t col0, bool upper_only, const float* a_inv_norm,
                       const float* b_inv_norm);

  const CosinePartial& partial() const { return total_; }
  int64_t count() const { return count_; }
  int64_t below() const;
  int64_t above() const;
  // Writes the merged histogram (spec.bins counts) to out.
  void histogram(int64_t* out) const;

 private:
  HistogramSpec spec_;
  int num_threads_;
  CosinePartial total_;
  int64_t count_ = 0;
  std::vector<CosinePartial> row_partials_;
  int64_t slot_total(int32_t slot) const;

  std::vector<int64_t> thread_hist_;   // num_threads x (bins + 2): bins, then below, above
  std::vector<int32_t> thread_slots_;  // num_threads x tile columns: histogram slots of a row
};

}  // namespace cpu
}  // namespace repcap
