// Elementwise math of gram_offdiag_penalty, shared by the C++ CPU kernel and the CUDA kernel.
// Plain C++ (no torch headers): the CPU build and its tests exercise exactly what the GPU runs.
//
// The penalty L = Σ_{i≠j} |g_ij|^p is streamed row by row with a running row maximum
// m_i = max_{j≠i} |g_ij| (online rescaling, as in streaming softmax), so |g|^p is only ever
// formed for ratios r = |g|/m_i in [0, 1]: no overflow for large |g| or p, and no underflow of
// the largest terms. Per row the kernels keep
//   s_i    = Σ_{j≠i} r_ij^p                       (float64)
//   acc_i  = Σ_{j≠i} sign(g_ij) r_ij^(p-1) x_j     (the gradient direction)
// and the caller forms L = Σ_i m_i^p s_i and ∂L/∂x_i = 2p m_i^(p-1) acc_i in float64.
#pragma once
#include <cstdint>

#include "host_device.h"

namespace repcap {

// r^n for an integer n >= 0 by repeated squaring (r^0 = 1).
template <typename T>
REPCAP_HD T int_power(T r, int32_t n) {
  T result = T(1);
  T base = r;
  while (n > 0) {
    if (n & 1) result *= base;
    n >>= 1;
    if (n > 0) base *= base;
  }
  return result;
}

// The bit length of n >= 0 (0 for n = 0).
inline int32_t bit_length(int32_t n) {
  int32_t bits = 0;
  while ((n >> bits) > 0) ++bits;
  return bits;
}

// r^N for a compile-time N: the same product unrolled, so CPU loops over a row vectorize.
template <int32_t N, typename T>
REPCAP_HD T int_power_static(T r) {
  if constexpr (N == 0) {
    return T(1);
  } else if constexpr (N == 1) {
    return r;
  } else {
    const T half = int_power_static<N / 2>(r);
    return (N % 2 == 1) ? half * half * r : half * half;
  }
}

// Rescaling of a row's partials when its running maximum grows from m_old to m_new >= m_old:
//   s ← alpha·s with alpha = (m_old/m_new)^p,   acc ← beta·acc with beta = (m_old/m_new)^(p-1).
// inv_max = 1/m_new (0 when the whole row so far is 0: its terms and weights are then all 0).
template <typename T>
struct PenaltyRescale {
  T inv_max;
  double alpha;
  T beta;
};

template <typename T>
REPCAP_HD PenaltyRescale<T> penalty_rescale(T m_old, T m_new, int32_t p) {
  PenaltyRescale<T> out;
  if (!(m_new > T(0))) {
    out.inv_max = T(0);
    out.alpha = 1.0;
    out.beta = T(1);
    return out;
  }
  const T ratio = m_old / m_new;  // in [0, 1]
  out.inv_max = T(1) / m_new;
  out.beta = int_power(ratio, p - 1);
  out.alpha = static_cast<double>(out.beta) * static_cast<double>(ratio);
  return out;
}

// One Gram entry g with the row's 1/m: r = min(|g|/m, 1) (the min only removes rounding excess),
// term = r^p and weight = sign(g)·r^(p-1) (0 for g = 0, also when p = 1).
template <typename T>
struct PenaltyTerm {
  T term;
  T weight;
};

template <typename T>
REPCAP_HD PenaltyTerm<T> penalty_term_from_power(T g, T r, T r_pow_p_minus_1) {
  PenaltyTerm<T> out;
  out.term = r_pow_p_minus_1 * r;
  out.weight = r_pow_p_minus_1 * (static_cast<T>(g > T(0)) - static_cast<T>(g < T(0)));
  return out;
}

// NaN (an overflowed Gram entry: inf·0) stays NaN, so the caller can detect it.
template <typename T>
REPCAP_HD T penalty_ratio(T g, T inv_max) {
  const T r = (g < T(0) ? -g : g) * inv_max;
  return r > T(1) ? T(1) : r;
}

template <typename T>
REPCAP_HD PenaltyTerm<T> penalty_term(T g, T inv_max, int32_t p) {
  const T r = penalty_ratio(g, inv_max);
  return penalty_term_from_power(g, r, int_power(r, p - 1));
}

// penalty_term with p fixed at compile time (P >= 1).
template <int32_t P, typename T>
REPCAP_HD PenaltyTerm<T> penalty_term_static(T g, T inv_max) {
  const T r = penalty_ratio(g, inv_max);
  return penalty_term_from_power(g, r, int_power_static<P - 1>(r));
}

}  // namespace repcap
