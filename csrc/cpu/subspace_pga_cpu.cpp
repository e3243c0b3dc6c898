#include "subspace_pga_cpu.h"

#include <algorithm>
#include <array>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

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
  bool same_key(int64_t a, int64_t b) const { return keys[a] == keys[b]; }
  int64_t run_end_at(int64_t n, int64_t t) const { return run_end(keys, n, t); }
  uint32_t payload(int64_t t) const { return payloads[t]; }
};

struct PackedSorted {
  const uint64_t* items;
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

// Σ_t (first + t + 1 − m)(v_t/2 − m), v_t the payloads, vectorized for AVX-512, AVX2 and the
// baseline.
REPCAP_PGA_CLONES static double plain_rank_cross(const uint32_t* twice_ref, int64_t n, int64_t first, double mean) {
  const double shift = static_cast<double>(first + 1) - mean;
  double cross = 0.0;
#pragma omp simd reduction(+ : cross)
  for (int64_t t = 0; t < n; ++t) {
    cross += (static_cast<double>(t) + shift) * (0.5 * static_cast<double>(twice_ref[t]) - mean);
  }
  return cross;
}

REPCAP_PGA_CLONES static double plain_rank_cross(const uint64_t* items, int64_t n, int64_t first, double mean) {
  const double shift = static_cast<double>(first + 1) - mean;
  double cross = 0.0;
#pragma omp simd reduction(+ : cross)
  for (int64_t t = 0; t < n; ++t) {
    const double twice = static_cast<double>(static_cast<uint32_t>(items[t]));
    cross += (static_cast<double>(t) + shift) * (0.5 * twice - mean);
  }
  return cross;
}

// For n sorted values at sorted positions first.. of all `total` pairs (a span that no run of ties
// crosses), given plain_cross = Σ (first + t + 1 − m)(s_t − m), the cross term as if there were no
// ties: each run of equal keys [start, end) takes its average rank instead, which adds to the
// cross term and to Σ (r − m)² (whose tie-free value n(n² − 1)/12 over all pairs the caller adds).
template <typename Sorted>
RankCorrelationPartial correct_for_ties(const Sorted& sorted, int64_t n, int64_t first, int64_t total,
                                        double plain_cross) {
  const double mean = 0.5 * static_cast<double>(total + 1);
  double cross = plain_cross;
  double sum_sq = 0.0;
  int64_t t = 0;
  while (t + 1 < n) {
    if (!sorted.same_key(t, t + 1)) {
      ++t;
      continue;
    }
    const int64_t start = t;
    const int64_t end = sorted.run_end_at(n, start);
    const double avg = average_rank(first + start, first + end);
    for (int64_t u = start; u < end; ++u) {
      const double plain = static_cast<double>(first + u + 1);
      cross += (avg - plain) * (0.5 * static_cast<double>(sorted.payload(u)) - mean);
      sum_sq += (avg - mean) * (avg - mean) - (plain - mean) * (plain - mean);
    }
    t = end;
  }
  return RankCorrelationPartial{cross, sum_sq};
}

// ---- Tie corrections of one sorted bucket of packed items, exact in integers ----
//
// Items x_t = (k_t << 32) | p_t sorted by key k, p_t twice the reference rank. A run of L equal keys
// at sorted positions [a, b) of the bucket takes its average rank (a + b + 1)/2 (plus the bucket's
// first position) instead of t + 1. Over the run, since avg − (t + 1) = ½ Σ_{u in run} sign(u − t)
// and Σ_{t in run} (t + 1 − avg)² = (L³ − L)/12 = ½ Σ_{t<u in run} (u − t):
//   cross correction  Σ_t (avg − (t + 1)) p_t/2        = ¼ Σ_{t<u in run} (p_t − p_u),
//   sum_sq correction Σ_t (avg − m)² − (t + 1 − m)²   = −½ Σ_{t<u in run} (u − t).
// Equal keys are consecutive, so the pairs (t, u = t + d) of the runs are exactly those with
// k_t = k_{t+d}, and summing over the offsets d:
//   cross += ¼ Σ_{d≥1} Σ_{t : k_t = k_{t+d}} (p_t − p_{t+d}),   sum_sq −= ½ Σ_{d≥1} d · #{t : k_t = k_{t+d}}.
// d = 1 is one branch-free pass over the bucket that also lists the positions t with k_t = k_{t+1};
// each further d keeps the listed t with k_t = k_{t+d}, a subset of the previous list. Runs longer
// than kMaxTieOffset (exact duplicates: one-hot rows give runs of thousands) take their pairs
// farther apart than that in closed form, run by run. The sums are exact integers; each correction
// is rounded to double once.
constexpr int64_t kMaxTieOffset = 32;

inline int64_t item_payload(uint64_t item) { return static_cast<int64_t>(static_cast<uint32_t>(item)); }

// Σ_{t+1<m} [k_t = k_{t+1}] (p_t − p_{t+1}) into *diff; the positions t with k_t = k_{t+1} into
// positions (ascending; room for m); returns their count. Branch-free: about a third of the
// neighbours are equal in real float32 distances (a branch per run mispredicts).
static int64_t adjacent_ties(const uint64_t* __restrict x, int64_t m, uint32_t* __restrict positions,
                             int64_t* diff) {
  int64_t sum = 0, kept = 0;
  for (int64_t t = 0; t + 1 < m; ++t) {
    const uint64_t a = x[t], b = x[t + 1];
    const int64_t equal = (a >> 32) == (b >> 32);
    sum += (item_payload(a) - item_payload(b)) & -equal;
    positions[kept] = static_cast<uint32_t>(t);
    kept += equal;
  }
  *diff = sum;
  return kept;
}

// The tie corrections (cross, sum_sq) of m sorted items; positions is scratch of m.
static RankCorrelationPartial tie_corrections(const uint64_t* x, int64_t m, uint32_t* positions) {
  if (m < 2) return RankCorrelationPartial{0.0, 0.0};
  int64_t diff = 0;
  int64_t kept = adjacent_ties(x, m, positions, &diff);
  __int128 diff_total = diff;  // Σ_d Σ_{k_t = k_{t+d}} (p_t − p_{t+d})
  __int128 gap_total = kept;   // Σ_d d · #{t : k_t = k_{t+d}}
  for (int64_t d = 2; kept > 0 && d <= kMaxTieOffset; ++d) {
    int64_t next = 0;
    int64_t sum = 0;  // < m terms of magnitude < 2³²
    for (int64_t j = 0; j < kept; ++j) {
      const int64_t t = positions[j];
      const bool inside = t + d < m;
      const uint64_t a = x[t], b = x[inside ? t + d : t];
      const int64_t equal = inside && (a >> 32) == (b >> 32);
      sum += (item_payload(a) - item_payload(b)) & -equal;
      positions[next] = static_cast<uint32_t>(t);
      next += equal;
    }
    diff_total += sum;
    gap_total += static_cast<__int128>(d) * next;
    kept = next;
  }
  // Left in the list: the positions a..b−1−kMaxTieOffset of each run [a, b) longer than kMaxTieOffset.
  int64_t done = 0;
  for (int64_t j = 0; j < kept; ++j) {
    const int64_t a = positions[j];
    if (a < done) continue;
    const int64_t b = run_end(x, m, a, HighWord());
    const int64_t length = b - a;
    for (int64_t u = a; u < b; ++u) {  // #{v in run: v > u + D} − #{v in run: v < u − D}
      const int64_t weight = std::max<int64_t>(0, b - 1 - u - kMaxTieOffset) - std::max<int64_t>(0, u - kMaxTieOffset - a);
      diff_total += static_cast<__int128>(weight) * item_payload(x[u]);
    }
    for (int64_t d = kMaxTieOffset + 1; d < length; ++d) gap_total += static_cast<__int128>(d) * (length - d);
    done = b;
  }
  return RankCorrelationPartial{0.25 * static_cast<double>(diff_total), -0.5 * static_cast<double>(gap_total)};
}

static double tie_free_sum_sq(int64_t n) {
  const double nd = static_cast<double>(n);
  return nd * (nd * nd - 1.0) / 12.0;
}

template <typename Key>
void scatter_average_ranks(const Key* sorted_keys, const uint32_t* sorted_pairs, int64_t n,
                           double* ranks) {
  scatter_ranks(SplitSorted<Key>{sorted_keys, sorted_pairs}, n, 0, ranks);
}

template <typename Key>
RankCorrelationPartial correlate_ranks(const Key* sorted_keys, const uint32_t* sorted_twice_ref,
                                       int64_t n) {
  const double mean = 0.5 * static_cast<double>(n + 1);
  RankCorrelationPartial partial = correct_for_ties(SplitSorted<Key>{sorted_keys, sorted_twice_ref}, n, 0, n,
                                                    plain_rank_cross(sorted_twice_ref, n, 0, mean));
  partial.sum_sq += tie_free_sum_sq(n);
  return partial;
}

PackedPairs::PackedPairs(int64_t n, int64_t max_row)
    : n_(n),
      items_(new uint64_t[std::max<int64_t>(n, 1)]),
      stage_capacity_(std::max(kPieceItems, max_row)),
      stage_(new uint64_t[stage_capacity_]),
      ordered_(new uint64_t[stage_capacity_]),
      top_counts_(kItemTopValues, 0u),
      stage_counts_(kItemTopValues, 0u) {
  clear();
}

void PackedPairs::clear() {
  written_ = 0;
  staged_ = 0;
  stage_top_lo_ = static_cast<uint32_t>(kItemTopValues - 1);
  stage_top_hi_ = 0;
  std::fill(top_counts_.begin(), top_counts_.end(), 0u);
  std::fill(stage_counts_.begin(), stage_counts_.end(), 0u);
  piece_ends_.clear();
}

uint64_t* PackedPairs::stage_row(int64_t count) {
  if (written_ + staged_ + count > n_) throw std::length_error("PackedPairs: more items than the n it was made for");
  if (staged_ + count > stage_capacity_) flush_piece();
  if (count > stage_capacity_) throw std::length_error("PackedPairs: a row longer than max_row");
  return stage_.get() + staged_;
}

void PackedPairs::count_staged(int64_t first) {
  uint32_t* __restrict counts = stage_counts_.data();
  uint32_t lo = stage_top_lo_, hi = stage_top_hi_;
  for (int64_t t = first; t < staged_; ++t) {
    const uint32_t top = item_top(stage_[t]);
    ++counts[top];
    lo = std::min(lo, top);
    hi = std::max(hi, top);
  }
  stage_top_lo_ = lo;
  stage_top_hi_ = hi;
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

void PackedPairs::flush_piece() {
  if (staged_ == 0) return;
  uint32_t* __restrict counts = stage_counts_.data();
  uint32_t offset = 0;
  for (uint32_t v = stage_top_lo_; v <= stage_top_hi_; ++v) {
    const uint32_t here = counts[v];
    top_counts_[v] += here;
    counts[v] = offset;
    offset += here;
  }
  // Ordered by top value in cache, then stored at the piece's place in one stream.
  uint64_t* __restrict ordered = ordered_.get();
  const uint64_t* __restrict in = stage_.get();
  for (int64_t t = 0; t < staged_; ++t) {
    const uint64_t item = in[t];
    ordered[counts[item_top(item)]++] = item;
  }
  store_streaming(ordered, staged_, items_.get() + written_);
  std::fill(counts + stage_top_lo_, counts + stage_top_hi_ + 1, 0u);
  written_ += staged_;
  piece_ends_.push_back(written_);
  staged_ = 0;
  stage_top_lo_ = static_cast<uint32_t>(kItemTopValues - 1);
  stage_top_hi_ = 0;
}

void PackedPairs::write_distances(const float* dots, int64_t ld, int64_t rows, int64_t row0, int64_t n_tokens,
                                  const uint32_t* payload) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row0 + r;
    const int64_t count = n_tokens - 1 - i;  // the pairs (i, j), j > i, consecutive in condensed order
    if (count <= 0) continue;
    const int64_t pair0 = condensed_pair_index(i, i + 1, n_tokens);
    if (pair0 != written_ + staged_) throw std::logic_error("PackedPairs: rows must come in order from row 0");
    uint64_t* __restrict out = stage_row(count);
    uint32_t* __restrict counts = stage_counts_.data();
    uint32_t key_lo = ~0u, key_hi = 0;
    const float* row = dots + r * ld + (i + 1 - row0);
    for (int64_t c = 0; c < count; ++c) {
      const float dist = std::min(2.0f, std::max(0.0f, 1.0f - row[c]));
      const uint32_t key = sortable_key(dist);
      const uint32_t low = payload != nullptr ? payload[pair0 + c] : static_cast<uint32_t>(pair0 + c);
      out[c] = (static_cast<uint64_t>(key) << 32) | low;
      ++counts[key >> (32 - kItemTopBits)];
      key_lo = std::min(key_lo, key);
      key_hi = std::max(key_hi, key);
    }
    staged_ += count;
    stage_top_lo_ = std::min(stage_top_lo_, key_lo >> (32 - kItemTopBits));
    stage_top_hi_ = std::max(stage_top_hi_, key_hi >> (32 - kItemTopBits));
  }
}

