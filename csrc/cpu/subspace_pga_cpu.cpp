#include "subspace_pga_cpu.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace repcap {
namespace cpu {

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
// of the words (from bit 0), the exclusive start of every bucket in sorted order;
// active[d] is false where one bucket holds every word (that pass would be a no-op).
constexpr int kRadixBits = 8;
constexpr int kRadixBuckets = 1 << kRadixBits;

template <int kDigits, typename Word>
std::vector<int64_t> radix_offsets(const Word* words, int64_t n, bool* active) {
  std::vector<int64_t> counts(static_cast<size_t>(kDigits) * kRadixBuckets, 0);
  for (int64_t t = 0; t < n; ++t) {
    const Word word = words[t];
    for (int digit = 0; digit < kDigits; ++digit) {
      ++counts[digit * kRadixBuckets + ((word >> (kRadixBits * digit)) & (kRadixBuckets - 1))];
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
bool radix_sort_pairs(Key* keys, uint32_t* values, Key* tmp_keys, uint32_t* tmp_values, int64_t n) {
  constexpr int kDigits = 8 * static_cast<int>(sizeof(Key)) / kRadixBits;
  bool active[kDigits];
  std::vector<int64_t> offsets = radix_offsets<kDigits>(keys, n, active);
  bool in_tmp = false;  // ping-pong between (keys, values) and (tmp_keys, tmp_values)
  for (int digit = 0; digit < kDigits; ++digit) {
    if (!active[digit]) continue;
    // __restrict: as far as the compiler knows the int64 counters may alias the uint64 keys, and
    // it would reload the counter after every store (about 2× slower).
    int64_t* __restrict count = offsets.data() + digit * kRadixBuckets;
    const Key* __restrict src_keys = in_tmp ? tmp_keys : keys;
    const uint32_t* __restrict src_values = in_tmp ? tmp_values : values;
    Key* __restrict dst_keys = in_tmp ? keys : tmp_keys;
    uint32_t* __restrict dst_values = in_tmp ? values : tmp_values;
    const int shift = kRadixBits * digit;
    for (int64_t t = 0; t < n; ++t) {
      const Key key = src_keys[t];
      const int64_t to = count[(key >> shift) & (kRadixBuckets - 1)]++;
      dst_keys[to] = key;
      dst_values[to] = src_values[t];
    }
    in_tmp = !in_tmp;
  }
  return in_tmp;
}

namespace {

inline uint32_t item_top(uint64_t item) { return static_cast<uint32_t>(item >> (64 - kItemTopBits)); }
inline uint32_t item_key(uint64_t item) { return static_cast<uint32_t>(item >> 32); }

// One bucket of the packed-item sort: sorted positions [start, start + size), keys whose top
// bits lie in [top_lo, top_hi].
struct ItemBucket {
  int64_t start;
  uint32_t size;
  uint32_t top_lo, top_hi;
};

// Consecutive top values grouped into buckets of at most `target` items (a value that alone holds
// more is a bucket of its own).
std::vector<ItemBucket> plan_item_buckets(const uint32_t* top_counts, int64_t target) {
  std::vector<ItemBucket> buckets;
  int64_t position = 0;
  for (uint32_t v = 0; v < static_cast<uint32_t>(kItemTopValues); ++v) {
    const uint32_t count = top_counts[v];
    if (count == 0) continue;
    if (buckets.empty() || static_cast<int64_t>(buckets.back().size) + count > target) {
      buckets.push_back(ItemBucket{position, 0, v, v});
    }
    ItemBucket& bucket = buckets.back();
    bucket.size += count;
    bucket.top_hi = v;
    position += count;
  }
  return buckets;
}

// One bucket's items as runs of the pieces.
struct ItemRun {
  const uint64_t* begin;
  const uint64_t* end;
};

// LSD radix sort of one bucket's items, read from their runs, by key − (top_lo << 16), in the fewest
// digits of at most 8 bits that cover the bucket's key range (a digit equal for all items is
// skipped). The first pass reads the runs; the rest ping-pong between a and b (in cache for a
// bucket of a few thousand items). Returns where the sorted items are: a or b.
uint64_t* sort_item_bucket(const std::vector<ItemRun>& runs, uint64_t* a, uint64_t* b, const ItemBucket& bucket) {
  const uint32_t m = bucket.size;
  constexpr int kLowBits = 32 - kItemTopBits;
  const uint32_t lo = bucket.top_lo << kLowBits;
  const uint32_t span = ((bucket.top_hi - bucket.top_lo) << kLowBits) | ((1u << kLowBits) - 1);
  const int width = 32 - __builtin_clz(span);
  const int passes = (width + 7) / 8;
  const int bits = (width + passes - 1) / passes;
  const uint32_t mask = (1u << bits) - 1;
  const int radix = 1 << bits;
  uint32_t counts[4][256];
  for (int digit = 0; digit < passes; ++digit) std::fill(counts[digit], counts[digit] + radix, 0u);
  for (const ItemRun& run : runs) {
    for (const uint64_t* item = run.begin; item != run.end; ++item) {
      const uint32_t key = item_key(*item) - lo;
      for (int digit = 0; digit < passes; ++digit) ++counts[digit][(key >> (bits * digit)) & mask];
    }
  }
  bool from_runs = true;
  uint64_t* src = a;
  uint64_t* dst = a;
  for (int digit = 0; digit < passes; ++digit) {
    uint32_t* __restrict count = counts[digit];
    if (*std::max_element(count, count + radix) == m) continue;  // one digit value for all
    uint32_t offset = 0;
    for (int v = 0; v < radix; ++v) {
      const uint32_t here = count[v];
      count[v] = offset;
      offset += here;
    }
    const int shift = bits * digit;
    uint64_t* __restrict to = dst;
    if (from_runs) {
      for (const ItemRun& run : runs) {
        for (const uint64_t* __restrict from = run.begin; from != run.end; ++from) {
          const uint64_t item = *from;
          to[count[((item_key(item) - lo) >> shift) & mask]++] = item;
        }
      }
      from_runs = false;
      src = a;
      dst = b;
    } else {
      const uint64_t* __restrict from = src;
      for (uint32_t t = 0; t < m; ++t) {
        const uint64_t item = from[t];
        to[count[((item_key(item) - lo) >> shift) & mask]++] = item;
      }
      std::swap(src, dst);
    }
  }
  if (from_runs) {  // every digit equal (or one item): the runs in order are sorted
    uint64_t* to = a;
    for (const ItemRun& run : runs) to = std::copy(run.begin, run.end, to);
  }
  return src;
}

}  // namespace

// Sorted pairs as two arrays (keys, 32-bit payloads) or as packed items (key << 32 | payload).
template <typename Key>
struct SplitSorted {
  const Key* keys;
  const uint32_t* payloads;
  uint64_t key(int64_t t) const { return keys[t]; }
  int64_t run_end_at(int64_t n, int64_t t) const { return run_end(keys, n, t); }
  uint32_t payload(int64_t t) const { return payloads[t]; }
};

struct PackedSorted {
  const uint64_t* items;
  uint64_t key(int64_t t) const { return items[t] >> 32; }
  int64_t run_end_at(int64_t n, int64_t t) const { return run_end(items, n, t, HighWord()); }
  uint32_t payload(int64_t t) const { return static_cast<uint32_t>(items[t]); }
};

// ranks[payload of t] = the average rank of sorted position first + t, for the n sorted values
// of a span that no run of ties crosses.
template <typename Sorted>
void scatter_ranks(const Sorted& sorted, int64_t n, int64_t first, double* ranks) {
  int64_t start = 0;
  while (start < n) {
    const int64_t end = sorted.run_end_at(n, start);
    const double rank = average_rank(first + start, first + end);
    for (int64_t t = start; t < end; ++t) ranks[sorted.payload(t)] = rank;
    start = end;
  }
}

// ---- The rank correlation, exact in integers ----
//
// Sorted keys k_t with payloads p_t = 2·s_t (twice the reference rank, an integer). A run of equal
// keys at sorted positions [a, b) of all n shares the average rank r = (a + b + 1)/2, so with
// X = Σ_t 2r_t·p_t = 4 Σ r s = Σ_runs (a + b + 1)·Σ_{t in run} p_t, and Σ r = Σ s = n·m for the
// mean m = (n + 1)/2:
//   Σ (r − m)(s − m) = Σ r s − n m² = (X − n(n + 1)²)/4,
//   Σ (r − m)²       = (n³ − n − Σ_runs (L³ − L))/12,  L = b − a the run's length.
// Both are computed exactly in integers and rounded to double once.
//
// One span of m sorted values that no run of ties crosses (a bucket), with span-local runs [a, b):
//   weighted = Σ_runs (a + b + 1)·Σ_{t in run} p_t,  payload = Σ_t p_t,  cubes = Σ_runs (L³ − L);
// a span starting at sorted position `first` adds 2·first·payload + weighted to X.
template <typename Acc>
struct SpanRankSums {
  Acc weighted = 0, payload = 0, cubes = 0;
};

// One branch-free pass (about a third of sorted neighbours are tied in real float32 distances, so
// a branch per run would mispredict): each run start closes the previous run, and the masks make
// the terms of a run that goes on zero. Acc must hold every sum exactly: uint64_t when
// fits_in_64_bits(m, n), unsigned __int128 otherwise.
template <typename Acc, typename Sorted>
SpanRankSums<Acc> span_rank_sums(const Sorted& sorted, int64_t m) {
  SpanRankSums<Acc> sums;
  if (m == 0) return sums;
  uint64_t run_start = 0;
  uint64_t run_payload = sorted.payload(0);
  Acc weighted = 0, payload = run_payload, cubes = 0;
  uint64_t previous_key = sorted.key(0);
  for (int64_t t = 1; t < m; ++t) {
    const uint64_t key = sorted.key(t), p = sorted.payload(t), position = static_cast<uint64_t>(t);
    const uint64_t starts = uint64_t(0) - static_cast<uint64_t>(key != previous_key);  // all ones at a run start
    const uint64_t length = position - run_start;
    weighted += static_cast<Acc>((run_start + position + 1) & starts) * run_payload;
    cubes += static_cast<Acc>((length * length - 1) & starts) * length;
    payload += p;
    run_start = (position & starts) | (run_start & ~starts);
    run_payload = (run_payload & ~starts) + p;
    previous_key = key;
  }
  const uint64_t length = static_cast<uint64_t>(m) - run_start;
  weighted += static_cast<Acc>(run_start + static_cast<uint64_t>(m) + 1) * run_payload;
  cubes += static_cast<Acc>(length * length - 1) * length;
  sums.weighted = weighted;
  sums.payload = payload;
  sums.cubes = cubes;
  return sums;
}

using u128 = unsigned __int128;

// Whether span_rank_sums of m values with payloads ≤ 2n fits uint64_t: weighted ≤ 2m·(m·2n)
// and cubes ≤ m³.
static bool fits_in_64_bits(int64_t m, int64_t n) {
  const u128 span = static_cast<u128>(m);
  return 4 * span * span * static_cast<u128>(n) < (u128(1) << 64) && span * span * span < (u128(1) << 64);
}

// The running totals of X and Σ_runs (L³ − L) over the spans.
struct RankSumTotals {
  u128 twice_rank_payload = 0, cubes = 0;

  template <typename Sorted>
  void add_span(const Sorted& sorted, int64_t m, int64_t first, int64_t n) {
    u128 weighted, payload, cube_sum;
    if (fits_in_64_bits(m, n)) {
      const SpanRankSums<uint64_t> sums = span_rank_sums<uint64_t>(sorted, m);
      weighted = sums.weighted, payload = sums.payload, cube_sum = sums.cubes;
    } else {
      const SpanRankSums<u128> sums = span_rank_sums<u128>(sorted, m);
      weighted = sums.weighted, payload = sums.payload, cube_sum = sums.cubes;
    }
    twice_rank_payload += 2 * static_cast<u128>(first) * payload + weighted;
    cubes += cube_sum;
  }

  RankCorrelationPartial partial(int64_t n) const {
    const u128 count = static_cast<u128>(n);
    const __int128 cross_times_4 =
        static_cast<__int128>(twice_rank_payload) - static_cast<__int128>(count * (count + 1) * (count + 1));
    const u128 sum_sq_times_12 = count * count * count - count - cubes;
    return RankCorrelationPartial{static_cast<double>(cross_times_4) / 4.0, static_cast<double>(sum_sq_times_12) / 12.0};
  }
};

template <typename Key>
void scatter_average_ranks(const Key* sorted_keys, const uint32_t* sorted_pairs, int64_t n,
                           double* ranks) {
  scatter_ranks(SplitSorted<Key>{sorted_keys, sorted_pairs}, n, 0, ranks);
}

template <typename Key>
RankCorrelationPartial correlate_ranks(const Key* sorted_keys, const uint32_t* sorted_twice_ref,
                                       int64_t n) {
  RankSumTotals totals;
  totals.add_span(SplitSorted<Key>{sorted_keys, sorted_twice_ref}, n, 0, n);
  return totals.partial(n);
}

PackedPairs::PackedPairs(int64_t n, int64_t max_row)
    : n_(n),
      items_(new uint64_t[std::max<int64_t>(n, 1)]),
      stage_capacity_(std::max(kPieceItems, max_row)),
      stage_(new uint64_t[stage_capacity_]),
      ordered_(new uint64_t[stage_capacity_]),
      top_counts_(kItemTopValues, 0u) {
  clear();
}

void PackedPairs::clear() {
  written_ = 0;
  staged_ = 0;
  stage_key_lo_ = ~0u;
  stage_key_hi_ = 0;
  std::fill(top_counts_.begin(), top_counts_.end(), 0u);
  piece_ends_.clear();
}

uint64_t* PackedPairs::stage_row(int64_t count) {
  if (written_ + staged_ + count > n_) throw std::length_error("PackedPairs: more items than the n it was made for");
  if (staged_ + count > stage_capacity_) flush_piece();
  if (count > stage_capacity_) throw std::length_error("PackedPairs: a row longer than max_row");
  return stage_.get() + staged_;
}

// Stores n items at dst without reading dst's cache lines first (x86-64: non-temporal stores,
// which the CPU combines into whole lines): the pieces are read back only after all of them are
// written, by which time they have left the cache anyway.
static void store_streaming(const uint64_t* __restrict src, int64_t n, uint64_t* __restrict dst) {
#if defined(__x86_64__)
  for (int64_t t = 0; t < n; ++t) {
    _mm_stream_si64(reinterpret_cast<long long*>(dst + t), static_cast<long long>(src[t]));
  }
  _mm_sfence();
#else
  std::copy(src, src + n, dst);
#endif
}

// The staged piece is counted by top value in kLanes lanes (lane L counts the L-th quarter of the
// piece) with counters of their own, so that items sharing a top value do not wait on each
// other's increments (about 1.5× one set of counters); then ordered by top value in cache.
constexpr int kLanes = 4;

void PackedPairs::flush_piece() {
  if (staged_ == 0) return;
  const uint64_t* __restrict in = stage_.get();
  const int64_t count = staged_;
  const uint32_t top_lo = stage_key_lo_ >> (32 - kItemTopBits);
  const uint32_t span = (stage_key_hi_ >> (32 - kItemTopBits)) - top_lo + 1;
  lane_counts_.assign(static_cast<size_t>(kLanes) * span, 0u);
  uint32_t* __restrict counts = lane_counts_.data();  // counts[lane·span + top − top_lo]
  const int64_t quarter = count / kLanes;
  for (int64_t t = 0; t < quarter; ++t) {
    for (int lane = 0; lane < kLanes; ++lane) ++counts[lane * span + item_top(in[lane * quarter + t]) - top_lo];
  }
  for (int64_t t = kLanes * quarter; t < count; ++t) ++counts[item_top(in[t]) - top_lo];
  uint32_t offset = 0;  // counts[v] becomes the start of top value top_lo + v
  for (uint32_t v = 0; v < span; ++v) {
    uint32_t here = 0;
    for (int lane = 0; lane < kLanes; ++lane) here += counts[lane * span + v];
    counts[v] = offset;
    offset += here;
    top_counts_[top_lo + v] += here;
  }
  // Ordered by top value in cache, then stored at the piece's place in one stream.
  uint64_t* __restrict ordered = ordered_.get();
  for (int64_t t = 0; t < count; ++t) {
    const uint64_t item = in[t];
    ordered[counts[item_top(item) - top_lo]++] = item;
  }
  store_streaming(ordered, count, items_.get() + written_);
  written_ += count;
  piece_ends_.push_back(written_);
  staged_ = 0;
  stage_key_lo_ = ~0u;
  stage_key_hi_ = 0;
}

// The items of one row: item c = (sortable_key(clamp(1 − row[c], 0, 2)) << 32) | payload, with
// payload values[c] or (values null) first_index + c; widens [key_lo, key_hi] to the row's keys.
// The clamped distance is +0 or positive, whose sortable key is its bits with the top bit set, so
// the loop has no branch and vectorizes (3–4× the scalar loop on AVX-512, measured on real distances).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void write_row_items(const float* __restrict row, int64_t count, const uint32_t* __restrict values,
                            uint32_t first_index, uint64_t* __restrict out, uint32_t* key_lo, uint32_t* key_hi) {
  uint32_t lo = *key_lo, hi = *key_hi;
  for (int64_t c = 0; c < count; ++c) {
    const float dist = std::min(2.0f, std::max(0.0f, 1.0f - row[c]));
    uint32_t bits;
    std::memcpy(&bits, &dist, sizeof(bits));
    const uint32_t key = bits | 0x80000000u;
    const uint32_t payload = values != nullptr ? values[c] : first_index + static_cast<uint32_t>(c);
    out[c] = (static_cast<uint64_t>(key) << 32) | payload;
    lo = std::min(lo, key);
    hi = std::max(hi, key);
  }
  *key_lo = lo;
  *key_hi = hi;
}

void PackedPairs::write_distances(const float* dots, int64_t ld, int64_t rows, int64_t row0, int64_t n_tokens,
                                  const uint32_t* payload) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row0 + r;
    const int64_t count = n_tokens - 1 - i;  // the pairs (i, j), j > i, consecutive in condensed order
    if (count <= 0) continue;
    const int64_t pair0 = condensed_pair_index(i, i + 1, n_tokens);
    if (pair0 != written_ + staged_) throw std::logic_error("PackedPairs: rows must come in order from row 0");
    uint64_t* out = stage_row(count);
    write_row_items(dots + r * ld + (i + 1 - row0), count, payload != nullptr ? payload + pair0 : nullptr,
                    static_cast<uint32_t>(pair0), out, &stage_key_lo_, &stage_key_hi_);
    staged_ += count;
  }
}

void PackedPairs::write_items(const uint64_t* items, int64_t count) {
  while (count > 0) {
    const int64_t chunk = std::min(count, kPieceItems);
    std::copy(items, items + chunk, stage_row(chunk));
    for (int64_t t = 0; t < chunk; ++t) {
      stage_key_lo_ = std::min(stage_key_lo_, item_key(items[t]));
      stage_key_hi_ = std::max(stage_key_hi_, item_key(items[t]));
    }
    staged_ += chunk;
    items += chunk;
    count -= chunk;
  }
}

// The items sorted bucket by bucket: visit(sorted, bucket) sees the buckets in key order. Within
// each piece the items are ordered by top value, so a bucket's items are one run per piece, found
// by binary search from where the previous bucket's ended.
template <typename Visit>
void PackedPairs::for_each_sorted_bucket(Visit visit) {
  flush_piece();
  if (written_ != n_) throw std::length_error("PackedPairs: fewer items written than the n it was made for");
  // A few thousand items per bucket (both copies stay in cache); for large n at most about 256.
  const int64_t target = std::max<int64_t>(2048, n_ / 256);
  const std::vector<ItemBucket> buckets = plan_item_buckets(top_counts_.data(), target);
  uint32_t largest = 0;
  for (const ItemBucket& bucket : buckets) largest = std::max(largest, bucket.size);
  if (bucket_a_.size() < largest) {  // kept across calls: one allocation per thread, not per subspace
    bucket_a_.resize(largest);
    bucket_b_.resize(largest);
  }
  std::vector<int64_t> cursor(piece_ends_.size());
  for (size_t p = 0; p < piece_ends_.size(); ++p) cursor[p] = p == 0 ? 0 : piece_ends_[p - 1];
  std::vector<ItemRun> runs;
  const uint64_t* items = items_.get();
  for (const ItemBucket& bucket : buckets) {
    runs.clear();
    for (size_t p = 0; p < piece_ends_.size(); ++p) {
      const uint64_t* begin = items + cursor[p];
      const uint64_t* end = std::partition_point(
          begin, items + piece_ends_[p], [&](uint64_t item) { return item_top(item) <= bucket.top_hi; });
      if (end != begin) runs.push_back(ItemRun{begin, end});
      cursor[p] = end - items;
    }
    visit(sort_item_bucket(runs, bucket_a_.data(), bucket_b_.data(), bucket), bucket);
  }
}

void PackedPairs::scatter_ranks(double* ranks) {
  for_each_sorted_bucket([&](const uint64_t* sorted, const ItemBucket& bucket) {
    repcap::cpu::scatter_ranks(PackedSorted{sorted}, bucket.size, bucket.start, ranks);
  });
}

RankCorrelationPartial PackedPairs::correlate() {
  RankSumTotals totals;
  for_each_sorted_bucket([&](const uint64_t* sorted, const ItemBucket& bucket) {
    totals.add_span(PackedSorted{sorted}, bucket.size, bucket.start, n_);
  });
  return totals.partial(n_);
}

template void write_distance_keys<double>(const double*, int64_t, int64_t, int64_t, int64_t,
                                          int64_t, int64_t, uint64_t*);
template bool radix_sort_pairs<uint64_t>(uint64_t*, uint32_t*, uint64_t*, uint32_t*, int64_t);
template void scatter_average_ranks<uint64_t>(const uint64_t*, const uint32_t*, int64_t, double*);
template RankCorrelationPartial correlate_ranks<uint64_t>(const uint64_t*, const uint32_t*, int64_t);

}  // namespace cpu
}  // namespace repcap
