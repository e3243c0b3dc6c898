// CUDA kernels of subspace PGA (see subspace_pga_cuda.h): row normalization (once per row),
// pair-distance keys, CUB radix sort per subspace, and the fused tie-aware rank + correlation
// pass. The key map, the run search and the rank terms are the shared host/device code in
// subspace_pga_epilogue.h, which the CPU kernel uses too.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cstdint>
#include <limits>

#include "../pairwise_cosine_stats_epilogue.h"  // upper_tile_coords
#include "../subspace_pga_epilogue.h"
#include "subspace_pga_cuda.h"

namespace repcap {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;                   // 64×64 pairs per block, 4×4 per thread
constexpr int kMicro = kTile / 16;          // 16×16 threads
constexpr int kChunk = 16;                  // k columns staged per step
constexpr int kItemsPerThread = 8;          // rank pass: sorted positions per thread
constexpr int kRankBlock = kThreads * kItemsPerThread;
constexpr int64_t kMaxGridY = 65535;

const char* launch_error() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// Fixed-order tree reduction of two doubles over the block; valid in thread 0.
__device__ void block_sum2(double* a, double* b, double* shared_a, double* shared_b) {
  shared_a[threadIdx.x] = *a;
  shared_b[threadIdx.x] = *b;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      shared_a[threadIdx.x] += shared_a[threadIdx.x + stride];
      shared_b[threadIdx.x] += shared_b[threadIdx.x + stride];
    }
    __syncthreads();
  }
  *a = shared_a[0];
  *b = shared_b[0];
}

// One warp per row r of the B·N rows: p_r ← p_r / (T) sqrt(Σ_c p_rc²), the squares in float64
// (a zero row is left as it is and flagged).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    subspace_pga_normalize_rows_kernel(T* __restrict__ proj, int64_t rows, int64_t n_tokens, int64_t k,
                                       int32_t* __restrict__ zero_row) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  T* p = proj + row * k;
  double sq = 0.0;
  for (int64_t c = lane; c < k; c += 32) sq += static_cast<double>(p[c]) * static_cast<double>(p[c]);
  for (int offset = 16; offset > 0; offset /= 2) sq += __shfl_down_sync(0xffffffffu, sq, offset);
  sq = __shfl_sync(0xffffffffu, sq, 0);  // lane 0 holds the sum
  if (!(sq > 0.0)) {
    if (lane == 0) atomicOr(zero_row + row / n_tokens, 1);
    return;
  }
  const T norm = static_cast<T>(sqrt(sq));
  for (int64_t c = lane; c < k; c += 32) p[c] = p[c] / norm;
}

