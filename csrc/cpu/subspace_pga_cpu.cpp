#include "subspace_pga_cpu.h"

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

namespace repcap {
namespace cpu {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define REPCAP_PGA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define REPCAP_PGA_CLONES
#endif

template <typename T>
void write_distance_keys(const T* dots, int64_t ld, int64_t rows, int64_t cols, int64_t row0,
                         int64_t col0, int64_t n, typename KeyFor<T>::type* keys) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row0 + r;
    const int64_t first = std::max<int64_t>(0, i + 1 - col0);  // columns j > i
    if (first >= cols) continue;
    // The pairs (i, j), j = col0+first.., are consecutive in condensed order.
    typename KeyFor<T>::type* out = keys + condensed_pair_index(i, col0 + first, n);
    const T* row = dots + r * ld;
    for (int64_t c = first; c < cols; ++c) {
      const T dist = T(1) - row[c];  // clamped to [0, 2] like SciPy's pdist (also makes −0 +0)
      out[c - first] = sortable_key(std::min(T(2), std::max(T(0), dist)));
    }
  }
}

template <typename Key>
void radix_sort_pairs(Key* keys, uint32_t* values, Key* tmp_keys, uint32_t* tmp_values, int64_t n) {
  // 8-bit digits (256 buckets stay in L1 while scattering): 4 passes for 32-bit keys.
  constexpr int kBits = 8;
  constexpr int kBuckets = 1 << kBits;
  constexpr int kDigits = 8 * static_cast<int>(sizeof(Key)) / kBits;
  std::vector<int64_t> counts(static_cast<size_t>(kDigits) * kBuckets, 0);
  for (int64_t t = 0; t < n; ++t) {
    const Key key = keys[t];
    for (int digit = 0; digit < kDigits; ++digit) {
      ++counts[digit * kBuckets + ((key >> (kBits * digit)) & (kBuckets - 1))];
    }
  }
  bool in_tmp = false;  // ping-pong between (keys, values) and (tmp_keys, tmp_values)
  for (int digit = 0; digit < kDigits; ++digit) {
    int64_t* count = counts.data() + digit * kBuckets;
    if (*std::max_element(count, count + kBuckets) == n) continue;  // one bucket: a no-op
    int64_t offset = 0;
    for (int b = 0; b < kBuckets; ++b) {
      const int64_t here = count[b];
      count[b] = offset;
      offset += here;
    }
    const Key* src_keys = in_tmp ? tmp_keys : keys;
    const uint32_t* src_values = in_tmp ? tmp_values : values;
    Key* dst_keys = in_tmp ? keys : tmp_keys;
    uint32_t* dst_values = in_tmp ? values : tmp_values;
    const int shift = kBits * digit;
    for (int64_t t = 0; t < n; ++t) {
      const Key key = src_keys[t];
      const int64_t to = count[(key >> shift) & (kBuckets - 1)]++;
      dst_keys[to] = key;
      dst_values[to] = src_values[t];
    }
    in_tmp = !in_tmp;
  }
  if (in_tmp) {
    std::copy(tmp_keys, tmp_keys + n, keys);
    std::copy(tmp_values, tmp_values + n, values);
  }
}

template <typename Key>
void scatter_average_ranks(const Key* sorted_keys, const uint32_t* sorted_pairs, int64_t n,
                           double* ranks) {
  int64_t start = 0;
  while (start < n) {
    const int64_t end = run_end(sorted_keys, n, start);
    const double rank = average_rank(start, end);
    for (int64_t t = start; t < end; ++t) ranks[sorted_pairs[t]] = rank;
    start = end;
  }
}

// Σ_t (t + 1 − m)(v_t/2 − m), vectorized for AVX-512, AVX2 and the baseline.
REPCAP_PGA_CLONES static double plain_rank_cross(const uint32_t* twice_ref, int64_t n, double mean) {
  double cross = 0.0;
#pragma omp simd reduction(+ : cross)
  for (int64_t t = 0; t < n; ++t) {
    cross += (static_cast<double>(t + 1) - mean) * (0.5 * static_cast<double>(twice_ref[t]) - mean);
  }
  return cross;
}

template <typename Key>
RankCorrelationPartial correlate_ranks(const Key* sorted_keys, const uint32_t* sorted_twice_ref,
                                       int64_t n) {
  const double mean = 0.5 * static_cast<double>(n + 1);
  // First as if there were no ties: the rank of sorted position t is t + 1 (vectorized), and
  // Σ (t + 1 − m)² = n(n² − 1)/12.
  double cross = plain_rank_cross(sorted_twice_ref, n, mean);
  const double nd = static_cast<double>(n);
  double sum_sq = nd * (nd * nd - 1.0) / 12.0;
  // Then each run of equal keys [start, end) takes its average rank instead.
  int64_t t = 0;
  while (t + 1 < n) {
    if (sorted_keys[t + 1] != sorted_keys[t]) {
      ++t;
      continue;
    }
    const int64_t start = t;
    const int64_t end = run_end(sorted_keys, n, start);
    const double avg = average_rank(start, end);
    for (int64_t u = start; u < end; ++u) {
      const double plain = static_cast<double>(u + 1);
      cross += (avg - plain) * (0.5 * static_cast<double>(sorted_twice_ref[u]) - mean);
      sum_sq += (avg - mean) * (avg - mean) - (plain - mean) * (plain - mean);
    }
    t = end;
  }
  return RankCorrelationPartial{cross, sum_sq};
}

template void write_distance_keys<float>(const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                         int64_t, uint32_t*);
template void write_distance_keys<double>(const double*, int64_t, int64_t, int64_t, int64_t,
                                          int64_t, int64_t, uint64_t*);
template void radix_sort_pairs<uint32_t>(uint32_t*, uint32_t*, uint32_t*, uint32_t*, int64_t);
template void radix_sort_pairs<uint64_t>(uint64_t*, uint32_t*, uint64_t*, uint32_t*, int64_t);
template void scatter_average_ranks<uint32_t>(const uint32_t*, const uint32_t*, int64_t, double*);
template void scatter_average_ranks<uint64_t>(const uint64_t*, const uint32_t*, int64_t, double*);
template RankCorrelationPartial correlate_ranks<uint32_t>(const uint32_t*, const uint32_t*, int64_t);
template RankCorrelationPartial correlate_ranks<uint64_t>(const uint64_t*, const uint32_t*, int64_t);

}  // namespace cpu
}  // namespace repcap
