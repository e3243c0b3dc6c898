#include "subspace_pga_cpu.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <type_traits>
#include <stdexcept>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// x86-64 with GCC: the AVX2/AVX-512 variants below, compiled with target attributes and chosen at
// run time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define REPCAP_X86_GCC 1
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
// a branch per run would mispredict). With a(t) the start of t's run, u = t − a(t) its place in
// the run, and S_t = Σ_{t' < t} p_t' (exclusive), the run sums become sums over the values:
//   Σ_runs (a + b + 1)·Σ_{t in run} p_t = Σ_t [(t + a(t) + 2)·p_t + S_t − S_{a(t)}],
//     because in a run [a, a + L) the second term counts p_{a+v} once for each later member,
//     L − 1 − v times, so the run adds Σ_u [(2a + 2 + u) + (L − 1 − u)]·p_{a+u} = (2a + L + 1)·Σ p;
//   Σ_runs (L³ − L) = 3·Σ_t u·(u + 1),  as (u + 1)³ − (u + 1) − (u³ − u) = 3u(u + 1).
// Every term is ≥ 0 and fits 64 bits ((t + a + 2)·p ≤ 4mn, S ≤ 2mn, m ≤ n < 2^31), so each
// partial sum is at most the final one. Acc must hold the sums exactly: uint64_t when
// fits_in_64_bits(m, n), unsigned __int128 otherwise.
// The pass's state after position t − 1: a(t − 1), S_{a(t − 1)}, S_t and the last key.
struct RunState {
  uint64_t run_start = 0, before_run = 0, before = 0, previous_key = 0;
};

// Positions [t0, m) of the pass, from `state`, added to `weighted` and `pairs` (Σ u(u + 1)).
template <typename Acc, typename Sorted>
void span_rank_sums_from(const Sorted& sorted, int64_t t0, int64_t m, RunState& state, Acc& weighted, Acc& pairs) {
  uint64_t run_start = state.run_start, before_run = state.before_run, before = state.before;
  uint64_t previous_key = state.previous_key;
  for (int64_t t = t0; t < m; ++t) {
    const uint64_t key = sorted.key(t), p = sorted.payload(t), position = static_cast<uint64_t>(t);
    const uint64_t starts = uint64_t(0) - static_cast<uint64_t>(key != previous_key);  // all ones at a run start
    run_start = (position & starts) | (run_start & ~starts);  // masks, not a branch the compiler may take
    before_run = (before & starts) | (before_run & ~starts);
    const uint64_t u = position - run_start;
    weighted += static_cast<Acc>((position + run_start + 2) * p) + (before - before_run);
    pairs += static_cast<Acc>(u * (u + 1));
    before += p;
    previous_key = key;
  }
  state = RunState{run_start, before_run, before, previous_key};
}

#ifdef REPCAP_X86_GCC
// GCC 12's avx512fintrin.h starts some intrinsics from an undefined register and warns about it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// Lane 0 of an AVX-512 register.
__attribute__((target("avx512f"))) static inline uint64_t lane0(__m512i v) {
  return static_cast<uint64_t>(_mm_cvtsi128_si64(_mm512_castsi512_si128(v)));
}

