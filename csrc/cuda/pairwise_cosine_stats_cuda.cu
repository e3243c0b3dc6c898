// CUDA kernel of pairwise_cosine_stats: streaming statistics of all pairwise cosines, never
// materializing the m x n cosine matrix. Plain CUDA runtime, no torch headers.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstddef>
#include <cstdint>

#include "pairwise_cosine_stats_cuda.h"

namespace repcap {
namespace cuda {
namespace {

// ---- tiling constants ----

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 128;  // block tile BM == BN (self_pairs needs square tiles)
static_assert(kThreads == 2 * kTile, "one thread per tile row of A and of B loads the inverse norms");

// Histograms of up to this many bins are counted in shared memory, larger ones in global memory.
constexpr int kMaxSharedBins = 8192;
// A shared uint32 bin takes at most kTile * kTile = 2^14 increments per tile: flushing every
// 2^16 tiles keeps it below 2^30.
constexpr int64_t kTilesPerFlush = int64_t{1} << 16;

struct KernelParams {
  const void* a;
  const void* b;
  const float* a_inv_norm;
  const float* b_inv_norm;
  int64_t m;
  int64_t n;
  int64_t d;
  int64_t tile_cols;    // ceil(n / kTile); the side of the square tile grid when self_pairs
  int64_t total_tiles;  // tiles visited: upper triangle (self_pairs) or the full grid
  int64_t tiles_per_flush;
  bool self_pairs;
  bool vector_loads;  // rows are 16-byte aligned: 16-byte copies (cp.async / float4)
  bool shared_hist;
  HistogramSpec hist;
  double* block_sum;
  double* block_sum_sq;
  float* block_min;
  float* block_max;
  int64_t* block_outside;
  int64_t* block_hist;
};

// ---- tile enumeration and pair mask ----

struct TileBounds {
  int64_t row0;  // first row of a in the tile
  int64_t col0;  // first row of b in the tile
  int rows;      // rows of a inside the matrix (<= kTile)
  int cols;      // rows of b inside the matrix (<= kTile)
  bool upper_only;  // diagonal tile of self_pairs: only col > row counts
};

// Tile t of the static enumeration: row-major over the upper triangle bi <= bj (self_pairs) or
// over the full grid.
__host__ __device__ __forceinline__ TileBounds tile_bounds(const KernelParams& p, int64_t t) {
  int64_t bi;
  int64_t bj;
  if (p.self_pairs) {
    upper_tile_coords(t, p.tile_cols, &bi, &bj);
  } else {
    bi = t / p.tile_cols;
    bj = t - bi * p.tile_cols;
  }
  TileBounds tile;
  tile.row0 = bi * kTile;
  tile.col0 = bj * kTile;
  const int64_t rows_left = p.m - tile.row0;
  const int64_t cols_left = p.n - tile.col0;
  tile.rows = static_cast<int>(rows_left < kTile ? rows_left : kTile);
  tile.cols = static_cast<int>(cols_left < kTile ? cols_left : kTile);
  tile.upper_only = p.self_pairs && bi == bj;
  return tile;
}

// Whether tile element (r, c) is a pair of the statistics. Off-diagonal self_pairs tiles have
// bi < bj, hence col > row for every element.
__host__ __device__ __forceinline__ bool counts_pair(const TileBounds& tile, int r, int c) {
  return r < tile.rows && c < tile.cols && (!tile.upper_only || c > r);
}

// ---- per-thread statistics ----

struct ReduceSlot {
  double sum;
  double sum_sq;
  unsigned long long below;
  unsigned long long above;
  float min_cos;
  float max_cos;
};

struct CosineAccumulator {
  HistogramSpec hist;
  unsigned int* shared_hist;         // shared-memory bins, or nullptr
  unsigned long long* global_hist;   // else this block's own slice of block_hist
  const float* row_inv_norm;         // shared copies of the tile's inverse norms
  const float* col_inv_norm;
  TileBounds tile;
  double sum;  // each cosine and its square are added in double (as the CPU kernel does):
  double sum_sq;  // no float32 rounding of c² can leak into σ when σ is tiny
  float min_cos;
  float max_cos;
  unsigned long long below;
  unsigned long long above;

