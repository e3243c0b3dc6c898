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

// LSD radix sort with 8-bit digits (256 buckets stay in L1 while scattering). For each digit d
// of the words (from bit kLowBit), the exclusive start of every bucket in sorted order;
// active[d] is false where one bucket holds every word (that pass would be a no-op).
constexpr int kRadixBits = 8;
constexpr int kRadixBuckets = 1 << kRadixBits;

template <int kDigits, int kLowBit, typename Word>
std::vector<int64_t> radix_offsets(const Word* words, int64_t n, bool* active) {
  std::vector<int64_t> counts(static_cast<size_t>(kDigits) * kRadixBuckets, 0);
  for (int64_t t = 0; t < n; ++t) {
    const Word word = words[t];
    for (int digit = 0; digit < kDigits; ++digit) {
      ++counts[digit * kRadixBuckets + ((word >> (kLowBit + kRadixBits * digit)) & (kRadixBuckets - 1))];
    }
  }
  for (int digit = 0; digit < kDigits; ++digit) {
    int64_t* count = counts.data() + digit * kRadixBuckets;
    active[digit] = *std::max_element(count, count + kRadixBuckets) != n;
    int64_t offset = 0;
    for (int b = 0; b < kRadixBuckets; ++b) {
      const int64_t here = count[b];
      count[b] = offset;
      offset += here;
    }
  }
  return counts;
}