// The same pass over packed items, eight positions per step (AVX-512): a start where a key differs
// from the one before it; S by a prefix sum of the payloads, and a(t), S_{a(t)} by prefix maxima
// of (t, S_t) at the starts (both grow with t), each carried from the step before. The products
// are 32×32 → 64-bit (t + a + 2 ≤ 2m and u + 1 ≤ m, below 2^32); the eight lane sums are each at
// most the 64-bit total. Leaves positions [8·⌊m/8⌋, m) to span_rank_sums_from.
__attribute__((target("avx512f"))) int64_t span_rank_sums_avx512(const uint64_t* items, int64_t m, RunState& state,
                                                                 uint64_t& weighted, uint64_t& pairs) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i last = _mm512_set1_epi64(7);
  const __m512i low32 = _mm512_set1_epi64(0xffffffffLL);
  const __m512i one = _mm512_set1_epi64(1), two = _mm512_set1_epi64(2);
  __m512i keys_before = _mm512_set1_epi64(static_cast<long long>(state.previous_key));
  __m512i run_start = _mm512_set1_epi64(static_cast<long long>(state.run_start));
  __m512i before_run = _mm512_set1_epi64(static_cast<long long>(state.before_run));
  __m512i before = _mm512_set1_epi64(static_cast<long long>(state.before));
  __m512i weighted_lanes = zero, pairs_lanes = zero;
  int64_t t0 = 0;
  for (; t0 + 8 <= m; t0 += 8) {
    const __m512i item = _mm512_loadu_si512(items + t0);
    const __m512i keys = _mm512_srli_epi64(item, 32);
    const __m512i p = _mm512_and_si512(item, low32);
    const __mmask8 starts = _mm512_cmpneq_epu64_mask(keys, _mm512_alignr_epi64(keys, keys_before, 7));
    const __m512i position = _mm512_add_epi64(_mm512_set1_epi64(t0), lane);
    __m512i inclusive = _mm512_add_epi64(p, _mm512_alignr_epi64(p, zero, 7));  // lanes shifted up by 1, 2, 4
    inclusive = _mm512_add_epi64(inclusive, _mm512_alignr_epi64(inclusive, zero, 6));
    inclusive = _mm512_add_epi64(inclusive, _mm512_alignr_epi64(inclusive, zero, 4));
    const __m512i S = _mm512_add_epi64(before, _mm512_sub_epi64(inclusive, p));
    __m512i a = _mm512_maskz_mov_epi64(starts, position);
    __m512i Sa = _mm512_maskz_mov_epi64(starts, S);
    a = _mm512_max_epu64(a, _mm512_alignr_epi64(a, zero, 7));
    Sa = _mm512_max_epu64(Sa, _mm512_alignr_epi64(Sa, zero, 7));
    a = _mm512_max_epu64(a, _mm512_alignr_epi64(a, zero, 6));
    Sa = _mm512_max_epu64(Sa, _mm512_alignr_epi64(Sa, zero, 6));
    a = _mm512_max_epu64(a, _mm512_alignr_epi64(a, zero, 4));
    Sa = _mm512_max_epu64(Sa, _mm512_alignr_epi64(Sa, zero, 4));
    a = _mm512_max_epu64(a, run_start);
    Sa = _mm512_max_epu64(Sa, before_run);
    const __m512i u = _mm512_sub_epi64(position, a);
    const __m512i factor = _mm512_add_epi64(_mm512_add_epi64(position, a), two);
    weighted_lanes = _mm512_add_epi64(weighted_lanes, _mm512_mul_epu32(factor, p));
    weighted_lanes = _mm512_add_epi64(weighted_lanes, _mm512_sub_epi64(S, Sa));
    pairs_lanes = _mm512_add_epi64(pairs_lanes, _mm512_mul_epu32(u, _mm512_add_epi64(u, one)));
    run_start = _mm512_permutexvar_epi64(last, a);
    before_run = _mm512_permutexvar_epi64(last, Sa);
    before = _mm512_permutexvar_epi64(last, _mm512_add_epi64(before, inclusive));
    keys_before = keys;
  }
  weighted += static_cast<uint64_t>(_mm512_reduce_add_epi64(weighted_lanes));
  pairs += static_cast<uint64_t>(_mm512_reduce_add_epi64(pairs_lanes));
  state.run_start = lane0(run_start);  // the carries are broadcast: every lane holds them
  state.before_run = lane0(before_run);
  state.before = lane0(before);
  state.previous_key = lane0(_mm512_permutexvar_epi64(last, keys_before));
  return t0;
}
#pragma GCC diagnostic pop
#endif

bool avx512_rank_pass_available() {
#ifdef REPCAP_X86_GCC
  static const bool available = __builtin_cpu_supports("avx512f");
  return available;
#else
  return false;
#endif
}

