// C++ CPU kernel of subspace PGA: distance keys, radix sort, tie-aware ranks and their
// correlation. Plain C++ (no torch headers); the Gram tiles come from BLAS in the caller
// (csrc/subspace_pga_ops.cpp).
#pragma once
#include <cstdint>

#include "../subspace_pga_epilogue.h"

namespace repcap {
namespace cpu {

template <typename T>
struct KeyFor;
template <>
struct KeyFor<float> {
  using type = uint32_t;
};
template <>
struct KeyFor<double> {
  using type = uint64_t;
};

// float64 distances (float32 ones are packed items, below), in two arrays:
// keys[pair(i, j)] = sortable_key(clamp(1 − dot_ij, 0, 2)) for the pairs j > i of a tile of dots
// dots[r][c] = p̂_{row0+r}·p̂_{col0+c} (leading dimension ld) of n unit rows.
template <typename T>
void write_distance_keys(const T* dots, int64_t ld, int64_t rows, int64_t cols, int64_t row0,
                         int64_t col0, int64_t n, typename KeyFor<T>::type* keys);

// Stable LSD radix sort of (keys, values) by key, 8-bit digits, skipping digits that are equal
// for all keys, ping-ponging between (keys, values) and the scratch (tmp_keys, tmp_values) of n.
// Returns true when the sorted result is in the scratch.
template <typename Key>
bool radix_sort_pairs(Key* keys, uint32_t* values, Key* tmp_keys, uint32_t* tmp_values, int64_t n);

// ranks[pairs[t]] = the average rank of sorted position t (runs of equal keys share it).
template <typename Key>
void scatter_average_ranks(const Key* sorted_keys, const uint32_t* sorted_pairs, int64_t n,
                           double* ranks);

// Σ (r − m)(s − m) and Σ (r − m)² over the pairs, r the average ranks of the sorted keys and s the
// reference rank carried along by the sort as the integer 2·s (exact), m = (n + 1)/2.
template <typename Key>
RankCorrelationPartial correlate_ranks(const Key* sorted_keys, const uint32_t* sorted_twice_ref,
                                       int64_t n);

// Float distances travel as packed items (sortable_key(dist) << 32) | payload, one 8-byte stream
// through the sort instead of two: payload[pair(i, j)] is the caller's per-pair value (twice the
// reference rank), or the pair index when payload is null. The write also counts the items by the
// top kItemTopBits bits of their key: ++top_counts[key >> (32 − kItemTopBits)], for the sort.
constexpr int kItemTopBits = 16;
constexpr int64_t kItemTopValues = int64_t(1) << kItemTopBits;
void write_distance_items(const float* dots, int64_t ld, int64_t rows, int64_t cols, int64_t row0,
                          int64_t col0, int64_t n, const uint32_t* payload, uint64_t* items,
                          uint32_t* top_counts);

// The n items (with top_counts of all of them, which the sort overwrites) sorted by key, then:
// ranks[payload] = the average rank of the item's key (payloads are pair indices), or the rank
// correlation's partial sums as correlate_ranks computes them (payloads are twice the reference
// ranks). tmp is scratch of n items; both arrays are clobbered.
//
// The sort: a stable counting scatter by the top 16 bits of the key into buckets (consecutive top
// values, a few thousand items each) from items into tmp, then an LSD radix sort of each bucket in
// cache over the bits that vary within it, and the ranks or the correlation of that bucket while it
// is in cache. Equal keys share their top bits, so no run of ties crosses a bucket. Two passes over
// memory instead of a histogram pass, three or four scatter passes and a final read.
void sort_items_scatter_ranks(uint64_t* items, uint64_t* tmp, int64_t n, uint32_t* top_counts, double* ranks);
RankCorrelationPartial sort_items_correlate(uint64_t* items, uint64_t* tmp, int64_t n, uint32_t* top_counts);

}  // namespace cpu
}  // namespace repcap
