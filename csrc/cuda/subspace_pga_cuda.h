// CUDA launcher interface of subspace PGA (no torch headers; driven by csrc/subspace_pga_ops.cpp,
// which forms the projections with cuBLAS through ATen and owns every buffer).
//
// For a batch of B subspaces, proj is B×N×k (row-major, contiguous) and n = N(N−1)/2 pairs are
// taken in SciPy's condensed order. Each launcher returns nullptr on success, else a static
// error message. Keys are the shared sortable_key of subspace_pga_epilogue.h: uint32 for float,
// uint64 for double.
#pragma once
#include <cstddef>
#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace repcap {
namespace cuda {

// p_bi ← p_bi / ‖p_bi‖ in place, once per row (squares summed in float64, the norm rounded to T,
// then a division, as the CPU kernel does: one-hot rows become exactly ±1, so exact ties stay
// exact); zero_row[b] = 1 where a row of subspace b has norm 0, which is left as it is (the
// caller zeroes zero_row first).
const char* subspace_pga_normalize_rows_cuda(float* proj, int64_t n_bases, int64_t n_tokens, int64_t k,
                                             int32_t* zero_row, cudaStream_t stream);
const char* subspace_pga_normalize_rows_cuda(double* proj, int64_t n_bases, int64_t n_tokens, int64_t k,
                                             int32_t* zero_row, cudaStream_t stream);

// For the unit rows p̂ (normalized by subspace_pga_normalize_rows_cuda) and j > i:
//   keys[b·n + pair(i, j)]   = sortable_key(clamp(1 − p̂_bi·p̂_bj, 0, 2)),
//   values[b·n + pair(i, j)] = payload[pair(i, j)], or pair(i, j) itself when payload is null.
const char* subspace_pga_distance_keys_cuda(const float* unit_rows, int64_t n_bases, int64_t n_tokens, int64_t k,
                                            const uint32_t* payload, uint32_t* keys, uint32_t* values,
                                            cudaStream_t stream);
const char* subspace_pga_distance_keys_cuda(const double* unit_rows, int64_t n_bases, int64_t n_tokens, int64_t k,
                                            const uint32_t* payload, uint64_t* keys, uint32_t* values,
                                            cudaStream_t stream);

// Scratch bytes of one sort of n (key, uint32 value) pairs (CUB device radix sort).
size_t subspace_pga_sort_temp_bytes(int64_t n, bool wide_keys);

// Sorts one segment of n (key, value) pairs by key in place. alt_keys / alt_values are scratch
// of n (shared by all segments of a batch); temp has subspace_pga_sort_temp_bytes(n) bytes.
const char* subspace_pga_sort_pairs_cuda(uint32_t* keys, uint32_t* values, uint32_t* alt_keys,
                                         uint32_t* alt_values, int64_t n, void* temp, size_t temp_bytes,
                                         cudaStream_t stream);
const char* subspace_pga_sort_pairs_cuda(uint64_t* keys, uint32_t* values, uint64_t* alt_keys,
                                         uint32_t* alt_values, int64_t n, void* temp, size_t temp_bytes,
                                         cudaStream_t stream);

// ranks[sorted_pairs[t]] = the average rank of sorted position t (runs of equal keys share it).
const char* subspace_pga_scatter_ranks_cuda(const uint32_t* sorted_keys, const uint32_t* sorted_pairs,
                                            int64_t n, double* ranks, cudaStream_t stream);
const char* subspace_pga_scatter_ranks_cuda(const uint64_t* sorted_keys, const uint32_t* sorted_pairs,
                                            int64_t n, double* ranks, cudaStream_t stream);

// Doubles of scratch that subspace_pga_rank_correlation_cuda needs per subspace.
int64_t subspace_pga_correlation_scratch(int64_t n);

// Fused rank + correlation over B sorted segments of n pairs each, the values being the
// reference ranks carried as 2·s: per subspace b, with r the average rank of a sorted position
// and m = (n + 1)/2,  rhos[b] = Σ (r − m)(s − m) / sqrt(Σ (r − m)² · ref_sum_sq), NaN when the
// denominator is 0 or zero_row[b] is set. Partial sums are per block, then merged in a fixed
// order (deterministic). scratch holds n_bases · subspace_pga_correlation_scratch(n) doubles.
const char* subspace_pga_rank_correlation_cuda(const uint32_t* sorted_keys, const uint32_t* sorted_twice_ref,
                                               int64_t n_bases, int64_t n, double ref_sum_sq,
                                               const int32_t* zero_row, double* scratch, double* rhos,
                                               cudaStream_t stream);
const char* subspace_pga_rank_correlation_cuda(const uint64_t* sorted_keys, const uint32_t* sorted_twice_ref,
                                               int64_t n_bases, int64_t n, double ref_sum_sq,
                                               const int32_t* zero_row, double* scratch, double* rhos,
                                               cudaStream_t stream);

}  // namespace cuda
}  // namespace repcap
