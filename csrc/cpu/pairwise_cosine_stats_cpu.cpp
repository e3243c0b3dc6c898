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
      thread_hist_(static_cast<size_t>(num_threads_) * (spec.bins + 2), 0) {}

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

void PairwiseCosineStatsAccumulator::accumulate_tile(const float* dots, int64_t ld, int64_t rows,
                                                     int64_t cols, int64_t row0, int64_t col0,
                                                     bool upper_only, const float* a_inv_norm,
                                                     const float* b_inv_norm) {
  int64_t kept = 0;
  const size_t slots_per_thread = thread_slots_.size() / num_threads_;
  if (slots_per_thread < static_cast<size_t>(cols)) {
    thread_slots_.assign(static_cast<size_t>(cols) * num_threads_, 0);
  }
#pragma omp parallel for schedule(static) num_threads(num_threads_) reduction(+ : kept)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row0 + r;
    // Upper triangle: columns j > i only.
    const int64_t first = upper_only ? std::min(cols, std::max<int64_t>(0, i + 1 - col0)) : 0;
    const size_t t = static_cast<size_t>(thread_id());
    reduce_row(dots + r * ld, b_inv_norm + col0, a_inv_norm[i], first, cols, spec_,
               thread_slots_.data() + t * static_cast<size_t>(cols),
               thread_hist_.data() + t * static_cast<size_t>(spec_.bins + 2),
               &row_partials_[static_cast<size_t>(r)]);
    kept += cols - first;
  }
  for (int64_t r = 0; r < rows; ++r) merge_partial(&total_, row_partials_[static_cast<size_t>(r)]);
  count_ += kept;
}

int64_t PairwiseCosineStatsAccumulator::slot_total(int32_t slot) const {
  int64_t n = 0;
  const size_t stride = static_cast<size_t>(spec_.bins) + 2;
  for (int t = 0; t < num_threads_; ++t) n += thread_hist_[t * stride + static_cast<size_t>(slot)];
  return n;
}

int64_t PairwiseCosineStatsAccumulator::below() const { return slot_total(spec_.bins); }

int64_t PairwiseCosineStatsAccumulator::above() const { return slot_total(spec_.bins + 1); }

void PairwiseCosineStatsAccumulator::histogram(int64_t* out) const {
  for (int32_t b = 0; b < spec_.bins; ++b) out[b] = slot_total(b);
}

}  // namespace cpu
}  // namespace repcap
