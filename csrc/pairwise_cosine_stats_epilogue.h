// Tile epilogue math of pairwise_cosine_stats, shared by the C++ CPU kernel and the CUDA kernel.
// Plain C++ (no torch headers): the CPU build and its tests exercise exactly what the GPU runs.
#pragma once
#include <cmath>
#include <cstdint>

#include "host_device.h"

namespace repcap {

// Fixed-bin histogram over [lo, hi): bin(c) = floor((c - lo) * bins / (hi - lo)).
// c == hi falls in the last bin (numpy's closed last edge); c < lo and c > hi are counted
// apart (below / above), never dropped.
struct HistogramSpec {
  float lo;
  float hi;
  float bins_per_unit;  // bins / (hi - lo)
  int32_t bins;
};

REPCAP_HD HistogramSpec make_histogram_spec(float lo, float hi, int32_t bins) {
  HistogramSpec spec;
  spec.lo = lo;
  spec.hi = hi;
  spec.bins_per_unit = static_cast<float>(static_cast<double>(bins) / (static_cast<double>(hi) - lo));
  spec.bins = bins;
  return spec;
}

// Slot of c without branches: [0, bins) its bin, bins for c < lo (and NaN), bins + 1 for c > hi.
// slot = min(floor((c - lo)·bins/(hi - lo)), bins - 1) inside [lo, hi].
REPCAP_HD int32_t histogram_slot(float c, const HistogramSpec& spec) {
  float pos = (c - spec.lo) * spec.bins_per_unit;
  const float last = static_cast<float>(spec.bins - 1);
  pos = pos > 0.0f ? pos : 0.0f;  // also maps NaN to 0 before the int conversion
  pos = pos < last ? pos : last;
  int32_t slot = static_cast<int32_t>(pos);
  slot = c >= spec.lo ? slot : spec.bins;
  return c > spec.hi ? spec.bins + 1 : slot;
}

// Sentinels returned by histogram_bin for values outside [lo, hi].
constexpr int32_t kBinBelow = -1;
constexpr int32_t kBinAbove = -2;

// The bin of c in [0, bins), or kBinBelow / kBinAbove (NaN: kBinBelow).
REPCAP_HD int32_t histogram_bin(float c, const HistogramSpec& spec) {
  const int32_t slot = histogram_slot(c, spec);
  if (slot < spec.bins) return slot;
  return slot == spec.bins ? kBinBelow : kBinAbove;
}

// c_ij = clamp(a_i·b_j / (‖a_i‖‖b_j‖), -1, 1). The clamp only removes rounding excess:
// a cosine is in [-1, 1] mathematically.
REPCAP_HD float cosine_from_dot(float dot, float inv_norm_a, float inv_norm_b) {
  float c = dot * inv_norm_a * inv_norm_b;
  c = c > 1.0f ? 1.0f : c;
  return c < -1.0f ? -1.0f : c;
}

// Number of tiles (bi <= bj) in the upper triangle of an nb x nb tile grid.
REPCAP_HD int64_t upper_tile_count(int64_t nb) { return nb * (nb + 1) / 2; }

// Row-major enumeration of the upper-triangle tiles: tile t -> (bi, bj), bi <= bj.
// Row bi starts at offset(bi) = bi*nb - bi*(bi-1)/2. A float estimate, then exact integer fix-up.
REPCAP_HD void upper_tile_coords(int64_t t, int64_t nb, int64_t* bi_out, int64_t* bj_out) {
  const double n = static_cast<double>(nb);
  const double disc = (2.0 * n + 1.0) * (2.0 * n + 1.0) - 8.0 * static_cast<double>(t);
  int64_t bi = static_cast<int64_t>(((2.0 * n + 1.0) - sqrt(disc > 0.0 ? disc : 0.0)) / 2.0);
  if (bi < 0) bi = 0;
  if (bi > nb - 1) bi = nb - 1;
  while (bi > 0 && bi * nb - bi * (bi - 1) / 2 > t) --bi;
  while (bi + 1 < nb && (bi + 1) * nb - (bi + 1) * bi / 2 <= t) ++bi;
  *bi_out = bi;
  *bj_out = bi + (t - (bi * nb - bi * (bi - 1) / 2));
}

// Scalar statistics of a set of cosines. Sums are float64: partials are merged in a fixed order.
struct CosinePartial {
  double sum;
  double sum_sq;
  float min;
  float max;
};

REPCAP_HD CosinePartial empty_partial() {
  CosinePartial p;
  p.sum = 0.0;
  p.sum_sq = 0.0;
  p.min = INFINITY;
  p.max = -INFINITY;
  return p;
}

REPCAP_HD void merge_partial(CosinePartial* into, const CosinePartial& other) {
  into->sum += other.sum;
  into->sum_sq += other.sum_sq;
  into->min = other.min < into->min ? other.min : into->min;
  into->max = other.max > into->max ? other.max : into->max;
}

}  // namespace repcap
