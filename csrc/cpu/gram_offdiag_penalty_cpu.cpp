#include "gram_offdiag_penalty_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "../operand_rounding.h"

namespace repcap {
namespace cpu {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define REPCAP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define REPCAP_CLONES
#endif

// max_j |g_j| over the row (the diagonal entry is already 0).
template <typename T>
REPCAP_CLONES T row_abs_max(const T* g, int64_t cols) {
  T m = T(0);
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < cols; ++j) m = std::max(m, std::abs(g[j]));
  return m;
}


// Σ_j r_j^p over one tile row, and g_j ← sign(g_j)·r_j^(p-1) when kWriteWeights, with
// r_j = min(|g_j|·inv_max, 1). The tile-row sum (≤ 512 terms, each ≤ 1) is accumulated in T,
// lane-wise, and merged into the row's float64 sum by the caller. Compiled for AVX-512, AVX2 and
// the baseline. P > 0 fixes p at compile time (unrolled powers); row_terms_runtime_p below takes
// any other p at run time.
//
// Ratios below r_floor = (smallest normal T)^(1/p) count as 0: their p-th power would be
// subnormal, and x86 arithmetic on subnormals is about 100 times slower (measured on k = 2000,
// d = 32 unit rows: one pass took 6.0 / 21.8 / 181 ms at p = 11 / 20 / 64 before, 6.0 / 6.3 / 7.6 ms
// after). A row's sum holds its
// maximum's term 1, so each dropped term (< 2^-126 in float32) is far below its resolution.
template <typename T>
inline T floored_ratio(T g, T inv_max, T r_floor) {
  const T r = penalty_ratio(g, inv_max);
  return r < r_floor ? T(0) : r;  // NaN stays NaN (the caller detects it)
}

template <typename T, int32_t P, bool kWriteWeights>
REPCAP_CLONES T row_terms(T* g, int64_t cols, T inv_max, T r_floor) {
  T sum = T(0);
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < cols; ++j) {
    const T r = floored_ratio(g[j], inv_max, r_floor);
    const PenaltyTerm<T> t = penalty_term_from_power(g[j], r, int_power_static<P - 1>(r));
    sum += t.term;
    if constexpr (kWriteWeights) g[j] = t.weight;
  }
  return sum;
}

// The same for a p without a compile-time case: r^(p-1) by squaring, one vectorized pass over
// (up to) 512 entries per bit of p - 1 (the products of int_power, in the same order).
template <typename T, bool kWriteWeights>
REPCAP_CLONES T row_terms_runtime_p(T* g, int64_t cols, T inv_max, int32_t p, T r_floor) {
  constexpr int64_t kChunk = 512;
  alignas(64) T ratio[kChunk];
  alignas(64) T base[kChunk];
  alignas(64) T power[kChunk];
  const int32_t n = p - 1;
  const int32_t nbits = bit_length(n);
  T sum = T(0);
  for (int64_t j0 = 0; j0 < cols; j0 += kChunk) {
    const int64_t len = std::min(kChunk, cols - j0);
    T* gc = g + j0;
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) {
      ratio[j] = floored_ratio(gc[j], inv_max, r_floor);
      base[j] = ratio[j];
      power[j] = T(1);
    }
    for (int32_t b = 0; b < nbits; ++b) {
      if ((n >> b) & 1) {
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) power[j] *= base[j];
      }
      if (b + 1 < nbits) {
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) base[j] *= base[j];
      }
    }
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < len; ++j) {
      const PenaltyTerm<T> t = penalty_term_from_power(gc[j], ratio[j], power[j]);
      sum += t.term;
      if constexpr (kWriteWeights) gc[j] = t.weight;
    }
  }
  return sum;
}

template <typename T, int32_t P>
T row_terms_for(T* g, int64_t cols, T inv_max, int32_t p, bool write_weights) {
  // Capped below 1 - 2^-10: at p beyond about 8.5e7 (float32) the floor itself would reach 1 and
  // drop the row maximum's own term; ratios under the cap then have powers that are exactly 0 anyway.
  const T r_floor = static_cast<T>(std::min(
      std::pow(static_cast<double>(std::numeric_limits<T>::min()), 1.0 / p) * (1.0 + 1e-6), 1.0 - 1.0 / 1024));
  if constexpr (P == 0) {
    return write_weights ? row_terms_runtime_p<T, true>(g, cols, inv_max, p, r_floor)
                         : row_terms_runtime_p<T, false>(g, cols, inv_max, p, r_floor);
  } else {
    return write_weights ? row_terms<T, P, true>(g, cols, inv_max, r_floor)
                         : row_terms<T, P, false>(g, cols, inv_max, r_floor);
  }
}

template <typename T>
T row_terms_dispatch(T* g, int64_t cols, T inv_max, int32_t p, bool write_weights) {
  switch (p) {
#define REPCAP_PENALTY_CASE(N) \
  case N:                      \
    return row_terms_for<T, N>(g, cols, inv_max, p, write_weights);
    REPCAP_PENALTY_CASE(1)
    REPCAP_PENALTY_CASE(2)
    REPCAP_PENALTY_CASE(3)
    REPCAP_PENALTY_CASE(4)
    REPCAP_PENALTY_CASE(5)
    REPCAP_PENALTY_CASE(6)
    REPCAP_PENALTY_CASE(7)
    REPCAP_PENALTY_CASE(8)
    REPCAP_PENALTY_CASE(9)
    REPCAP_PENALTY_CASE(10)
    REPCAP_PENALTY_CASE(11)
    REPCAP_PENALTY_CASE(12)
    REPCAP_PENALTY_CASE(13)
    REPCAP_PENALTY_CASE(14)
    REPCAP_PENALTY_CASE(15)
    REPCAP_PENALTY_CASE(16)
    REPCAP_PENALTY_CASE(17)
    REPCAP_PENALTY_CASE(18)
    REPCAP_PENALTY_CASE(19)
    REPCAP_PENALTY_CASE(20)
#undef REPCAP_PENALTY_CASE
    default:
      return row_terms_for<T, 0>(g, cols, inv_max, p, write_weights);
  }
}

}  // namespace

template <typename T>
T penalty_row_update(T* g, int64_t cols, int64_t diag, int32_t p, T* row_max, double* row_sum,
                     bool write_weights) {
  if (diag >= 0 && diag < cols) g[diag] = T(0);
  const T m_old = *row_max;
  const T m_new = std::max(m_old, row_abs_max(g, cols));
  const PenaltyRescale<T> rescale = penalty_rescale(m_old, m_new, p);
  const double terms = row_terms_dispatch(g, cols, rescale.inv_max, p, write_weights);
  *row_sum = *row_sum * rescale.alpha + terms;
  *row_max = m_new;
  return rescale.beta;
}

namespace {
template <Precision kPrecision>
REPCAP_CLONES void round_operands_as(float* v, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) v[j] = round_operand(v[j], kPrecision);
}
}  // namespace

void round_operands(float* v, int64_t n, Precision precision) {
  if (precision == Precision::kTF32) round_operands_as<Precision::kTF32>(v, n);
  if (precision == Precision::kBF16) round_operands_as<Precision::kBF16>(v, n);
}

template float penalty_row_update<float>(float*, int64_t, int64_t, int32_t, float*, double*, bool);
template double penalty_row_update<double>(double*, int64_t, int64_t, int32_t, double*, double*,
                                           bool);

}  // namespace cpu
}  // namespace repcap
