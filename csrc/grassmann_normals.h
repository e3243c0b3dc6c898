// The standard normals behind grassmann_bases, shared by the C++ CPU kernel, the CUDA kernel and
// the test hooks (plain C++; REPCAP_HD functions compile for host and device).
//
// Normal e of basis b for `seed` (e = i·k + j for entry (i, j) of the d×k basis) comes from one
// call of the counter-based generator Philox4x32-10 (Salmon et al., SC'11; Random123's
// philox4x32 with 10 rounds, the generator of Triton's tl.randint4x and of cuRAND's Philox):
//   key     = (seed mod 2^32, seed div 2^32)
//   counter = (g mod 2^32, g div 2^32, b mod 2^32, b div 2^32),  g = e div 4 (a group of 4),
// whose four 32-bit words w_0..w_3 become uniforms u_i = (w_i + 1/2)·2^-32 in (0, 1) and two
// Box–Muller pairs in float64:
//   (n_0, n_1) = sqrt(−2 ln u_0)·(cos 2πu_1, sin 2πu_1),  (n_2, n_3) likewise from (u_2, u_3),
// and normal e is n_(e mod 4). So a normal depends on (seed, b, e) alone: not on the batch, the
// device or the order of work. The words are bitwise the same everywhere; the normals carry the
// rounding of the platform's log, cos and sin (a few ulp between CPU and GPU).
#pragma once
#include <cmath>
#include <cstdint>

#include "host_device.h"

namespace repcap {
namespace philox {

constexpr uint32_t kMultiplier0 = 0xD2511F53u;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // key increments between rounds
constexpr uint32_t kWeyl1 = 0xBB67AE85u;
constexpr int kRounds = 10;

struct Words {
  uint32_t w[4];
};

// Philox4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1). One round:
//   (c0, c1, c2, c3) ← (hi(M1·c2) ⊕ c1 ⊕ k0, lo(M1·c2), hi(M0·c0) ⊕ c3 ⊕ k1, lo(M0·c0)),
// then k ← k + (W0, W1) mod 2^32.
REPCAP_HD Words philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMultiplier0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMultiplier1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Words{{c0, c1, c2, c3}};
}

// The four normals of group g of basis b (see the top of this file).
REPCAP_HD void normal_group(uint64_t seed, uint64_t basis, uint64_t group, double out[4]) {
  const Words r = philox4x32_10(static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32),
                                static_cast<uint32_t>(basis), static_cast<uint32_t>(basis >> 32),
                                static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  constexpr double kInv2To32 = 2.3283064365386962890625e-10;  // 2^-32
  for (int pair = 0; pair < 2; ++pair) {
    const double u0 = (static_cast<double>(r.w[2 * pair]) + 0.5) * kInv2To32;
    const double u1 = (static_cast<double>(r.w[2 * pair + 1]) + 0.5) * kInv2To32;
    const double radius = sqrt(-2.0 * log(u0));
    const double angle = kTwoPi * u1;
    out[2 * pair] = radius * cos(angle);
    out[2 * pair + 1] = radius * sin(angle);
  }
}

// out[b·per_basis + e] = normal e of basis first_basis + b, for b < n_bases and e < per_basis,
// for the groups [group_begin, group_end) of the flattened output (a group: 4 consecutive
// normals of one basis; per_basis need not be a multiple of 4, the last group of a basis is cut).
REPCAP_HD void fill_group(uint64_t seed, uint64_t first_basis, int64_t per_basis, int64_t groups_per_basis,
                          int64_t flat_group, double* out) {
  const int64_t b = flat_group / groups_per_basis;
  const int64_t g = flat_group - b * groups_per_basis;
  double n[4];
  normal_group(seed, first_basis + static_cast<uint64_t>(b), static_cast<uint64_t>(g), n);
  const int64_t e0 = 4 * g;
  for (int i = 0; i < 4 && e0 + i < per_basis; ++i) out[b * per_basis + e0 + i] = n[i];
}

}  // namespace philox
}  // namespace repcap
