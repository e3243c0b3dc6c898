// CUDA launcher of the operand rounding of csrc/operand_rounding.h, shared by the ops whose
// float32 operands go to TF32 tensor cores rounded to nearest (gram_offdiag_penalty's x, and
// pairwise_cosine_stats's rows in its cuBLAS panels variant). No torch headers.
#pragma once
#include <cstdint>

#include "../kernel_settings.h"

typedef struct CUstream_st* cudaStream_t;

namespace repcap {
namespace cuda {

// v[0..n) ← round_operand(v, precision) on `stream` (kHighest: nothing is launched). Returns
// nullptr on success, else a static error message.
const char* round_operands_cuda(float* v, int64_t n, Precision precision, cudaStream_t stream);

}  // namespace cuda
}  // namespace repcap
