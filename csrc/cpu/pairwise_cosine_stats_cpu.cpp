#include "pairwise_cosine_stats_cpu.h"

#include <algorithm>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace repcap {
namespace cpu {

namespace {
int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}
}  // namespace

PairwiseCosineStatsAccumulator::PairwiseCosineStatsAccumulator(HistogramSpec spec,
                                                               int64_t max_tile_rows)
    : spec_(spec),
      num_threads_(std::max(1, max_threads())),
      total_(empty_partial()),
      row_partials_(static_cast<size_t>(max_tile_rows)),
      thread_hist_(static_cast<size_t>(num_threads_) * spec.bins, 0),
      thread_outside_(static_cast<size_t>(num_threads_) * 2, 0) {}

// For each kept (i, j): c = clamp(dot_ij / (‖a_i‖‖b_j‖)); Σc, Σc² in float64 per row, min, max,
// hist[bin(c)] += 1.
void PairwiseCosineStatsAccumulator::accumulate_tile(float* dots, int64_t ld, int64_t rows,
                                                     int64_t cols, int64_t row0, int64_t col0,
                                                     bool upper_only, const float* a_inv_norm,
                                                     const float* b_inv_norm) {
  int64_t kept = 0;
#pragma omp parallel for schedule(static) num_threads(num_threads_) reduction(+ : kept)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row0 + r;
    // Upper triangle: columns j > i only.
    const int64_t first = upper_only ? std::min(cols, std::max<int64_t>(0, i + 1 - col0)) : 0;
    float* row = dots + r * ld;
    const float inv_a = a_inv_norm[i];
    const float* inv_b = b_inv_norm + col0;
    double sum = 0.0, sum_sq = 0.0;
    float lo = INFINITY, hi = -INFINITY;
#pragma omp simd reduction(+ : sum, sum_sq) reduction(min : lo) reduction(max : hi)
    for (int64_t j = first; j < cols; ++j) {
      const float c = cosine_from_dot(row[j], inv_a, inv_b[j]);
      row[j] = c;
      const double cd = c;
      sum += cd;
      sum_sq += cd * cd;
      lo = std::min(lo, c);
      hi = std::max(hi, c);
    }
    const int t = thread_id();
    int64_t* hist = thread_hist_.data() + static_cast<size_t>(t) * spec_.bins;
    int64_t* outside = thread_outside_.data() + static_cast<size_t>(t) * 2;
    for (int64_t j = first; j < cols; ++j) {
      const int32_t b = histogram_bin(row[j], spec_);
      if (b >= 0) {
        ++hist[b];
      } else {
        ++outside[b == kBinBelow ? 0 : 1];
      }
    }
    CosinePartial& p = row_partials_[static_cast<size_t>(r)];
    p.sum = sum;
    p.sum_sq = sum_sq;
    p.min = lo;
    p.max = hi;
    kept += cols - first;
  }
  for (int64_t r = 0; r < rows; ++r) merge_partial(&total_, row_partials_[static_cast<size_t>(r)]);
  count_ += kept;
}

int64_t PairwiseCosineStatsAccumulator::below() const {
  int64_t n = 0;
  for (int t = 0; t < num_threads_; ++t) n += thread_outside_[static_cast<size_t>(t) * 2];
  return n;
}

int64_t PairwiseCosineStatsAccumulator::above() const {
  int64_t n = 0;
  for (int t = 0; t < num_threads_; ++t) n += thread_outside_[static_cast<size_t>(t) * 2 + 1];
  return n;
}

void PairwiseCosineStatsAccumulator::histogram(int64_t* out) const {
  std::fill(out, out + spec_.bins, int64_t{0});
  for (int t = 0; t < num_threads_; ++t) {
    const int64_t* hist = thread_hist_.data() + static_cast<size_t>(t) * spec_.bins;
    for (int32_t b = 0; b < spec_.bins; ++b) out[b] += hist[b];
  }
}

}  // namespace cpu
}  // namespace repcap