template <typename Key>
void radix_sort_pairs(Key* keys, uint32_t* values, Key* tmp_keys, uint32_t* tmp_values, int64_t n) {
  constexpr int kDigits = 8 * static_cast<int>(sizeof(Key)) / kRadixBits;
  bool active[kDigits];
  std::vector<int64_t> offsets = radix_offsets<kDigits, 0>(keys, n, active);
  bool in_tmp = false;  // ping-pong between (keys, values) and (tmp_keys, tmp_values)
  for (int digit = 0; digit < kDigits; ++digit) {
    if (!active[digit]) continue;
    int64_t* count = offsets.data() + digit * kRadixBuckets;
    const Key* src_keys = in_tmp ? tmp_keys : keys;
    const uint32_t* src_values = in_tmp ? tmp_values : values;
    Key* dst_keys = in_tmp ? keys : tmp_keys;
    uint32_t* dst_values = in_tmp ? values : tmp_values;
    const int shift = kRadixBits * digit;
    for (int64_t t = 0; t < n; ++t) {
      const Key key = src_keys[t];
      const int64_t to = count[(key >> shift) & (kRadixBuckets - 1)]++;
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

void radix_sort_items(uint64_t* items, uint64_t* tmp, int64_t n) {
  constexpr int kDigits = 4;  // the high 32 bits
  bool active[kDigits];
  std::vector<int64_t> offsets = radix_offsets<kDigits, 32>(items, n, active);
  bool in_tmp = false;
  for (int digit = 0; digit < kDigits; ++digit) {
    if (!active[digit]) continue;
    int64_t* count = offsets.data() + digit * kRadixBuckets;
    const uint64_t* src = in_tmp ? tmp : items;
    uint64_t* dst = in_tmp ? items : tmp;
    const int shift = 32 + kRadixBits * digit;
    for (int64_t t = 0; t < n; ++t) {
      const uint64_t item = src[t];
      dst[count[(item >> shift) & (kRadixBuckets - 1)]++] = item;
    }
    in_tmp = !in_tmp;
  }
  if (in_tmp) std::copy(tmp, tmp + n, items);
}

// Sorted pairs as two arrays (keys, 32-bit payloads) or as packed items (key << 32 | payload).
template <typename Key>
struct SplitSorted {
  const Key* keys;
  const uint32_t* payloads;
  bool same_key(int64_t a, int64_t b) const { return keys[a] == keys[b]; }
  int64_t run_end_at(int64_t n, int64_t t) const { return run_end(keys, n, t); }
  uint32_t payload(int64_t t) const { return payloads[t]; }
};

struct PackedSorted {
  const uint64_t* items;
  bool same_key(int64_t a, int64_t b) const { return (items[a] >> 32) == (items[b] >> 32); }
  int64_t run_end_at(int64_t n, int64_t t) const { return run_end(items, n, t, HighWord()); }
  uint32_t payload(int64_t t) const { return static_cast<uint32_t>(items[t]); }
};

template <typename Sorted>
void scatter_ranks(const Sorted& sorted, int64_t n, double* ranks) {
  int64_t start = 0;
  while (start < n) {
    const int64_t end = sorted.run_end_at(n, start);
    const double rank = average_rank(start, end);
    for (int64_t t = start; t < end; ++t) ranks[sorted.payload(t)] = rank;
    start = end;
  }
}

// Σ_t (t + 1 − m)(v_t/2 − m), v_t the payloads, vectorized for AVX-512, AVX2 and the baseline.
REPCAP_PGA_CLONES static double plain_rank_cross(const uint32_t* twice_ref, int64_t n, double mean) {
  double cross = 0.0;
#pragma omp simd reduction(+ : cross)
  for (int64_t t = 0; t < n; ++t) {
    cross += (static_cast<double>(t + 1) - mean) * (0.5 * static_cast<double>(twice_ref[t]) - mean);
  }
  return cross;
}

REPCAP_PGA_CLONES static double plain_rank_cross(const uint64_t* items, int64_t n, double mean) {
  double cross = 0.0;
#pragma omp simd reduction(+ : cross)
  for (int64_t t = 0; t < n; ++t) {
    const double twice = static_cast<double>(static_cast<uint32_t>(items[t]));
    cross += (static_cast<double>(t + 1) - mean) * (0.5 * twice - mean);
  }
  return cross;
}

// plain_cross = Σ (t + 1 − m)(s_t − m), the cross term as if there were no ties; each run of
// equal keys [start, end) then takes its average rank instead, and Σ (t + 1 − m)² = n(n² − 1)/12.
template <typename Sorted>
RankCorrelationPartial correlate(const Sorted& sorted, int64_t n, double plain_cross) {
  const double mean = 0.5 * static_cast<double>(n + 1);
  const double nd = static_cast<double>(n);
  double cross = plain_cross;
  double sum_sq = nd * (nd * nd - 1.0) / 12.0;
  int64_t t = 0;
  while (t + 1 < n) {
    if (!sorted.same_key(t, t + 1)) {
      ++t;
      continue;
    }
    const int64_t start = t;
    const int64_t end = sorted.run_end_at(n, start);
    const double avg = average_rank(start, end);
    for (int64_t u = start; u < end; ++u) {
      const double plain = static_cast<double>(u + 1);
      cross += (avg - plain) * (0.5 * static_cast<double>(sorted.payload(u)) - mean);
      sum_sq += (avg - mean) * (avg - mean) - (plain - mean) * (plain - mean);
    }
    t = end;
  }
  return RankCorrelationPartial{cross, sum_sq};
}

template <typename Key>
void scatter_average_ranks(const Key* sorted_keys, const uint32_t* sorted_pairs, int64_t n,
                           double* ranks) {
  scatter_ranks(SplitSorted<Key>{sorted_keys, sorted_pairs}, n, ranks);
}

template <typename Key>
RankCorrelationPartial correlate_ranks(const Key* sorted_keys, const uint32_t* sorted_twice_ref,
                                       int64_t n) {
  const double mean = 0.5 * static_cast<double>(n + 1);
  return correlate(SplitSorted<Key>{sorted_keys, sorted_twice_ref}, n,
                   plain_rank_cross(sorted_twice_ref, n, mean));
}

void scatter_average_ranks_items(const uint64_t* sorted_items, int64_t n, double* ranks) {
  scatter_ranks(PackedSorted{sorted_items}, n, ranks);
}

RankCorrelationPartial correlate_ranks_items(const uint64_t* sorted_items, int64_t n) {
  const double mean = 0.5 * static_cast<double>(n + 1);
  return correlate(PackedSorted{sorted_items}, n, plain_rank_cross(sorted_items, n, mean));
}

void write_distance_items(const float* dots, int64_t ld, int64_t rows, int64_t cols, int64_t row0,
                          int64_t col0, int64_t n, const uint32_t* payload, uint64_t* items) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row0 + r;
    const int64_t first = std::max<int64_t>(0, i + 1 - col0);  // columns j > i
    if (first >= cols) continue;
    const int64_t pair0 = condensed_pair_index(i, col0 + first, n);  // consecutive from here
    uint64_t* out = items + pair0;
    const float* row = dots + r * ld;
    const int64_t count = cols - first;
    if (payload != nullptr) {
      const uint32_t* low = payload + pair0;
      for (int64_t c = 0; c < count; ++c) {
        const float dist = std::min(2.0f, std::max(0.0f, 1.0f - row[first + c]));
        out[c] = (static_cast<uint64_t>(sortable_key(dist)) << 32) | low[c];
      }
    } else {
      for (int64_t c = 0; c < count; ++c) {
        const float dist = std::min(2.0f, std::max(0.0f, 1.0f - row[first + c]));
        out[c] = (static_cast<uint64_t>(sortable_key(dist)) << 32) | static_cast<uint64_t>(pair0 + c);
      }
    }
  }
}

template void write_distance_keys<double>(const double*, int64_t, int64_t, int64_t, int64_t,
                                          int64_t, int64_t, uint64_t*);
template void radix_sort_pairs<uint64_t>(uint64_t*, uint32_t*, uint64_t*, uint32_t*, int64_t);
template void scatter_average_ranks<uint64_t>(const uint64_t*, const uint32_t*, int64_t, double*);
template RankCorrelationPartial correlate_ranks<uint64_t>(const uint64_t*, const uint32_t*, int64_t);

}  // namespace cpu
}  // namespace repcap
