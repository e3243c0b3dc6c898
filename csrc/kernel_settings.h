// Settings and limits of the kernels that both languages need, defined once here. The compiled
// module exports them (repcap_fast._C.build_info()["limits"] and ["precisions"]); the Python
// validation reads them from there, so no number is kept in sync by hand.
// Plain C++ (no torch headers), usable from host and device code.
#pragma once
#include <cstdint>

namespace repcap {

// How float32 dot products are formed, the `precision` argument of every op.
//   kHighest: float32 FMA (IEEE float32 products and sums; no tensor cores for float32).
//   kTF32:    float32 inputs rounded to TF32 on tensor cores (10-bit mantissa), float32 sums.
//   kBF16:    float32 operands rounded to bfloat16 (7-bit mantissa), exact products, float32
//             sums. gram_offdiag_penalty only (the packing optimizer's steps); the other ops
//             refuse it.
// bfloat16/float16 inputs always use exact products with float32 accumulation, and float64
// inputs float64 arithmetic, whatever the precision. The CPU has no tensor cores: its
// gram_offdiag_penalty emulates kTF32 and kBF16 by rounding the GEMM operands
// (csrc/operand_rounding.h); its other ops form float32 products in IEEE float32 at any precision.
enum class Precision : int32_t { kHighest = 0, kTF32 = 1, kBF16 = 2 };
constexpr int32_t kPrecisionCount = 3;

namespace limits {

// pairwise_cosine_stats: each GPU block / Triton program / CPU thread keeps its own int64
// histogram of `bins` counters, so bins bounds that memory.
constexpr int64_t kMaxHistogramBins = int64_t{1} << 16;

// subspace_pga (both ops, every backend): twice the reference ranks of the n = N(N−1)/2 pairs
// (2n) must fit 32 bits (2n < 2^32), and so do the pair indices. One limit for both ops, so
// no op accepts (and allocates N(N−1)/2 ranks for) an N that the other refuses.
constexpr int64_t kMaxPgaTokens = 65536;

// gram_offdiag_penalty: the exponent p (repeated squaring over 31 bits).
constexpr int64_t kMaxPenaltyP = int64_t{1} << 30;

static_assert(kMaxPgaTokens * (kMaxPgaTokens - 1) < (int64_t{1} << 32), "twice the ranks");

}  // namespace limits
}  // namespace repcap
