// Pair-distance keys and the tie-aware rank merge of subspace PGA, shared by the C++ CPU kernel
// and the CUDA kernel. Plain C++ (no torch headers).
//
// For rows p̂_i (unit vectors of one subspace's projection), the pairs i<j are taken in SciPy's
// condensed order, pair(i, j) = i·n − i(i+1)/2 + (j − i − 1), with distance 1 − p̂_i·p̂_j
// (clamped to [0, 2] as SciPy does). Each
// distance becomes an unsigned key whose integer order is the float order, so a radix sort
// sorts the pairs by distance. A run [start, end) of equal keys in sorted order shares the
// average 1-based rank (start + end − 1)/2 + 1 (scipy.stats.rankdata, method="average").
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "host_device.h"

namespace repcap {

REPCAP_HD int64_t condensed_pair_index(int64_t i, int64_t j, int64_t n) {
  return i * n - i * (i + 1) / 2 + (j - i - 1);
}

// Order-preserving map of IEEE floats to unsigned integers (negative values flipped whole,
// positive ones with the sign bit set): a < b  ⇔  key(a) < key(b). −0 and +0 get different
// keys (−0 first), so callers pass canonical zeros (the distances are clamped to [0, 2]).
REPCAP_HD uint32_t sortable_key(float v) {
#if defined(__CUDA_ARCH__)
  const uint32_t bits = __float_as_uint(v);
#else
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
#endif
  return bits ^ ((bits >> 31) ? 0xffffffffu : 0x80000000u);
}

REPCAP_HD uint64_t sortable_key(double v) {
#if defined(__CUDA_ARCH__)
  const uint64_t bits = static_cast<uint64_t>(__double_as_longlong(v));
#else
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
#endif
  return bits ^ ((bits >> 63) ? 0xffffffffffffffffull : 0x8000000000000000ull);
}

// The average 1-based rank of the sorted positions [start, end) (a run of ties).
REPCAP_HD double average_rank(int64_t start, int64_t end) {
  return 0.5 * static_cast<double>(start + end - 1) + 1.0;
}

// Key extractors for the run search: the whole value, or the high word of a packed item
// (sortable key << 32 | payload), whose order is the key's.
struct WholeKey {
  template <typename V>
  REPCAP_HD V operator()(V v) const { return v; }
};
struct HighWord {
  REPCAP_HD uint32_t operator()(uint64_t v) const { return static_cast<uint32_t>(v >> 32); }
};

// The run of keys equal to key_of(sorted[t]) in n sorted values: [run_start, run_end).
// Galloping then binary search from t, O(log run length): runs are short except for exact ties
// (one-hot rows give runs of thousands). Shared by the CPU scan and the CUDA per-position pass.
template <typename V, typename KeyOf = WholeKey>
REPCAP_HD int64_t run_start(const V* sorted, int64_t t, KeyOf key_of = KeyOf()) {
  const auto key = key_of(sorted[t]);
  int64_t inside = t, step = 1;  // key_of(sorted[inside]) == key; find the first such position
  while (inside - step >= 0 && key_of(sorted[inside - step]) == key) {
    inside -= step;
    step *= 2;
  }
  int64_t lo = inside - step + 1 > 0 ? inside - step + 1 : 0;  // sorted[lo-1] < key (or lo = 0)
  int64_t hi = inside;
  while (lo < hi) {  // first position in [lo, hi] equal to key
    const int64_t mid = lo + (hi - lo) / 2;
    if (key_of(sorted[mid]) == key) hi = mid; else lo = mid + 1;
  }
  return lo;
}

template <typename V, typename KeyOf = WholeKey>
REPCAP_HD int64_t run_end(const V* sorted, int64_t n, int64_t t, KeyOf key_of = KeyOf()) {
  const auto key = key_of(sorted[t]);
  int64_t inside = t, step = 1;  // key_of(sorted[inside]) == key; find one past the last
  while (inside + step < n && key_of(sorted[inside + step]) == key) {
    inside += step;
    step *= 2;
  }
  int64_t lo = inside + 1;
  int64_t hi = inside + step < n ? inside + step : n;  // sorted[hi] > key (or hi = n)
  while (lo < hi) {  // first position in [lo, hi) greater than key
    const int64_t mid = lo + (hi - lo) / 2;
    if (key_of(sorted[mid]) == key) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// The average rank of sorted position t: t + 1 unless a neighbour holds the same key (the CUDA
// pass evaluates every position independently).
template <typename V, typename KeyOf = WholeKey>
REPCAP_HD double average_rank_at(const V* sorted, int64_t n, int64_t t, KeyOf key_of = KeyOf()) {
  const auto key = key_of(sorted[t]);
  const bool tied = (t > 0 && key_of(sorted[t - 1]) == key) || (t + 1 < n && key_of(sorted[t + 1]) == key);
  return tied ? average_rank(run_start(sorted, t, key_of), run_end(sorted, n, t, key_of))
              : static_cast<double>(t + 1);
}

// Partial sums of the rank correlation against reference ranks s (mean m = (n+1)/2, which is
// exact for average ranks): Σ (r−m)(s−m) and Σ (r−m)², for r the average ranks of one run.
struct RankCorrelationPartial {
  double cross;
  double sum_sq;
};

// Adds one pair: average rank r of its sorted position, reference rank s = twice_ref/2 (exact).
REPCAP_HD void add_rank_pair(RankCorrelationPartial* p, double rank, uint32_t twice_ref, double mean) {
  const double r = rank - mean;
  p->cross += r * (0.5 * static_cast<double>(twice_ref) - mean);
  p->sum_sq += r * r;
}

// Spearman's ρ = Σ(r−m)(s−m) / sqrt(Σ(r−m)² · Σ(s−m)²); NaN when either side is constant.
REPCAP_HD double rank_correlation(const RankCorrelationPartial& p, double ref_sum_sq) {
  const double den = p.sum_sq * ref_sum_sq;
  return den > 0.0 ? p.cross / sqrt(den) : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace repcap
