#include "pairwise_cosine_stats_cpu.h"

#include <algorithm>

namespace repcap {
namespace cpu {

// One tile row: c_j = clamp(dot_j / (‖a_i‖‖b_j‖)) for j in [first, cols): Σc and Σc² in float64,
// min, max, and slot_j = histogram_slot(c_j) (branch-free, vectorized), then the counts.
// Compiled for AVX-512, AVX2 and the baseline; the loader picks the best the CPU has.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void reduce_row(const float* dots, const float* inv_b, float inv_a, int64_t first,
                       int64_t cols, const HistogramSpec& spec, int32_t* slots, int64_t* hist,
                       CosinePartial* out) {
  double sum = 0.0, sum_sq = 0.0;
  float lo = INFINITY, hi = -INFINITY;
#pragma omp simd reduction(+ : sum, sum_sq) reduction(min : lo) reduction(max : hi)
  for (int64_t j = first; j < cols; ++j) {
    const float c = cosine_from_dot(dots[j], inv_a, inv_b[j]);
    const double cd = c;
    sum += cd;
    sum_sq += cd * cd;
    lo = std::min(lo, c);
    hi = std::max(hi, c);
    slots[j] = histogram_slot(c, spec);
  }
  for (int64_t j = first; j < cols; ++j) ++hist[slots[j]];
  out->sum = sum;
  out->sum_sq = sum_sq;
  out->min = lo;
  out->max = hi;
}

void reduce_tile(const float* dots, int64_t ld, int64_t rows, int64_t cols, int64_t row0,
                 int64_t col0, bool upper_only, const float* a_inv_norm, const float* b_inv_norm,
                 const HistogramSpec& spec, ThreadCounts* counts, CosinePartial* row_partials) {
  if (counts->row_slots.size() < static_cast<size_t>(cols)) counts->row_slots.resize(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row0 + r;
    // Upper triangle: columns j > i only.
    const int64_t first = upper_only ? std::min(cols, std::max<int64_t>(0, i + 1 - col0)) : 0;
    CosinePartial tile_row;
    reduce_row(dots + r * ld, b_inv_norm + col0, a_inv_norm[i], first, cols, spec,
               counts->row_slots.data(), counts->slots.data(), &tile_row);
    merge_partial(&row_partials[r], tile_row);
    counts->pairs += cols - first;
  }
}

}  // namespace cpu
}  // namespace repcap
