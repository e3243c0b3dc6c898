// Rounding of float32 values to the operand formats of tensor-core GEMMs, shared by the CPU
// emulation of the reduced precisions and the CUDA kernels. Plain C++ (no torch headers).
//
//   round_to_tf32(v): to TF32's 10 explicit mantissa bits, to nearest, ties away from zero
//     (PTX cvt.rna.tf32.f32): add half an ulp of TF32 (2^12 in the bits) to the magnitude, then
//     clear the 13 dropped bits.
//   round_to_bf16(v): to bfloat16's 7 explicit mantissa bits, to nearest, ties to even
//     (__float2bfloat16_rn, torch's float32 → bfloat16): add 2^15 − 1 plus the kept last bit,
//     then clear the 16 dropped bits.
// NaN and ±Inf pass through; a finite value that rounds past the largest finite one becomes
// ±Inf, as the conversions do. The product of two TF32 (11 significant bits) or two bfloat16
// (8 bits) values is exact in float32 (24 bits), so float32 GEMMs of rounded operands form
// exactly the products the tensor cores form; only the order and rounding of the float32 sums
// differ.
#pragma once
#include <cstdint>
#include <cstring>

#include "host_device.h"
#include "kernel_settings.h"

namespace repcap {

REPCAP_HD uint32_t float_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

REPCAP_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

REPCAP_HD bool is_nan_or_inf_bits(uint32_t u) { return (u & 0x7f800000u) == 0x7f800000u; }

REPCAP_HD float round_to_tf32(float v) {
  const uint32_t u = float_bits(v);
  if (is_nan_or_inf_bits(u)) return v;
  return bits_float((u + 0x1000u) & 0xffffe000u);
}

REPCAP_HD float round_to_bf16(float v) {
  const uint32_t u = float_bits(v);
  if (is_nan_or_inf_bits(u)) return v;
  return bits_float((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

// v rounded to the operand format of `precision` (kHighest: v itself). Float64 operands are
// never rounded (float64 inputs run in float64 at any precision).
REPCAP_HD float round_operand(float v, Precision precision) {
  return precision == Precision::kTF32 ? round_to_tf32(v) : precision == Precision::kBF16 ? round_to_bf16(v) : v;
}
REPCAP_HD double round_operand(double v, Precision) { return v; }

}  // namespace repcap
