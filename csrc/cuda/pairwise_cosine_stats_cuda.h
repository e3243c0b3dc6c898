// CUDA launcher interface of pairwise_cosine_stats (no torch headers; driven by
// csrc/pairwise_cosine_stats_ops.cpp).
#pragma once
#include <cstdint>

#include "../kernel_settings.h"
#include "../pairwise_cosine_stats_epilogue.h"

typedef struct CUstream_st* cudaStream_t;

namespace repcap {
namespace cuda {

enum class InputType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

struct PairwiseCosineStatsArgs {
  const void* a;              // m x d, row-major, contiguous, of `type`
  const float* a_inv_norm;    // m: 1/‖a_i‖
  int64_t m;
  const void* b;              // n x d (equal to a when self_pairs)
  const float* b_inv_norm;    // n
  int64_t n;
  int64_t d;
  bool self_pairs;            // true: pairs i<j of a (upper triangle); false: all m*n pairs
  InputType type;
  // float32 inputs: kHighest (float32 FMA, no tensor cores) or kTF32 (tensor cores). bf16/fp16
  // inputs always run on tensor cores with exact products and float32 accumulation.
  Precision precision;
  HistogramSpec hist;
  int num_blocks;             // from pairwise_cosine_stats_cuda_num_blocks
  // Per-block partials, each block writes only its own slot (no float atomics across blocks):
  double* block_sum;          // num_blocks
  double* block_sum_sq;       // num_blocks
  float* block_min;           // num_blocks
  float* block_max;           // num_blocks
  int64_t* block_outside;     // num_blocks x 2: (below, above)
  int64_t* block_hist;        // num_blocks x hist.bins
  cudaStream_t stream;
};

// Number of persistent blocks to launch for this problem on a device with `sm_count` SMs.
int pairwise_cosine_stats_cuda_num_blocks(const PairwiseCosineStatsArgs& args, int sm_count);

// Launches the kernel on args.stream. Returns nullptr on success, else a static error message.
const char* pairwise_cosine_stats_cuda(const PairwiseCosineStatsArgs& args);

// The "panels" variant's reduction (csrc/cuda/pairwise_cosine_stats_panels_cuda.cu): one panel
// of float32 dot products, formed by cuBLAS (csrc/pairwise_cosine_stats_ops.cpp), reduced with
// the epilogue math of csrc/pairwise_cosine_stats_epilogue.h.
struct CosinePanelArgs {
  const float* dots;          // rows x cols, row-major, leading dimension ld: a_i·b_j
  int64_t ld;
  int64_t rows;               // a's rows [row0, row0 + rows)
  int64_t cols;               // b's rows [col0, col0 + cols)
  int64_t row0;
  int64_t col0;
  const float* a_inv_norm;    // rows: 1/‖a_i‖ of the panel's rows
  const float* b_inv_norm;    // cols
  bool self_pairs;            // pairs i<j only (global indices)
  bool first;                 // the first panel: the per-block partials are written, not added to
  HistogramSpec hist;
  int num_blocks;             // the grid; the same for every panel of a call
  // Per-block partials, slot k read and written by block k only (panels run one after another
  // on one stream, so each slot sums its panels in panel order):
  double* block_sum;          // num_blocks
  double* block_sum_sq;       // num_blocks
  float* block_min;           // num_blocks
  float* block_max;           // num_blocks
  int64_t* block_outside;     // num_blocks x 2: (below, above)
  int64_t* hist_out;          // hist.bins, zeroed before the first panel: integer atomics
  cudaStream_t stream;
};

// Number of blocks of the panel reduction on a device with `sm_count` SMs.
int cosine_panel_num_blocks(int sm_count);

// Reduces one panel on args.stream. Returns nullptr on success, else a static error message.
const char* pairwise_cosine_stats_panel_cuda(const CosinePanelArgs& args);

}  // namespace cuda
}  // namespace repcap