  __device__ __forceinline__ void visit(float dot, int r, int c) {
    if (!counts_pair(tile, r, c)) return;
    const float cosine = cosine_from_dot(dot, row_inv_norm[r], col_inv_norm[c]);
    const double cosine_d = cosine;
    sum += cosine_d;
    sum_sq += cosine_d * cosine_d;
    min_cos = cosine < min_cos ? cosine : min_cos;
    max_cos = cosine > max_cos ? cosine : max_cos;
    const int32_t bin = histogram_bin(cosine, hist);
    if (bin >= 0) {
      if (shared_hist != nullptr) {
        atomicAdd(shared_hist + bin, 1u);
      } else {
        atomicAdd(global_hist + bin, 1ull);
      }
    } else if (bin == kBinBelow) {
      ++below;
    } else {
      ++above;
    }
  }
};

// ---- cp.async primitives (sm_80+) ----

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// ---- tile mainloops ----
// Each computes the tile's dot products C[r][c] = a[row0 + r] · b[col0 + c] (k = 0 .. d-1) and
// hands every element this thread owns to out.visit(C[r][c], r, c). They start and end with all
// threads in step, and __syncthreads() before the first visit.

template <class T>
struct TensorCoreTypes;
template <>
struct TensorCoreTypes<__nv_bfloat16> {
  using Fragment = __nv_bfloat16;
  using Bits = uint16_t;
  static constexpr int kK = 16;
  static constexpr bool kRoundToTF32 = false;
};
template <>
struct TensorCoreTypes<__half> {
  using Fragment = __half;
  using Bits = uint16_t;
  static constexpr int kK = 16;
  static constexpr bool kRoundToTF32 = false;
};
template <>
struct TensorCoreTypes<float> {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  using Fragment = float;  // placeholder: <mma.h> has no tf32 below sm_80, where run_tile traps
#else
  using Fragment = nvcuda::wmma::precision::tf32;
#endif
  using Bits = uint32_t;
  static constexpr int kK = 8;
  static constexpr bool kRoundToTF32 = true;
};

// Tensor cores (wmma 16x16xK, float accumulate): C = A·Bᵀ with A, B the tile's rows of a and b.
// Per stage a 64-byte k-slice of each of the 128 A and 128 B rows sits in shared memory, row-major
// (k contiguous, 80-byte pitch: conflict-free fragment loads); Bᵀ is read as a col_major k x n
// view of the b rows. 3-stage cp.async pipeline. 8 warps as 4 (rows) x 2 (cols), each a 32 x 64
// sub-tile of 2 x 4 fragments. Epilogue: fragments -> shared (half a tile at a time, in the
// operand buffers) -> every thread visits 32 elements per half.
template <class T>
struct TensorCoreMainloop {
  using Types = TensorCoreTypes<T>;
  using Bits = typename Types::Bits;
  static constexpr int kBK = 64 / static_cast<int>(sizeof(T));     // 32 (16-bit) or 16 (float)
  static constexpr int kChunk = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte copy
  static constexpr int kChunksPerRow = kBK / kChunk;
  static constexpr int kLds = kBK + kChunk;  // 16 bytes of padding per row
  static constexpr int kStages = 3;
  static constexpr int kOperandElems = kTile * kLds;
  static constexpr int kStageElems = 2 * kOperandElems;  // A then B
  static constexpr int kWarpRows = 32;
  static constexpr int kWarpCols = 64;
  static constexpr int kFragRows = kWarpRows / 16;
  static constexpr int kFragCols = kWarpCols / 16;
  static constexpr int kLdc = kTile + 4;  // epilogue staging pitch, floats
  static constexpr int kEpilogueRows = kTile / 2;
  static constexpr size_t kOperandBytes = size_t{kStages} * kStageElems * sizeof(T);
  static constexpr size_t kEpilogueBytes = size_t{kEpilogueRows} * kLdc * sizeof(float);
  static constexpr size_t kSmemBytes = kOperandBytes > kEpilogueBytes ? kOperandBytes : kEpilogueBytes;
  static_assert(kWarps == (kTile / kWarpRows) * (kTile / kWarpCols), "warp grid covers the tile");
  static_assert(kSmemBytes % 128 == 0, "the region after the mainloop stays aligned");
  static_assert((kTile * kChunksPerRow) % kThreads == 0 && (kEpilogueRows * kTile) % kThreads == 0,
                "whole loop trips per thread");