// Block (t, b): upper tile t = (bi, bj), bi ≤ bj, of subspace b's N×N pair grid. With the unit
// rows p̂_i staged in shared memory (k in chunks of 16),
//   dist_ij = clamp(1 − Σ_c p̂_ic p̂_jc, 0, 2)   (one fma chain per pair, c ascending),
// written for j > i as keys[pair] = sortable_key(dist_ij), values[pair] = payload[pair] or pair.
template <typename T, typename Key>
__global__ void __launch_bounds__(kThreads)
    subspace_pga_distance_keys_kernel(const T* __restrict__ unit_rows, int64_t n_tokens, int64_t k, int64_t n_col_tiles, int64_t n_pairs,
                                      const uint32_t* __restrict__ payload, Key* __restrict__ keys,
                                      uint32_t* __restrict__ values) {
  __shared__ T rows_i[kChunk][kTile + 1];
  __shared__ T rows_j[kChunk][kTile + 1];
  int64_t bi = 0, bj = 0;
  upper_tile_coords(blockIdx.x, n_col_tiles, &bi, &bj);
  const int64_t b = blockIdx.y;
  const T* p = unit_rows + b * n_tokens * k;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

  T acc[kMicro][kMicro];
#pragma unroll
  for (int r = 0; r < kMicro; ++r)
#pragma unroll
    for (int c = 0; c < kMicro; ++c) acc[r][c] = T(0);

  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
#pragma unroll
    for (int s = 0; s < kTile * kChunk / kThreads; ++s) {
      const int e = threadIdx.x + s * kThreads;
      const int r = e / kChunk, kk = e % kChunk;  // consecutive threads read consecutive columns
      const int64_t col = k0 + kk;
      const int64_t i = bi * kTile + r, j = bj * kTile + r;
      rows_i[kk][r] = (i < n_tokens && col < k) ? p[i * k + col] : T(0);
      rows_j[kk][r] = (j < n_tokens && col < k) ? p[j * k + col] : T(0);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kChunk; ++kk) {
      T a[kMicro], c_[kMicro];
#pragma unroll
      for (int r = 0; r < kMicro; ++r) a[r] = rows_i[kk][ty + 16 * r];
#pragma unroll
      for (int c = 0; c < kMicro; ++c) c_[c] = rows_j[kk][tx + 16 * c];
#pragma unroll
      for (int r = 0; r < kMicro; ++r)
#pragma unroll
        for (int c = 0; c < kMicro; ++c) acc[r][c] = fma(a[r], c_[c], acc[r][c]);
    }
    __syncthreads();
  }

  Key* out_keys = keys + b * n_pairs;
  uint32_t* out_values = values + b * n_pairs;
#pragma unroll
  for (int r = 0; r < kMicro; ++r) {
    const int64_t i = bi * kTile + ty + 16 * r;
    if (i >= n_tokens) continue;
#pragma unroll
    for (int c = 0; c < kMicro; ++c) {
      const int64_t j = bj * kTile + tx + 16 * c;  // a warp writes 16 consecutive pairs of a row
      if (j <= i || j >= n_tokens) continue;
      const int64_t pair = condensed_pair_index(i, j, n_tokens);
      T dist = T(1) - acc[r][c];  // 1 − 1 is +0, so no −0 reaches the key
      dist = dist < T(0) ? T(0) : (dist > T(2) ? T(2) : dist);
      out_keys[pair] = sortable_key(dist);
      out_values[pair] = payload != nullptr ? payload[pair] : static_cast<uint32_t>(pair);
    }
  }
}

template <typename Key>
__global__ void __launch_bounds__(kThreads)
    subspace_pga_scatter_ranks_kernel(const Key* __restrict__ sorted_keys, const uint32_t* __restrict__ sorted_pairs,
                                      int64_t n, double* __restrict__ ranks) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRankBlock + threadIdx.x;
#pragma unroll
  for (int s = 0; s < kItemsPerThread; ++s) {
    const int64_t t = first + s * kThreads;
    if (t < n) ranks[sorted_pairs[t]] = average_rank_at(sorted_keys, n, t);
  }
}

// Block (q, b): sorted positions [q·2048, (q+1)·2048) of subspace b,
//   scratch[b][q] = (Σ (r_t − m)(s_t − m), Σ (r_t − m)²),  s_t = sorted_twice_ref[t] / 2.
template <typename Key>
__global__ void __launch_bounds__(kThreads)
    subspace_pga_rank_terms_kernel(const Key* __restrict__ sorted_keys, const uint32_t* __restrict__ sorted_twice_ref,
                                   int64_t n, double* __restrict__ scratch) {
  __shared__ double shared_cross[kThreads];
  __shared__ double shared_sum_sq[kThreads];
  const int64_t b = blockIdx.y;
  const Key* keys = sorted_keys + b * n;
  const uint32_t* twice_ref = sorted_twice_ref + b * n;
  const double mean = 0.5 * static_cast<double>(n + 1);
  RankCorrelationPartial partial{0.0, 0.0};
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRankBlock + threadIdx.x;
#pragma unroll
  for (int s = 0; s < kItemsPerThread; ++s) {
    const int64_t t = first + s * kThreads;
    if (t < n) add_rank_pair(&partial, average_rank_at(keys, n, t), twice_ref[t], mean);
  }
  block_sum2(&partial.cross, &partial.sum_sq, shared_cross, shared_sum_sq);
  if (threadIdx.x == 0) {
    double* out = scratch + 2 * (b * gridDim.x + blockIdx.x);
    out[0] = partial.cross;
    out[1] = partial.sum_sq;
  }
}

