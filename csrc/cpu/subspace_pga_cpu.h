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
// for all keys. tmp_keys and tmp_values are scratch of n. The result is left in keys and values.
template <typename Key>
void radix_sort_pairs(Key* keys, uint32_t* values, Key* tmp_keys, uint32_t* tmp_values, int64_t n);

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
// through the sort instead of two (about 20% faster): payload[pair(i, j)] is the caller's per-pair
// value (twice the reference rank), or the pair index when payload is null.
void write_distance_items(const float* dots, int64_t ld, int64_t rows, int64_t cols, int64_t row0,
                          int64_t col0, int64_t n, const uint32_t* payload, uint64_t* items);

// Stable LSD radix sort of items by their high 32 bits (8-bit digits, equal digits skipped).
void radix_sort_items(uint64_t* items, uint64_t* tmp, int64_t n);

// ranks[payload of t] = the average rank of sorted position t (items carry pair indices).
void scatter_average_ranks_items(const uint64_t* sorted_items, int64_t n, double* ranks);

// correlate_ranks for items whose payload is twice the reference rank.
RankCorrelationPartial correlate_ranks_items(const uint64_t* sorted_items, int64_t n);

}  // namespace cpu
}  // namespace repcap