  using FragmentA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, Types::kK,
                                           typename Types::Fragment, nvcuda::wmma::row_major>;
  using FragmentB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, Types::kK,
                                           typename Types::Fragment, nvcuda::wmma::col_major>;
  using FragmentC = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, Types::kK, float>;

  // Copies k-slice [k0, k0 + kBK) of the tile's A and B rows into one stage. Rows outside the
  // matrices and k >= d are zero (the K-remainder padding).
  __device__ __forceinline__ static void load_stage(const KernelParams& p, const TileBounds& tile,
                                                    T* stage, int64_t k0) {
    T* s_a = stage;
    T* s_b = stage + kOperandElems;
    if (p.vector_loads) {
      // d % kChunk == 0: a 16-byte chunk lies entirely inside or outside [0, d).
      const T* a = static_cast<const T*>(p.a);
      const T* b = static_cast<const T*>(p.b);
#pragma unroll
      for (int i = 0; i < kTile * kChunksPerRow / kThreads; ++i) {
        const int chunk = static_cast<int>(threadIdx.x) + i * kThreads;
        const int r = chunk / kChunksPerRow;
        const int kc = (chunk % kChunksPerRow) * kChunk;
        const int64_t k = k0 + kc;
        if (r < tile.rows && k < p.d) {
          cp_async_16(s_a + r * kLds + kc, a + (tile.row0 + r) * p.d + k);
        } else {
          *reinterpret_cast<uint4*>(s_a + r * kLds + kc) = make_uint4(0u, 0u, 0u, 0u);
        }
        if (r < tile.cols && k < p.d) {
          cp_async_16(s_b + r * kLds + kc, b + (tile.col0 + r) * p.d + k);
        } else {
          *reinterpret_cast<uint4*>(s_b + r * kLds + kc) = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    } else {
      // Any d, any alignment: element-wise copies of the raw bits (zero bits are 0.0).
      const Bits* a = static_cast<const Bits*>(p.a);
      const Bits* b = static_cast<const Bits*>(p.b);
      Bits* s_a_bits = reinterpret_cast<Bits*>(s_a);
      Bits* s_b_bits = reinterpret_cast<Bits*>(s_b);
#pragma unroll 4
      for (int i = 0; i < kTile * kBK / kThreads; ++i) {
        const int e = static_cast<int>(threadIdx.x) + i * kThreads;
        const int r = e / kBK;
        const int kc = e % kBK;
        const int64_t k = k0 + kc;
        s_a_bits[r * kLds + kc] = (r < tile.rows && k < p.d) ? a[(tile.row0 + r) * p.d + k] : Bits{0};
        s_b_bits[r * kLds + kc] = (r < tile.cols && k < p.d) ? b[(tile.col0 + r) * p.d + k] : Bits{0};
      }
    }
  }

  __device__ __forceinline__ static void multiply_stage(const T* stage, int warp_row, int warp_col,
                                                        FragmentC (&acc)[kFragRows][kFragCols]) {
    const T* s_a = stage + warp_row * kWarpRows * kLds;
    const T* s_b = stage + kOperandElems + warp_col * kWarpCols * kLds;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += Types::kK) {
      FragmentA frag_a[kFragRows];
      FragmentB frag_b[kFragCols];
#pragma unroll
      for (int i = 0; i < kFragRows; ++i) {
        nvcuda::wmma::load_matrix_sync(frag_a[i], s_a + i * 16 * kLds + kk, kLds);
      }
#pragma unroll
      for (int j = 0; j < kFragCols; ++j) {
        nvcuda::wmma::load_matrix_sync(frag_b[j], s_b + j * 16 * kLds + kk, kLds);
      }
      if constexpr (Types::kRoundToTF32) {
#pragma unroll
        for (int i = 0; i < kFragRows; ++i) {
#pragma unroll
          for (int t = 0; t < frag_a[i].num_elements; ++t) {
            frag_a[i].x[t] = nvcuda::wmma::__float_to_tf32(frag_a[i].x[t]);
          }
        }
#pragma unroll
        for (int j = 0; j < kFragCols; ++j) {
#pragma unroll
          for (int t = 0; t < frag_b[j].num_elements; ++t) {
            frag_b[j].x[t] = nvcuda::wmma::__float_to_tf32(frag_b[j].x[t]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kFragRows; ++i) {
#pragma unroll
        for (int j = 0; j < kFragCols; ++j) {
          nvcuda::wmma::mma_sync(acc[i][j], frag_a[i], frag_b[j], acc[i][j]);
        }
      }
    }
  }

  template <class Accumulator>
  __device__ __forceinline__ static void run_tile(const KernelParams& p, const TileBounds& tile,
                                                  unsigned char* smem, Accumulator& out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // bf16 / tf32 wmma and cp.async need sm_80; the launcher refuses older devices
#else
    T* stages = reinterpret_cast<T*>(smem);
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int warp_row = warp / (kTile / kWarpCols);
    const int warp_col = warp % (kTile / kWarpCols);
    FragmentC acc[kFragRows][kFragCols];
#pragma unroll
    for (int i = 0; i < kFragRows; ++i) {
#pragma unroll
      for (int j = 0; j < kFragCols; ++j) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
    }

    const int64_t num_k = (p.d + kBK - 1) / kBK;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_k) load_stage(p, tile, stages + s * kStageElems, int64_t{s} * kBK);
      cp_async_commit();
    }
    for (int64_t kt = 0; kt < num_k; ++kt) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // stage kt landed for every thread; stage (kt - 1) % kStages is free
      const int64_t next = kt + kStages - 1;
      if (next < num_k) load_stage(p, tile, stages + (next % kStages) * kStageElems, next * kBK);
      cp_async_commit();
      multiply_stage(stages + (kt % kStages) * kStageElems, warp_row, warp_col, acc);
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the operands: the epilogue reuses their memory

    float* s_c = reinterpret_cast<float*>(smem);
    for (int half = 0; half < 2; ++half) {
      if (warp_row * kWarpRows / kEpilogueRows == half) {  // warp-uniform
        const int staged_row0 = warp_row * kWarpRows - half * kEpilogueRows;
#pragma unroll
        for (int i = 0; i < kFragRows; ++i) {
#pragma unroll
          for (int j = 0; j < kFragCols; ++j) {
            nvcuda::wmma::store_matrix_sync(
                s_c + (staged_row0 + i * 16) * kLdc + warp_col * kWarpCols + j * 16, acc[i][j], kLdc,
                nvcuda::wmma::mem_row_major);
          }
        }
      }
      __syncthreads();
#pragma unroll 4
      for (int i = 0; i < kEpilogueRows * kTile / kThreads; ++i) {
        const int e = static_cast<int>(threadIdx.x) + i * kThreads;
        const int r = e / kTile;
        const int c = e % kTile;
        out.visit(s_c[r * kLdc + c], half * kEpilogueRows + r, c);
      }
      __syncthreads();  // the staged half is consumed before it is overwritten
    }
#endif
  }
};

// Row (or column) of micro-tile element i of a SIMT thread at position t (0..15) of the 16 x 16
// thread grid: two 4-wide strips, t*4 .. t*4+3 and 64 + t*4 .. 64 + t*4+3.
__host__ __device__ __forceinline__ int micro_tile_index(int t, int i) {
  return (i / 4) * (kTile / 2) + t * 4 + i % 4;
}

// Exact fp32 (SIMT FMA): C = A·Bᵀ with 256 threads as 16 x 16, each an 8 x 8 micro-tile
// (micro_tile_index). Operands are stored k-major (transposed) in shared memory, double-buffered
// through registers: the next k-slice is fetched from global memory during the FMAs.
struct SimtMainloop {
  static constexpr int kBK = 8;
  static constexpr int kLds = kTile + 4;  // k-major rows, floats
  static constexpr int kOperandFloats = kBK * kLds;
  static constexpr int kStageFloats = 2 * kOperandFloats;  // A then B
  static constexpr size_t kSmemBytes = 2 * kStageFloats * sizeof(float);
  static_assert(kSmemBytes % 128 == 0, "the region after the mainloop stays aligned");
  static_assert(kThreads * 4 == kTile * kBK, "each thread fetches 4 k of one row of A and of B");

  struct Fetch {
    float a[4];
    float b[4];
  };

  // 4 consecutive k of row `row` (k .. k+3), zero outside the matrix and past d.
  __device__ __forceinline__ static void fetch_row4(const KernelParams& p, const float* x, int64_t row,
                                                    bool row_inside, int64_t k, float (&v)[4]) {
    if (p.vector_loads) {  // d % 4 == 0: all 4 inside or all outside [0, d)
      float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (row_inside && k < p.d) q = *reinterpret_cast<const float4*>(x + row * p.d + k);
      v[0] = q.x;
      v[1] = q.y;
      v[2] = q.z;
      v[3] = q.w;
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q) v[q] = (row_inside && k + q < p.d) ? x[row * p.d + k + q] : 0.0f;
    }
  }

  // Thread tid fetches row tid / 2, k = k0 + (tid % 2) * 4 .. + 3, of A and of B.
  __device__ __forceinline__ static void fetch(const KernelParams& p, const TileBounds& tile, int64_t k0,
                                               Fetch& f) {
    const int r = static_cast<int>(threadIdx.x) / 2;
    const int64_t k = k0 + (threadIdx.x % 2) * 4;
    fetch_row4(p, static_cast<const float*>(p.a), tile.row0 + r, r < tile.rows, k, f.a);
    fetch_row4(p, static_cast<const float*>(p.b), tile.col0 + r, r < tile.cols, k, f.b);
  }

  __device__ __forceinline__ static void store(const Fetch& f, float* stage) {
    const int r = static_cast<int>(threadIdx.x) / 2;
    const int kc = (threadIdx.x % 2) * 4;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      stage[(kc + q) * kLds + r] = f.a[q];
      stage[kOperandFloats + (kc + q) * kLds + r] = f.b[q];
    }
  }