void PackedPairs::write_items(const uint64_t* items, int64_t count) {
  while (count > 0) {
    const int64_t chunk = std::min(count, kPieceItems);
    std::copy(items, items + chunk, stage_row(chunk));
    staged_ += chunk;
    count_staged(staged_ - chunk);
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
    tie_positions_.resize(largest);
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
  const double mean = 0.5 * static_cast<double>(n_ + 1);
  RankCorrelationPartial total{0.0, tie_free_sum_sq(n_)};
  for_each_sorted_bucket([&](const uint64_t* sorted, const ItemBucket& bucket) {
    const RankCorrelationPartial ties = tie_corrections(sorted, bucket.size, tie_positions_.data());
    total.cross += plain_rank_cross(sorted, bucket.size, bucket.start, mean) + ties.cross;
    total.sum_sq += ties.sum_sq;
  });
  return total;
}

template void write_distance_keys<double>(const double*, int64_t, int64_t, int64_t, int64_t,
                                          int64_t, int64_t, uint64_t*);
template bool radix_sort_pairs<uint64_t>(uint64_t*, uint32_t*, uint64_t*, uint32_t*, int64_t);
template void scatter_average_ranks<uint64_t>(const uint64_t*, const uint32_t*, int64_t, double*);
template RankCorrelationPartial correlate_ranks<uint64_t>(const uint64_t*, const uint32_t*, int64_t);

}  // namespace cpu
}  // namespace repcap
