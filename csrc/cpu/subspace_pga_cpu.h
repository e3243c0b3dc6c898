// C++ CPU kernel of subspace PGA: distance keys, radix sort, tie-aware ranks and their
// correlation. Plain C++ (no torch headers); the Gram tiles come from BLAS in the caller
// (csrc/subspace_pga_ops.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

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

// Whether this CPU runs the AVX-512 pass of the rank correlation (PackedPairs::correlate).
bool avx512_rank_pass_available();

// Float distances travel as packed items (sortable_key(dist) << 32) | payload, one 8-byte stream
// through the sort instead of two: the payload is the caller's per-pair value (twice the reference
// rank), or the pair index.
//
// The sort, in two steps; each item is written to memory once and read from it once:
// 1. Write: the items of a block of rows (a piece of at most kPieceItems, unless one row holds more)
//    are made in a staging buffer in cache, counted by the top kItemTopBits bits of their keys,
//    ordered by those top bits in cache, and stored at the piece's place in condensed order with
//    streaming stores.
// 2. Sort: consecutive top values are grouped into buckets of a few thousand items (a top value
//    that alone holds more is a bucket of its own). Each bucket's items form one run in every piece;
//    they are read from there by an LSD radix sort over the bits that vary within the bucket, which
//    runs in cache, and the bucket's ranks or share of the rank correlation are taken while it is
//    there. Equal keys share their top bits, so no run of ties crosses a bucket.
constexpr int kItemTopBits = 16;
constexpr int64_t kItemTopValues = int64_t(1) << kItemTopBits;
constexpr int64_t kPieceItems = int64_t(1) << 16;

class PackedPairs {
 public:
  // Room for n items, written in rows of at most max_row items.
  PackedPairs(int64_t n, int64_t max_row);

  // Starts a new set of n items.
  void clear();

  // Writes the pairs (i, j), j > i, of rows i = row0..row0+rows−1 of n_tokens unit rows from their
  // dots: dots[r][c] = p̂_{row0+r}·p̂_{row0+c} (leading dimension ld, columns row0..n_tokens−1),
  // distance clamp(1 − dot, 0, 2), payload[pair] or (payload null) the pair index. Rows come in
  // order, from row 0.
  void write_distances(const float* dots, int64_t ld, int64_t rows, int64_t row0, int64_t n_tokens,
                       const uint32_t* payload);

  // Writes count prepared items as the next ones (the test hooks' way in).
  void write_items(const uint64_t* items, int64_t count);

  // After all n items, each sorts them bucket by bucket (the stored items are only read):
  // ranks[payload] = the average rank of the item's key (payloads are pair indices);
  void scatter_ranks(double* ranks);
  // or the rank correlation's partial sums as correlate_ranks computes them (payloads are twice the
  // reference ranks), exact in integers (see RankSumTotals). vectorized: its pass over each sorted
  // bucket in AVX-512 where the CPU has it (the same integers; false: the portable pass).
  RankCorrelationPartial correlate(bool vectorized = true);

 private:
  uint64_t* stage_row(int64_t count);  // room for the next row of count items in the stage
  void flush_piece();                  // stores the staged items at their place, by top value
  template <typename Visit>
  void for_each_sorted_bucket(Visit visit);

  int64_t n_;
  std::unique_ptr<uint64_t[]> items_;  // n_, not zero-filled: every item is written
  int64_t stage_capacity_;
  std::unique_ptr<uint64_t[]> stage_;    // the current piece, as written
  std::unique_ptr<uint64_t[]> ordered_;  // the current piece, ordered by top value
  std::vector<uint32_t> top_counts_;   // per top value: the items of all pieces
  std::vector<uint32_t> lane_counts_;  // flush_piece's counters: per lane, per top value of the piece
  int64_t written_ = 0;  // items stored in pieces
  int64_t staged_ = 0;
  uint32_t stage_key_lo_ = ~0u, stage_key_hi_ = 0;  // the staged items' range of keys
  std::vector<int64_t> piece_ends_;
  // Per piece, in order, its top values that hold items and where each one's items end in the
  // piece (local offset): a bucket's run in a piece is found from these, not from the items.
  struct TopEnd {
    uint32_t top, end;
  };
  std::vector<TopEnd> piece_tops_;
  std::vector<size_t> piece_top_ends_;  // piece p's entries: [piece_top_ends_[p − 1], piece_top_ends_[p])
  std::vector<uint64_t> bucket_a_, bucket_b_;  // the sort's scratch: two copies of the largest bucket
};

}  // namespace cpu
}  // namespace repcap