  __device__ __forceinline__ static void load4(const float* s, float* v) {
    const float4 q = *reinterpret_cast<const float4*>(s);
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  }

  template <class Accumulator>
  __device__ __forceinline__ static void run_tile(const KernelParams& p, const TileBounds& tile,
                                                  unsigned char* smem, Accumulator& out) {
    float* stages = reinterpret_cast<float*>(smem);
    const int tx = static_cast<int>(threadIdx.x) % 16;
    const int ty = static_cast<int>(threadIdx.x) / 16;
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    }

    const int64_t num_k = (p.d + kBK - 1) / kBK;
    Fetch f;
    fetch(p, tile, 0, f);
    store(f, stages);
    __syncthreads();
    for (int64_t kt = 0; kt < num_k; ++kt) {
      const bool has_next = kt + 1 < num_k;
      if (has_next) fetch(p, tile, (kt + 1) * kBK, f);
      const float* s_a = stages + (kt % 2) * kStageFloats;
      const float* s_b = s_a + kOperandFloats;
#pragma unroll
      for (int k = 0; k < kBK; ++k) {
        float va[8];
        float vb[8];
        load4(s_a + k * kLds + ty * 4, va);
        load4(s_a + k * kLds + kTile / 2 + ty * 4, va + 4);
        load4(s_b + k * kLds + tx * 4, vb);
        load4(s_b + k * kLds + kTile / 2 + tx * 4, vb + 4);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(va[i], vb[j], acc[i][j]);
        }
      }
      // Stage (kt + 1) % 2 was last read in iteration kt - 1, before its closing barrier.
      if (has_next) store(f, stages + ((kt + 1) % 2) * kStageFloats);
      __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) out.visit(acc[i][j], micro_tile_index(ty, i), micro_tile_index(tx, j));
    }
  }
};