// One block per subspace: the partials merged in a fixed order, then ρ.
__global__ void __launch_bounds__(kThreads)
    subspace_pga_correlation_kernel(const double* __restrict__ scratch, int64_t n_blocks, double ref_sum_sq,
                                    const int32_t* __restrict__ zero_row, double* __restrict__ rhos) {
  __shared__ double shared_cross[kThreads];
  __shared__ double shared_sum_sq[kThreads];
  const int64_t b = blockIdx.x;
  const double* partials = scratch + 2 * b * n_blocks;
  RankCorrelationPartial total{0.0, 0.0};
  for (int64_t q = threadIdx.x; q < n_blocks; q += kThreads) {
    total.cross += partials[2 * q];
    total.sum_sq += partials[2 * q + 1];
  }
  block_sum2(&total.cross, &total.sum_sq, shared_cross, shared_sum_sq);
  if (threadIdx.x == 0) {
    rhos[b] = zero_row[b] ? std::numeric_limits<double>::quiet_NaN() : rank_correlation(total, ref_sum_sq);
  }
}

template <typename T>
const char* normalize_rows(T* proj, int64_t n_bases, int64_t n_tokens, int64_t k, int32_t* zero_row,
                           cudaStream_t stream) {
  const int64_t rows = n_bases * n_tokens;
  if (rows == 0) return nullptr;
  const int64_t blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
  if (blocks > std::numeric_limits<int32_t>::max()) return "subspace_pga: too many rows for one launch";
  subspace_pga_normalize_rows_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      proj, rows, n_tokens, k, zero_row);
  return launch_error();
}

template <typename T, typename Key>
const char* distance_keys(const T* unit_rows, int64_t n_bases, int64_t n_tokens, int64_t k,
                          const uint32_t* payload, Key* keys, uint32_t* values, cudaStream_t stream) {
  const int64_t n_col_tiles = (n_tokens + kTile - 1) / kTile;
  const int64_t n_tiles = n_col_tiles * (n_col_tiles + 1) / 2;
  const int64_t n_pairs = n_tokens * (n_tokens - 1) / 2;
  if (n_pairs == 0 || n_bases == 0) return nullptr;
  if (n_tiles > std::numeric_limits<int32_t>::max()) return "subspace_pga: too many tiles for one launch";
  for (int64_t b0 = 0; b0 < n_bases; b0 += kMaxGridY) {
    const int64_t chunk = n_bases - b0 < kMaxGridY ? n_bases - b0 : kMaxGridY;
    const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(chunk));
    subspace_pga_distance_keys_kernel<T, Key><<<grid, kThreads, 0, stream>>>(
        unit_rows + b0 * n_tokens * k, n_tokens, k, n_col_tiles, n_pairs, payload,
        keys + b0 * n_pairs, values + b0 * n_pairs);
    if (const char* err = launch_error()) return err;
  }
  return nullptr;
}

// CUB's item count: 32-bit offsets (faster) whenever n fits, 64-bit past that.
template <typename Key, typename Count>
cudaError_t radix_sort(void* temp, size_t& temp_bytes, cub::DoubleBuffer<Key>& keys,
                       cub::DoubleBuffer<uint32_t>& values, Count n, cudaStream_t stream) {
  return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, values, n, 0, static_cast<int>(8 * sizeof(Key)),
                                         stream);
}

