// CUDA reduction of the "panels" variant of pairwise_cosine_stats: cuBLAS forms a panel of dot
// products in float32 (csrc/pairwise_cosine_stats_ops.cpp); this kernel turns it into cosines
// and statistics with the shared epilogue math (csrc/pairwise_cosine_stats_epilogue.h), reading
// each dot product once: its cost is the panel's bytes, about 4 B per pair, on top of the GEMM's
// write. Plain CUDA runtime, no torch headers.
#include <cuda_runtime.h>

#include <cstdint>

#include "block_reduce.cuh"
#include "pairwise_cosine_stats_cuda.h"

namespace repcap {
namespace cuda {
namespace {

constexpr int kPanelThreads = 256;
// Histograms of up to this many bins are counted per block in shared memory (32 KB), larger ones
// straight into the global int64 histogram.
constexpr int kPanelSharedBins = 8192;

// Block k takes the panel rows k, k + K, ... (K = gridDim.x); its threads stride along the row.
// For row r (i = row0 + r) and column c (j = col0 + c), kept when j > i for self pairs:
//   cos = cosine_from_dot(dots[r][c], inv_a[r], inv_b[c]),
//   Σcos and Σcos² in float64 per thread, min and max in float32, then fixed-order block trees;
//   slot = histogram_slot(cos): its bin counted (shared uint32 per block, or global int64),
//   below/above counted per thread.
// Thread 0 writes (first panel) or adds to the block's partial slot; the shared histogram is
// added to the global one with one integer atomic per nonzero bin.
template <bool kSharedHist>
__global__ void __launch_bounds__(kPanelThreads) cosine_panel_kernel(CosinePanelArgs args) {
  extern __shared__ unsigned int shared_hist[];
  __shared__ double shared_double[kPanelThreads];
  __shared__ float shared_float[kPanelThreads];
  __shared__ long long shared_count[kPanelThreads];
  const int32_t bins = args.hist.bins;
  if (kSharedHist) {
    for (int b = threadIdx.x; b < bins; b += kPanelThreads) shared_hist[b] = 0u;
    __syncthreads();
  }
  double sum = 0.0, sum_sq = 0.0;
  float lowest = INFINITY, highest = -INFINITY;
  long long below = 0, above = 0;
  for (int64_t r = blockIdx.x; r < args.rows; r += gridDim.x) {
    const int64_t i = args.row0 + r;
    int64_t c_begin = 0;
    if (args.self_pairs) c_begin = i + 1 - args.col0 > 0 ? i + 1 - args.col0 : 0;
    const float inv_a = args.a_inv_norm[r];
    const float* row = args.dots + r * args.ld;
    for (int64_t c = c_begin + threadIdx.x; c < args.cols; c += kPanelThreads) {
      const float cos = cosine_from_dot(row[c], inv_a, args.b_inv_norm[c]);
      sum += static_cast<double>(cos);
      sum_sq += static_cast<double>(cos) * static_cast<double>(cos);
      lowest = fminf(lowest, cos);
      highest = fmaxf(highest, cos);
      const int32_t slot = histogram_slot(cos, args.hist);
      if (slot < bins) {
        if (kSharedHist) {
          atomicAdd(&shared_hist[slot], 1u);
        } else {
          atomicAdd(reinterpret_cast<unsigned long long*>(args.hist_out + slot), 1ull);
        }
      } else if (slot == bins) {
        ++below;
      } else {
        ++above;
      }
    }
  }
  const double block_sum = block_reduce<kPanelThreads>(sum, shared_double, SumOp());
  const double block_sum_sq = block_reduce<kPanelThreads>(sum_sq, shared_double, SumOp());
  const float block_min = block_reduce<kPanelThreads>(lowest, shared_float, MinOp());
  const float block_max = block_reduce<kPanelThreads>(highest, shared_float, MaxOp());
  const long long block_below = block_reduce<kPanelThreads>(below, shared_count, SumOp());
  const long long block_above = block_reduce<kPanelThreads>(above, shared_count, SumOp());
  if (threadIdx.x == 0) {
    const int k = blockIdx.x;
    if (args.first) {
      args.block_sum[k] = block_sum;
      args.block_sum_sq[k] = block_sum_sq;
      args.block_min[k] = block_min;
      args.block_max[k] = block_max;
      args.block_outside[2 * k] = block_below;
      args.block_outside[2 * k + 1] = block_above;
    } else {
      args.block_sum[k] += block_sum;
      args.block_sum_sq[k] += block_sum_sq;
      args.block_min[k] = fminf(args.block_min[k], block_min);
      args.block_max[k] = fmaxf(args.block_max[k], block_max);
      args.block_outside[2 * k] += block_below;
      args.block_outside[2 * k + 1] += block_above;
    }
  }
  if (kSharedHist) {
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += kPanelThreads) {
      const unsigned int count = shared_hist[b];
      if (count != 0u) {
        atomicAdd(reinterpret_cast<unsigned long long*>(args.hist_out + b), static_cast<unsigned long long>(count));
      }
    }
  }
}

}  // namespace

int cosine_panel_num_blocks(int sm_count) { return 4 * (sm_count > 0 ? sm_count : 1); }

const char* pairwise_cosine_stats_panel_cuda(const CosinePanelArgs& args) {
  if (args.rows <= 0 || args.cols <= 0) return "pairwise_cosine_stats (panels): empty panel";
  if (args.num_blocks <= 0) return "pairwise_cosine_stats (panels): no blocks";
  // A shared uint32 bin counts one block's pairs of one panel: far below 2^32 at any panel size.
  const bool shared = args.hist.bins <= kPanelSharedBins;
  if (shared) {
    cosine_panel_kernel<true><<<args.num_blocks, kPanelThreads, args.hist.bins * sizeof(unsigned int),
                                args.stream>>>(args);
  } else {
    cosine_panel_kernel<false><<<args.num_blocks, kPanelThreads, 0, args.stream>>>(args);
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace cuda
}  // namespace repcap