// ---- the kernel ----

// Shared memory after the mainloop's region: inverse norms of the tile's rows and columns, the
// block reduction slots, then (shared_hist) the histogram counters.
constexpr size_t kNormBytes = 2 * kTile * sizeof(float);
constexpr size_t kReduceBytes = kWarps * sizeof(ReduceSlot);

template <class Mainloop>
size_t dynamic_smem_bytes(bool shared_hist, int bins) {
  return Mainloop::kSmemBytes + kNormBytes + kReduceBytes +
         (shared_hist ? static_cast<size_t>(bins) * sizeof(unsigned int) : 0);
}

// Persistent block b visits tiles t = b, b + gridDim.x, ... For each pair (i, j) of the tile,
// c_ij = clamp(dot(a_i, b_j) * a_inv_norm[i] * b_inv_norm[j], -1, 1); the block accumulates
// Σc and Σc² (double per thread), min, max,
// below/above-range counts and the histogram, then reduces its threads in a fixed order and
// writes only its own slot of the block_* outputs. No float atomics: bitwise deterministic.
template <class Mainloop>
__global__ void __launch_bounds__(kThreads, 2) pairwise_cosine_stats_kernel(const KernelParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  float* s_row_inv_norm = reinterpret_cast<float*>(smem + Mainloop::kSmemBytes);
  float* s_col_inv_norm = s_row_inv_norm + kTile;
  ReduceSlot* s_reduce = reinterpret_cast<ReduceSlot*>(s_col_inv_norm + kTile);
  unsigned int* s_hist = reinterpret_cast<unsigned int*>(s_reduce + kWarps);

  const int tid = static_cast<int>(threadIdx.x);
  const int bins = p.hist.bins;
  unsigned long long* g_hist =
      reinterpret_cast<unsigned long long*>(p.block_hist) + static_cast<int64_t>(blockIdx.x) * bins;
  // Bin b is zeroed, flushed and finalized by thread b % kThreads only.
  for (int b = tid; b < bins; b += kThreads) {
    g_hist[b] = 0ull;
    if (p.shared_hist) s_hist[b] = 0u;
  }
  __syncthreads();

  CosineAccumulator acc;
  acc.hist = p.hist;
  acc.shared_hist = p.shared_hist ? s_hist : nullptr;
  acc.global_hist = g_hist;
  acc.row_inv_norm = s_row_inv_norm;
  acc.col_inv_norm = s_col_inv_norm;
  acc.sum = 0.0;
  acc.sum_sq = 0.0;
  acc.min_cos = INFINITY;
  acc.max_cos = -INFINITY;
  acc.below = 0ull;
  acc.above = 0ull;

  int64_t tiles_since_flush = 0;
  for (int64_t t = blockIdx.x; t < p.total_tiles; t += gridDim.x) {
    acc.tile = tile_bounds(p, t);
    if (tid < kTile) {
      s_row_inv_norm[tid] = tid < acc.tile.rows ? p.a_inv_norm[acc.tile.row0 + tid] : 0.0f;
    } else {
      const int c = tid - kTile;
      s_col_inv_norm[c] = c < acc.tile.cols ? p.b_inv_norm[acc.tile.col0 + c] : 0.0f;
    }
    Mainloop::run_tile(p, acc.tile, smem, acc);

    if (p.shared_hist && ++tiles_since_flush == p.tiles_per_flush) {  // block-uniform
      tiles_since_flush = 0;
      __syncthreads();
      for (int b = tid; b < bins; b += kThreads) {
        g_hist[b] += s_hist[b];
        s_hist[b] = 0u;
      }
    }
    __syncthreads();  // the next tile overwrites the inverse norms and the mainloop buffers
  }

  if (p.shared_hist) {
    for (int b = tid; b < bins; b += kThreads) g_hist[b] += s_hist[b];
  }

  // Fixed-order reduction: xor butterfly within each warp, then warps 0..7 in order.
  ReduceSlot mine;
  mine.sum = acc.sum;
  mine.sum_sq = acc.sum_sq;
  mine.below = acc.below;
  mine.above = acc.above;
  mine.min_cos = acc.min_cos;
  mine.max_cos = acc.max_cos;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    mine.sum += __shfl_xor_sync(0xffffffffu, mine.sum, offset);
    mine.sum_sq += __shfl_xor_sync(0xffffffffu, mine.sum_sq, offset);
    mine.below += __shfl_xor_sync(0xffffffffu, mine.below, offset);
    mine.above += __shfl_xor_sync(0xffffffffu, mine.above, offset);
    const float other_min = __shfl_xor_sync(0xffffffffu, mine.min_cos, offset);
    const float other_max = __shfl_xor_sync(0xffffffffu, mine.max_cos, offset);
    mine.min_cos = other_min < mine.min_cos ? other_min : mine.min_cos;
    mine.max_cos = other_max > mine.max_cos ? other_max : mine.max_cos;
  }
  if (tid % 32 == 0) s_reduce[tid / 32] = mine;
  __syncthreads();
  if (tid == 0) {
    ReduceSlot total = s_reduce[0];
    for (int w = 1; w < kWarps; ++w) {
      const ReduceSlot& other = s_reduce[w];
      total.sum += other.sum;
      total.sum_sq += other.sum_sq;
      total.below += other.below;
      total.above += other.above;
      total.min_cos = other.min_cos < total.min_cos ? other.min_cos : total.min_cos;
      total.max_cos = other.max_cos > total.max_cos ? other.max_cos : total.max_cos;
    }
    const int64_t block = blockIdx.x;
    p.block_sum[block] = total.sum;
    p.block_sum_sq[block] = total.sum_sq;
    p.block_min[block] = total.min_cos;
    p.block_max[block] = total.max_cos;
    p.block_outside[2 * block] = static_cast<int64_t>(total.below);
    p.block_outside[2 * block + 1] = static_cast<int64_t>(total.above);
  }
}