// vectorized: the AVX-512 pass for packed items with 64-bit sums, where the CPU has it.
template <typename Acc, typename Sorted>
SpanRankSums<Acc> span_rank_sums(const Sorted& sorted, int64_t m, bool vectorized) {
  SpanRankSums<Acc> sums;
  if (m == 0) return sums;
  RunState state;
  state.previous_key = sorted.key(0);
  Acc weighted = 0, pairs = 0;
  int64_t t0 = 0;
#ifdef REPCAP_X86_GCC
  if constexpr (std::is_same<Acc, uint64_t>::value && std::is_same<Sorted, PackedSorted>::value) {
    if (vectorized && avx512_rank_pass_available()) t0 = span_rank_sums_avx512(sorted.items, m, state, weighted, pairs);
  }
#endif
  span_rank_sums_from(sorted, t0, m, state, weighted, pairs);
  sums.weighted = weighted;
  sums.payload = state.before;
  sums.cubes = 3 * pairs;
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
  void add_span(const Sorted& sorted, int64_t m, int64_t first, int64_t n, bool vectorized) {
    u128 weighted, payload, cube_sum;
    if (fits_in_64_bits(m, n)) {
      const SpanRankSums<uint64_t> sums = span_rank_sums<uint64_t>(sorted, m, vectorized);
      weighted = sums.weighted, payload = sums.payload, cube_sum = sums.cubes;
    } else {
      const SpanRankSums<u128> sums = span_rank_sums<u128>(sorted, m, false);
      weighted = sums.weighted, payload = sums.payload, cube_sum = sums.cubes;
    }
    twice_rank_payload += 2 * static_cast<u128>(first) * payload + weighted;
    cubes += cube_sum;
  }

  RankCorrelationPartial partial(int64_t n) const {
    const u128 count = static_cast<u128>(n);
    const __int128 cross_times_4 =
        static_cast<__int128>(twice_rank_payload) - static_cast<__int128>(count * (count + 1) * (count + 1));
    // n³ − n and each L³ − L are products of three consecutive integers, so 6 divides them: the
    // integer division is exact and the halving too, so both results are rounded once.
    const u128 sum_sq_times_2 = (count * count * count - count - cubes) / 6;
    return RankCorrelationPartial{static_cast<double>(cross_times_4) / 4.0, static_cast<double>(sum_sq_times_2) / 2.0};
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
  totals.add_span(SplitSorted<Key>{sorted_keys, sorted_twice_ref}, n, 0, n, false);
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
  piece_tops_.clear();
  piece_top_ends_.clear();
}

uint64_t* PackedPairs::stage_row(int64_t count) {
  if (written_ + staged_ + count > n_) throw std::length_error("PackedPairs: more items than the n it was made for");
  if (staged_ + count > stage_capacity_) flush_piece();
  if (count > stage_capacity_) throw std::length_error("PackedPairs: a row longer than max_row");
  return stage_.get() + staged_;
}

// Stores n items at dst without reading dst's cache lines first (x86-64: non-temporal stores,
// which the CPU combines into whole lines): the pieces are read back only after all of them are
// written, by which time they have left the cache anyway. 32-byte stores where the CPU has AVX2
// (about 0.8× the time of 8-byte ones for the whole write, measured on real distances).
#ifdef REPCAP_X86_GCC
__attribute__((target("avx2"))) static void store_streaming_avx2(const uint64_t* __restrict src, int64_t n,
                                                                 uint64_t* __restrict dst) {
  int64_t t = 0;
  for (; t < n && (reinterpret_cast<uintptr_t>(dst + t) & 31) != 0; ++t) {
    _mm_stream_si64(reinterpret_cast<long long*>(dst + t), static_cast<long long>(src[t]));
  }
  for (; t + 4 <= n; t += 4) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + t),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + t)));
  }
  for (; t < n; ++t) _mm_stream_si64(reinterpret_cast<long long*>(dst + t), static_cast<long long>(src[t]));
  _mm_sfence();
}
#endif

static void store_streaming(const uint64_t* __restrict src, int64_t n, uint64_t* __restrict dst) {
#ifdef REPCAP_X86_GCC
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return store_streaming_avx2(src, n, dst);
#endif
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
    if (here != 0) piece_tops_.push_back(TopEnd{top_lo + v, offset});
  }
  piece_top_ends_.push_back(piece_tops_.size());
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
#ifdef REPCAP_X86_GCC
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
// from the piece's top values (piece_tops_) from where the previous bucket's ended.
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
  const size_t pieces = piece_ends_.size();
  std::vector<size_t> cursor(pieces);  // piece p's next entry of piece_tops_
  std::vector<uint32_t> taken(pieces, 0u);  // piece p's items that earlier buckets took
  for (size_t p = 0; p < pieces; ++p) cursor[p] = p == 0 ? 0 : piece_top_ends_[p - 1];
  std::vector<ItemRun> runs;
  const uint64_t* items = items_.get();
  for (const ItemBucket& bucket : buckets) {
    runs.clear();
    for (size_t p = 0; p < pieces; ++p) {
      size_t c = cursor[p];
      uint32_t end = taken[p];
      while (c < piece_top_ends_[p] && piece_tops_[c].top <= bucket.top_hi) end = piece_tops_[c++].end;
      const uint64_t* piece = items + (p == 0 ? 0 : piece_ends_[p - 1]);
      if (end != taken[p]) runs.push_back(ItemRun{piece + taken[p], piece + end});
      cursor[p] = c;
      taken[p] = end;
    }
    visit(sort_item_bucket(runs, bucket_a_.data(), bucket_b_.data(), bucket), bucket);
  }
}

void PackedPairs::scatter_ranks(double* ranks) {
  for_each_sorted_bucket([&](const uint64_t* sorted, const ItemBucket& bucket) {
    repcap::cpu::scatter_ranks(PackedSorted{sorted}, bucket.size, bucket.start, ranks);
  });
}

RankCorrelationPartial PackedPairs::correlate(bool vectorized) {
  RankSumTotals totals;
  for_each_sorted_bucket([&](const uint64_t* sorted, const ItemBucket& bucket) {
    totals.add_span(PackedSorted{sorted}, bucket.size, bucket.start, n_, vectorized);
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