template <typename Key>
cudaError_t radix_sort_any(void* temp, size_t& temp_bytes, cub::DoubleBuffer<Key>& keys,
                           cub::DoubleBuffer<uint32_t>& values, int64_t n, cudaStream_t stream) {
  if (n <= std::numeric_limits<int32_t>::max()) {
    return radix_sort(temp, temp_bytes, keys, values, static_cast<int32_t>(n), stream);
  }
  return radix_sort(temp, temp_bytes, keys, values, n, stream);
}

template <typename Key>
size_t sort_temp_bytes(int64_t n) {
  cub::DoubleBuffer<Key> keys(nullptr, nullptr);
  cub::DoubleBuffer<uint32_t> values(nullptr, nullptr);
  size_t bytes = 0;
  if (radix_sort_any(nullptr, bytes, keys, values, n, nullptr) != cudaSuccess) return 0;
  return bytes;
}

template <typename Key>
const char* sort_pairs(Key* keys, uint32_t* values, Key* alt_keys, uint32_t* alt_values, int64_t n, void* temp,
                       size_t temp_bytes, cudaStream_t stream) {
  if (n <= 1) return nullptr;
  cub::DoubleBuffer<Key> key_buffers(keys, alt_keys);
  cub::DoubleBuffer<uint32_t> value_buffers(values, alt_values);
  cudaError_t err = radix_sort_any(temp, temp_bytes, key_buffers, value_buffers, n, stream);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  if (key_buffers.Current() != keys) {  // the sort ended in the scratch pair: copy it back
    err = cudaMemcpyAsync(keys, key_buffers.Current(), n * sizeof(Key), cudaMemcpyDeviceToDevice, stream);
    if (err == cudaSuccess) {
      err = cudaMemcpyAsync(values, value_buffers.Current(), n * sizeof(uint32_t), cudaMemcpyDeviceToDevice,
                            stream);
    }
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

int64_t rank_blocks(int64_t n) { return (n + kRankBlock - 1) / kRankBlock; }

template <typename Key>
const char* scatter_ranks(const Key* sorted_keys, const uint32_t* sorted_pairs, int64_t n, double* ranks,
                          cudaStream_t stream) {
  if (n == 0) return nullptr;
  const int64_t blocks = rank_blocks(n);
  if (blocks > std::numeric_limits<int32_t>::max()) return "subspace_pga: too many pairs for one launch";
  subspace_pga_scatter_ranks_kernel<Key><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      sorted_keys, sorted_pairs, n, ranks);
  return launch_error();
}

template <typename Key>
const char* rank_correlation_batch(const Key* sorted_keys, const uint32_t* sorted_twice_ref, int64_t n_bases,
                                   int64_t n, double ref_sum_sq, const int32_t* zero_row, double* scratch,
                                   double* rhos, cudaStream_t stream) {
  if (n_bases == 0) return nullptr;
  const int64_t blocks = rank_blocks(n);
  if (blocks > std::numeric_limits<int32_t>::max()) return "subspace_pga: too many pairs for one launch";
  for (int64_t b0 = 0; b0 < n_bases; b0 += kMaxGridY) {
    const int64_t chunk = n_bases - b0 < kMaxGridY ? n_bases - b0 : kMaxGridY;
    if (blocks > 0) {
      const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(chunk));
      subspace_pga_rank_terms_kernel<Key><<<grid, kThreads, 0, stream>>>(
          sorted_keys + b0 * n, sorted_twice_ref + b0 * n, n, scratch + 2 * b0 * blocks);
      if (const char* err = launch_error()) return err;
    }
  }
  if (n_bases > std::numeric_limits<int32_t>::max()) return "subspace_pga: too many subspaces for one launch";
  subspace_pga_correlation_kernel<<<static_cast<unsigned>(n_bases), kThreads, 0, stream>>>(
      scratch, blocks, ref_sum_sq, zero_row, rhos);
  return launch_error();
}

}  // namespace