// ---- host launcher ----

enum class KernelKind { kSimt, kTF32, kBFloat16, kFloat16, kUnsupported };

KernelKind kernel_kind(const PairwiseCosineStatsArgs& args) {
  switch (args.type) {
    case InputType::kFloat32:
      if (args.precision == Precision::kHighest) return KernelKind::kSimt;
      if (args.precision == Precision::kTF32) return KernelKind::kTF32;
      return KernelKind::kUnsupported;
    case InputType::kBFloat16:
      return KernelKind::kBFloat16;
    case InputType::kFloat16:
      return KernelKind::kFloat16;
  }
  return KernelKind::kUnsupported;
}

// Calls fn(Mainloop{}) with the mainloop of `kind` (not kUnsupported).
template <class Fn>
auto with_mainloop(KernelKind kind, Fn&& fn) {
  switch (kind) {
    case KernelKind::kTF32:
      return fn(TensorCoreMainloop<float>{});
    case KernelKind::kBFloat16:
      return fn(TensorCoreMainloop<__nv_bfloat16>{});
    case KernelKind::kFloat16:
      return fn(TensorCoreMainloop<__half>{});
    default:
      return fn(SimtMainloop{});
  }
}

int64_t tile_cols_of(const PairwiseCosineStatsArgs& args) {
  const int64_t n = args.self_pairs ? args.m : args.n;
  return n > 0 ? (n + kTile - 1) / kTile : 0;
}

