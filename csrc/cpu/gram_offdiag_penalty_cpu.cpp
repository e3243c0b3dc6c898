#include "gram_offdiag_penalty_cpu.h"

#include <algorithm>
#include <cmath>

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
// the baseline. P > 0 fixes p at compile time (unrolled powers); P == 0 takes p at run time.
template <typename T, int32_t P, bool kWriteWeights>
REPCAP_CLONES T row_terms(T* g, int64_t cols, T inv_max, int32_t p) {
  T sum = T(0);
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < cols; ++j) {
    PenaltyTerm<T> t;
    if constexpr (P > 0) {
      t = penalty_term_static<P>(g[j], inv_max);
    } else {
      t = penalty_term(g[j], inv_max, p);
    }
    sum += t.term;
    if constexpr (kWriteWeights) g[j] = t.weight;
  }
  return sum;
}

template <typename T, int32_t P>
T row_terms_for(T* g, int64_t cols, T inv_max, int32_t p, bool write_weights) {
  return write_weights ? row_terms<T, P, true>(g, cols, inv_max, p)
                       : row_terms<T, P, false>(g, cols, inv_max, p);
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

template float penalty_row_update<float>(float*, int64_t, int64_t, int32_t, float*, double*, bool);
template double penalty_row_update<double>(double*, int64_t, int64_t, int32_t, double*, double*,
                                           bool);

}  // namespace cpu
}  // namespace repcap