const char* subspace_pga_normalize_rows_cuda(float* proj, int64_t n_bases, int64_t n_tokens, int64_t k,
                                             int32_t* zero_row, cudaStream_t stream) {
  return normalize_rows(proj, n_bases, n_tokens, k, zero_row, stream);
}
const char* subspace_pga_normalize_rows_cuda(double* proj, int64_t n_bases, int64_t n_tokens, int64_t k,
                                             int32_t* zero_row, cudaStream_t stream) {
  return normalize_rows(proj, n_bases, n_tokens, k, zero_row, stream);
}

const char* subspace_pga_distance_keys_cuda(const float* unit_rows, int64_t n_bases, int64_t n_tokens, int64_t k,
                                            const uint32_t* payload, uint32_t* keys, uint32_t* values,
                                            cudaStream_t stream) {
  return distance_keys(unit_rows, n_bases, n_tokens, k, payload, keys, values, stream);
}
const char* subspace_pga_distance_keys_cuda(const double* unit_rows, int64_t n_bases, int64_t n_tokens, int64_t k,
                                            const uint32_t* payload, uint64_t* keys, uint32_t* values,
                                            cudaStream_t stream) {
  return distance_keys(unit_rows, n_bases, n_tokens, k, payload, keys, values, stream);
}

size_t subspace_pga_sort_temp_bytes(int64_t n, bool wide_keys) {
  return wide_keys ? sort_temp_bytes<uint64_t>(n) : sort_temp_bytes<uint32_t>(n);
}

const char* subspace_pga_sort_pairs_cuda(uint32_t* keys, uint32_t* values, uint32_t* alt_keys,
                                         uint32_t* alt_values, int64_t n, void* temp, size_t temp_bytes,
                                         cudaStream_t stream) {
  return sort_pairs(keys, values, alt_keys, alt_values, n, temp, temp_bytes, stream);
}
const char* subspace_pga_sort_pairs_cuda(uint64_t* keys, uint32_t* values, uint64_t* alt_keys,
                                         uint32_t* alt_values, int64_t n, void* temp, size_t temp_bytes,
                                         cudaStream_t stream) {
  return sort_pairs(keys, values, alt_keys, alt_values, n, temp, temp_bytes, stream);
}

const char* subspace_pga_scatter_ranks_cuda(const uint32_t* sorted_keys, const uint32_t* sorted_pairs,
                                            int64_t n, double* ranks, cudaStream_t stream) {
  return scatter_ranks(sorted_keys, sorted_pairs, n, ranks, stream);
}
const char* subspace_pga_scatter_ranks_cuda(const uint64_t* sorted_keys, const uint32_t* sorted_pairs,
                                            int64_t n, double* ranks, cudaStream_t stream) {
  return scatter_ranks(sorted_keys, sorted_pairs, n, ranks, stream);
}

int64_t subspace_pga_correlation_scratch(int64_t n) { return 2 * rank_blocks(n); }

const char* subspace_pga_rank_correlation_cuda(const uint32_t* sorted_keys, const uint32_t* sorted_twice_ref,
                                               int64_t n_bases, int64_t n, double ref_sum_sq,
                                               const int32_t* zero_row, double* scratch, double* rhos,
                                               cudaStream_t stream) {
  return rank_correlation_batch(sorted_keys, sorted_twice_ref, n_bases, n, ref_sum_sq, zero_row, scratch, rhos,
                                stream);
}
const char* subspace_pga_rank_correlation_cuda(const uint64_t* sorted_keys, const uint32_t* sorted_twice_ref,
                                               int64_t n_bases, int64_t n, double ref_sum_sq,
                                               const int32_t* zero_row, double* scratch, double* rhos,
                                               cudaStream_t stream) {
  return rank_correlation_batch(sorted_keys, sorted_twice_ref, n_bases, n, ref_sum_sq, zero_row, scratch, rhos,
                                stream);
}

}  // namespace cuda
}  // namespace repcap