int64_t total_tiles_of(const PairwiseCosineStatsArgs& args) {
  if (args.m <= 0 || args.n <= 0) return 0;
  const int64_t tile_rows = (args.m + kTile - 1) / kTile;
  return args.self_pairs ? upper_tile_count(tile_rows) : tile_rows * tile_cols_of(args);
}

bool shared_hist_of(const PairwiseCosineStatsArgs& args) { return args.hist.bins <= kMaxSharedBins; }

size_t element_bytes(InputType type) { return type == InputType::kFloat32 ? 4 : 2; }

}  // namespace

int pairwise_cosine_stats_cuda_num_blocks(const PairwiseCosineStatsArgs& args, int sm_count) {
  const int64_t total_tiles = total_tiles_of(args);
  const KernelKind kind = kernel_kind(args);
  if (total_tiles <= 0 || kind == KernelKind::kUnsupported || args.hist.bins < 1) return 1;
  const bool shared_hist = shared_hist_of(args);
  const int bins = args.hist.bins;
  int blocks_per_sm = with_mainloop(kind, [&](auto mainloop) {
    using Mainloop = decltype(mainloop);
    const size_t smem = dynamic_smem_bytes<Mainloop>(shared_hist, bins);
    int per_sm = 0;
    if (cudaFuncSetAttribute(pairwise_cosine_stats_kernel<Mainloop>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pairwise_cosine_stats_kernel<Mainloop>,
                                                      kThreads, smem) != cudaSuccess) {
      cudaGetLastError();  // clear; the launch reports the real problem
      per_sm = 1;
    }
    return per_sm;
  });
  if (blocks_per_sm < 1) blocks_per_sm = 1;
  const int64_t resident = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * blocks_per_sm;
  return static_cast<int>(total_tiles < resident ? total_tiles : resident);
}

const char* pairwise_cosine_stats_cuda(const PairwiseCosineStatsArgs& args) {
  const KernelKind kind = kernel_kind(args);
  if (kind == KernelKind::kUnsupported) {
    return "pairwise_cosine_stats_cuda: unsupported type/precision: float32, bfloat16 or float16 inputs, "
           "precision kHighest or kTF32";
  }
  if (args.d < 1) return "pairwise_cosine_stats_cuda: d must be >= 1";
  if (args.m < 0 || args.n < 0) return "pairwise_cosine_stats_cuda: m and n must be >= 0";
  if (args.self_pairs && args.n != args.m) return "pairwise_cosine_stats_cuda: self_pairs needs n == m";
  if (args.hist.bins < 1) return "pairwise_cosine_stats_cuda: hist.bins must be >= 1";
  if (!(args.hist.hi > args.hist.lo)) return "pairwise_cosine_stats_cuda: hist.hi must be > hist.lo";
  if (args.num_blocks < 1) return "pairwise_cosine_stats_cuda: num_blocks must be >= 1";
  if (args.block_sum == nullptr || args.block_sum_sq == nullptr || args.block_min == nullptr ||
      args.block_max == nullptr || args.block_outside == nullptr || args.block_hist == nullptr) {
    return "pairwise_cosine_stats_cuda: a block_* output is null";
  }

  KernelParams p;
  p.a = args.a;
  p.a_inv_norm = args.a_inv_norm;
  p.b = args.self_pairs ? args.a : args.b;
  p.b_inv_norm = args.self_pairs ? args.a_inv_norm : args.b_inv_norm;
  p.m = args.m;
  p.n = args.self_pairs ? args.m : args.n;
  p.d = args.d;
  p.tile_cols = tile_cols_of(args);
  p.total_tiles = total_tiles_of(args);
  p.tiles_per_flush = kTilesPerFlush;
  p.self_pairs = args.self_pairs;
  p.shared_hist = shared_hist_of(args);
  p.hist = args.hist;
  p.block_sum = args.block_sum;
  p.block_sum_sq = args.block_sum_sq;
  p.block_min = args.block_min;
  p.block_max = args.block_max;
  p.block_outside = args.block_outside;
  p.block_hist = args.block_hist;
  if (p.total_tiles > 0 &&
      (p.a == nullptr || p.b == nullptr || p.a_inv_norm == nullptr || p.b_inv_norm == nullptr)) {
    return "pairwise_cosine_stats_cuda: an input pointer is null";
  }
  const size_t chunk_elems = 16 / element_bytes(args.type);
  p.vector_loads = p.d % static_cast<int64_t>(chunk_elems) == 0 &&
                   reinterpret_cast<uintptr_t>(p.a) % 16 == 0 && reinterpret_cast<uintptr_t>(p.b) % 16 == 0;

  if (kind != KernelKind::kSimt) {
    int device = 0;
    int major = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err != cudaSuccess) return cudaGetErrorString(err);
    if (major < 8) {
      return "pairwise_cosine_stats_cuda: tensor-core kernels (tf32, bf16, fp16) need compute capability 8.0 or newer";
    }
  }

  const int num_blocks = args.num_blocks;
  cudaStream_t stream = args.stream;
  const cudaError_t err = with_mainloop(kind, [&](auto mainloop) {
    using Mainloop = decltype(mainloop);
    const size_t smem = dynamic_smem_bytes<Mainloop>(p.shared_hist, p.hist.bins);
    cudaError_t status = cudaFuncSetAttribute(pairwise_cosine_stats_kernel<Mainloop>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem));
    if (status != cudaSuccess) return status;
    pairwise_cosine_stats_kernel<Mainloop><<<num_blocks, kThreads, smem, stream>>>(p);
    return cudaGetLastError();
  });
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace cuda
}  // namespace repcap
