// Launchers of subspace PGA's fused kernel (CPU and CUDA), registered for the ops whose schemas
// are in csrc/module.cpp: projection, pair-distance keys, radix sort, tie-aware ranks and their
// correlation. The kernel math is plain C++ (csrc/cpu/subspace_pga_cpu.*) and CUDA
// (csrc/cuda/subspace_pga_cuda.cu), sharing csrc/subspace_pga_epilogue.h.
//
// Ops, for x (N×d, float32 or float64, rows nonzero) and n = N(N−1)/2 pairs in SciPy's condensed
// order:
//   subspace_pga_ranks(x) -> float64[n]: the average ranks of the cosine distances of x's rows.
//   subspace_pga_rhos(x, bases (B×d×k), ref_ranks float64[n]) -> float64[B]: for each basis b,
//     Spearman's ρ between ref_ranks and the ranks of the cosine distances of the rows of x·B_b
//     (NaN where a projected row is 0 or all distances are equal, for the caller to tell apart).
// Distances are clamped to [0, 2], as scipy.spatial.distance.pdist(·, "cosine") does.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/parallel_blocks.h"
#include "cpu/subspace_pga_cpu.h"
#include "kernel_settings.h"

#ifdef REPCAP_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/subspace_pga_cuda.h"
#endif

namespace {

using repcap::limits::kMaxPgaTokens;  // 2·N(N−1)/2 < 2^32: twice the ranks (and pair indices) fit uint32
constexpr int64_t kTileRows = 256;

void check_x(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) >= 2 && x.size(1) >= 1, op, ": x must be N×d with N >= 2");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, op,
              ": x must be float32 or float64");
  TORCH_CHECK(x.size(0) <= kMaxPgaTokens, op, ": at most ", kMaxPgaTokens,
              " tokens (twice the ranks of the N(N−1)/2 pairs are 32-bit), got ", x.size(0));
}

// The checks of subspace_pga_rhos that do not depend on the device; returns n.
int64_t check_rhos_inputs(const at::Tensor& x, const at::Tensor& bases, const at::Tensor& ref_ranks) {
  check_x(x, "subspace_pga_rhos");
  const int64_t n_tokens = x.size(0), d = x.size(1);
  const int64_t n = n_tokens * (n_tokens - 1) / 2;
  TORCH_CHECK(bases.dim() == 3 && bases.size(1) == d && bases.size(2) >= 1,
              "subspace_pga_rhos: bases must be B×d×k with d=", d);
  TORCH_CHECK(bases.scalar_type() == x.scalar_type(), "subspace_pga_rhos: bases and x dtypes differ");
  TORCH_CHECK(ref_ranks.dim() == 1 && ref_ranks.size(0) == n && ref_ranks.scalar_type() == at::kDouble,
              "subspace_pga_rhos: ref_ranks must be float64 of length N(N−1)/2 = ", n);
  TORCH_CHECK(bases.device() == x.device() && ref_ranks.device() == x.device(),
              "subspace_pga_rhos: x, bases and ref_ranks must be on one device");
  return n;
}

// Unit rows of p in place (float accumulation of the norm in double); false if a row is 0.
template <typename T>
bool normalize_rows(at::Tensor& p) {
  const int64_t rows = p.size(0), cols = p.size(1);
  T* data = p.data_ptr<T>();
  for (int64_t r = 0; r < rows; ++r) {
    T* row = data + r * cols;
    double sq = 0.0;
    for (int64_t c = 0; c < cols; ++c) sq += static_cast<double>(row[c]) * row[c];
    if (!(sq > 0.0)) return false;
    // Divide (not multiply by a reciprocal): a row with one nonzero entry becomes exactly ±1,
    // so exact ties between distances stay exact, as in the reference and SciPy.
    const T norm = static_cast<T>(std::sqrt(sq));
    for (int64_t c = 0; c < cols; ++c) row[c] /= norm;
  }
  return true;
}

// Per-subspace working memory. float32 distances travel as packed items (key << 32 | payload,
// 8 B), written piece by piece and sorted bucket by bucket in cache (repcap::cpu::PackedPairs);
// float64 ones as 8-byte keys and 4-byte payloads, and their sort twins. Plus a 256×N Gram tile
// and the projection.
template <typename T>
struct PairBuffers {
  static constexpr bool kPacked = std::is_same<T, float>::value;
  using Key = typename repcap::cpu::KeyFor<T>::type;
  std::unique_ptr<repcap::cpu::PackedPairs> packed;
  std::vector<Key> keys, tmp_keys;  // split
  std::vector<uint32_t> payloads, tmp_payloads;
  at::Tensor tile;
  at::Tensor proj;

  PairBuffers() = default;
  PairBuffers(int64_t n_tokens, int64_t k, const at::TensorOptions& options) {
    const int64_t n = n_tokens * (n_tokens - 1) / 2;
    if (kPacked) {
      packed.reset(new repcap::cpu::PackedPairs(n, n_tokens - 1));
    } else {
      keys.resize(n);
      tmp_keys.resize(n);
      payloads.resize(n);
      tmp_payloads.resize(n);
    }
    tile = at::empty({kTileRows * n_tokens}, options);
    proj = at::empty({n_tokens, k}, options);
  }

  // Writes the pairs of the unit rows u with their cosine distances, each carrying payload[pair]
  // (twice the reference rank) or, when payload is null, its pair index; scatter_ranks or
  // correlate sorts them.
  void write_distances(const at::Tensor& u, const uint32_t* payload) {
    const int64_t n_tokens = u.size(0);
    const int64_t n = n_tokens * (n_tokens - 1) / 2;
    if constexpr (kPacked) {
      packed->clear();
    } else if (payload != nullptr) {
      std::copy(payload, payload + n, payloads.begin());
    } else {
      for (int64_t t = 0; t < n; ++t) payloads[t] = static_cast<uint32_t>(t);
    }
    for (int64_t row0 = 0; row0 + 1 < n_tokens; row0 += kTileRows) {
      const int64_t rows = std::min(kTileRows, n_tokens - row0);
      const int64_t cols = n_tokens - row0;  // columns j >= row0: the pairs j > i of these rows
      at::Tensor dots = tile.narrow(0, 0, rows * cols).view({rows, cols});
      at::mm_out(dots, u.narrow(0, row0, rows), u.narrow(0, row0, cols).t());
      if constexpr (kPacked) {
        packed->write_distances(dots.data_ptr<float>(), cols, rows, row0, n_tokens, payload);
      } else {
        repcap::cpu::write_distance_keys<T>(dots.data_ptr<T>(), cols, rows, cols, row0, row0, n_tokens,
                                            keys.data());
      }
    }
  }

  // Split pairs: sorts them and returns (keys, payloads) where the ping-pong left them.
  std::pair<const Key*, const uint32_t*> sort_split(int64_t n) {
    const bool in_tmp =
        repcap::cpu::radix_sort_pairs<Key>(keys.data(), payloads.data(), tmp_keys.data(), tmp_payloads.data(), n);
    return in_tmp ? std::pair<const Key*, const uint32_t*>(tmp_keys.data(), tmp_payloads.data())
                  : std::pair<const Key*, const uint32_t*>(keys.data(), payloads.data());
  }

  void scatter_ranks(int64_t n, double* ranks) {
    if constexpr (kPacked) {
      packed->scatter_ranks(ranks);
    } else {
      const auto sorted = sort_split(n);
      repcap::cpu::scatter_average_ranks(sorted.first, sorted.second, n, ranks);
    }
  }

  repcap::RankCorrelationPartial correlate(int64_t n) {
    if constexpr (kPacked) {
      return packed->correlate();
    } else {
      const auto sorted = sort_split(n);
      return repcap::cpu::correlate_ranks(sorted.first, sorted.second, n);
    }
  }
};

at::Tensor subspace_pga_ranks_cpu(const at::Tensor& x_in) {
  check_x(x_in, "subspace_pga_ranks");
  TORCH_CHECK(x_in.device().is_cpu(), "subspace_pga_ranks (cpu): x must be a CPU tensor");
  at::Tensor x = x_in.detach().contiguous().clone();
  const int64_t n_tokens = x.size(0);
  const int64_t n = n_tokens * (n_tokens - 1) / 2;
  at::Tensor ranks = at::empty({n}, x.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "subspace_pga_ranks", [&] {
    TORCH_CHECK(normalize_rows<scalar_t>(x), "subspace_pga_ranks: x has a zero row");
    PairBuffers<scalar_t> buffers(n_tokens, 1, x.options());
    buffers.write_distances(x, nullptr);
    buffers.scatter_ranks(n, ranks.data_ptr<double>());
  });
  return ranks;
}

// Subspaces are shared among OpenMP threads; each thread runs one subspace at a time: the
// projection x·B_b and its Gram tiles with single-threaded BLAS, the keys, their sort and the
// rank correlation. Memory per thread: float32, 8 B per pair, about 1.5 MiB of piece staging and
// counts, and two copies of the largest bucket; float64, 2·12 B per pair; and a 256×N tile.
at::Tensor subspace_pga_rhos_cpu(const at::Tensor& x_in, const at::Tensor& bases_in,
                                 const at::Tensor& ref_ranks_in) {
  const int64_t n = check_rhos_inputs(x_in, bases_in, ref_ranks_in);
  TORCH_CHECK(x_in.device().is_cpu(), "subspace_pga_rhos (cpu): CPU tensors");
  const at::Tensor x = x_in.detach().contiguous();
  const at::Tensor bases = bases_in.detach().contiguous();
  const at::Tensor ref_ranks = ref_ranks_in.detach().contiguous();
  const int64_t n_tokens = x.size(0);
  const int64_t n_bases = bases.size(0), k = bases.size(2);
  at::Tensor rhos = at::full({n_bases}, std::numeric_limits<double>::quiet_NaN(),
                             x.options().dtype(at::kDouble));
  const double* ref = ref_ranks.data_ptr<double>();
  const double mean = 0.5 * static_cast<double>(n + 1);
  double ref_sum_sq = 0.0;
  // The reference ranks travel through each sort as the integers 2·s (average ranks are
  // multiples of 1/2), so the correlation pass reads them in order, without gathers.
  std::vector<uint32_t> twice_ref(static_cast<size_t>(n));
  int64_t twice_total = 0;
  for (int64_t t = 0; t < n; ++t) {
    ref_sum_sq += (ref[t] - mean) * (ref[t] - mean);
    const double twice = 2.0 * ref[t];
    TORCH_CHECK(twice >= 2.0 && twice <= 2.0 * static_cast<double>(n) && twice == std::floor(twice),
                "subspace_pga_rhos: ref_ranks must be average ranks (multiples of 1/2 in [1, n])");
    twice_ref[t] = static_cast<uint32_t>(twice);
    twice_total += twice_ref[t];
  }
  TORCH_CHECK(twice_total == n * (n + 1),
              "subspace_pga_rhos: ref_ranks must be average ranks (they sum to n(n+1)/2)");
  double* out = rhos.data_ptr<double>();
  const int threads = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n_bases)));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "subspace_pga_rhos", [&] {
    using Buffers = PairBuffers<scalar_t>;
    const std::string error = repcap::cpu::for_each_block(
        threads, n_bases, [&](int) { return Buffers(n_tokens, k, x.options()); },
        [&](int, int64_t b, Buffers& buf) {
          at::mm_out(buf.proj, x, bases[b]);
          if (!normalize_rows<scalar_t>(buf.proj)) return;  // ρ stays NaN: a projected row is 0
          buf.write_distances(buf.proj, twice_ref.data());
          const repcap::RankCorrelationPartial partial = buf.correlate(n);
          out[b] = repcap::rank_correlation(partial, ref_sum_sq);
        });
    TORCH_CHECK(error.empty(), "subspace_pga_rhos (cpu): ", error);
  });
  return rhos;
}

#ifdef REPCAP_WITH_CUDA
// CUDA: per batch of B subspaces, the projections x·B_b by cuBLAS (on the current stream; float32
// GEMMs follow torch's cuBLAS float32 precision, which the Python launcher sets from the op's
// `precision` argument), each row normalized once in place, then the distance-key kernel for
// all B, one CUB radix sort per subspace, and the fused
// rank + correlation pass. Memory: (key + 4 B) per pair per subspace, plus one shared sort
// scratch of (key + 4 B) per pair and 4 B per pair of twice the reference ranks.
template <typename T>
struct CudaKey;
template <>
struct CudaKey<float> {
  using type = uint32_t;
  static constexpr at::ScalarType storage = at::kInt;
};
template <>
struct CudaKey<double> {
  using type = uint64_t;
  static constexpr at::ScalarType storage = at::kLong;
};

template <typename U>
U* as_unsigned(const at::Tensor& t) {
  return reinterpret_cast<U*>(t.data_ptr());
}

void check_cuda(const char* err, const char* op) { TORCH_CHECK(err == nullptr, op, " (cuda): ", err ? err : ""); }

// keys and values of n pairs per subspace, sorted per subspace in place.
template <typename T>
void sort_segments(at::Tensor& keys, at::Tensor& values, int64_t n_bases, int64_t n, cudaStream_t stream,
                   const char* op) {
  using Key = typename CudaKey<T>::type;
  at::Tensor alt_keys = at::empty({n}, keys.options());
  at::Tensor alt_values = at::empty({n}, values.options());
  const size_t temp_bytes = repcap::cuda::subspace_pga_sort_temp_bytes(n, sizeof(Key) == 8);
  at::Tensor temp = at::empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, keys.options().dtype(at::kByte));
  for (int64_t b = 0; b < n_bases; ++b) {
    check_cuda(repcap::cuda::subspace_pga_sort_pairs_cuda(as_unsigned<Key>(keys) + b * n,
                                                          as_unsigned<uint32_t>(values) + b * n,
                                                          as_unsigned<Key>(alt_keys), as_unsigned<uint32_t>(alt_values),
                                                          n, temp.data_ptr(), temp_bytes, stream),
               op);
  }
}

template <typename T>
at::Tensor subspace_pga_ranks_cuda_impl(const at::Tensor& x) {
  using Key = typename CudaKey<T>::type;
  const int64_t n_tokens = x.size(0), d = x.size(1);
  const int64_t n = n_tokens * (n_tokens - 1) / 2;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
  at::Tensor unit = x.clone();  // normalized in place: never the caller's tensor
  at::Tensor zero_row = at::zeros({1}, x.options().dtype(at::kInt));
  check_cuda(repcap::cuda::subspace_pga_normalize_rows_cuda(unit.data_ptr<T>(), 1, n_tokens, d,
                                                            zero_row.data_ptr<int32_t>(), stream),
             "subspace_pga_ranks");
  TORCH_CHECK(zero_row.item<int32_t>() == 0, "subspace_pga_ranks: x has a zero row");
  at::Tensor keys = at::empty({n}, x.options().dtype(CudaKey<T>::storage));
  at::Tensor pairs = at::empty({n}, x.options().dtype(at::kInt));
  check_cuda(repcap::cuda::subspace_pga_distance_keys_cuda(unit.data_ptr<T>(), 1, n_tokens, d, nullptr,
                                                           as_unsigned<Key>(keys), as_unsigned<uint32_t>(pairs),
                                                           stream),
             "subspace_pga_ranks");
  sort_segments<T>(keys, pairs, 1, n, stream, "subspace_pga_ranks");
  at::Tensor ranks = at::empty({n}, x.options().dtype(at::kDouble));
  check_cuda(repcap::cuda::subspace_pga_scatter_ranks_cuda(as_unsigned<Key>(keys), as_unsigned<uint32_t>(pairs), n,
                                                           ranks.data_ptr<double>(), stream),
             "subspace_pga_ranks");
  return ranks;
}

at::Tensor subspace_pga_ranks_cuda(const at::Tensor& x_in) {
  check_x(x_in, "subspace_pga_ranks");
  TORCH_CHECK(x_in.is_cuda(), "subspace_pga_ranks (cuda): x must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.detach().contiguous();
  at::Tensor ranks;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "subspace_pga_ranks_cuda",
                             [&] { ranks = subspace_pga_ranks_cuda_impl<scalar_t>(x); });
  return ranks;
}

template <typename T>
void subspace_pga_rhos_cuda_impl(const at::Tensor& x, const at::Tensor& bases, const at::Tensor& twice_ref,
                                 double ref_sum_sq, at::Tensor& rhos) {
  using Key = typename CudaKey<T>::type;
  const int64_t n_tokens = x.size(0);
  const int64_t n_bases = bases.size(0), k = bases.size(2);
  const int64_t n = n_tokens * (n_tokens - 1) / 2;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
  // One GEMM per subspace, each of the same shape whatever the batch, so cuBLAS picks the same
  // kernel and the projections (and ρ) do not depend on the batch size.
  at::Tensor proj = at::empty({n_bases, n_tokens, k}, x.options());
  for (int64_t b = 0; b < n_bases; ++b) {
    at::Tensor out = proj[b];
    at::mm_out(out, x, bases[b]);
  }
  at::Tensor zero_row = at::zeros({n_bases}, x.options().dtype(at::kInt));
  check_cuda(repcap::cuda::subspace_pga_normalize_rows_cuda(proj.data_ptr<T>(), n_bases, n_tokens, k,
                                                            zero_row.data_ptr<int32_t>(), stream),
             "subspace_pga_rhos");
  at::Tensor keys = at::empty({n_bases, n}, x.options().dtype(CudaKey<T>::storage));
  at::Tensor values = at::empty({n_bases, n}, x.options().dtype(at::kInt));
  check_cuda(repcap::cuda::subspace_pga_distance_keys_cuda(
                 proj.data_ptr<T>(), n_bases, n_tokens, k, as_unsigned<uint32_t>(twice_ref),
                 as_unsigned<Key>(keys), as_unsigned<uint32_t>(values), stream),
             "subspace_pga_rhos");
  sort_segments<T>(keys, values, n_bases, n, stream, "subspace_pga_rhos");
  at::Tensor scratch =
      at::empty({n_bases * repcap::cuda::subspace_pga_correlation_scratch(n)}, x.options().dtype(at::kDouble));
  check_cuda(repcap::cuda::subspace_pga_rank_correlation_cuda(
                 as_unsigned<Key>(keys), as_unsigned<uint32_t>(values), n_bases, n, ref_sum_sq,
                 zero_row.data_ptr<int32_t>(), scratch.data_ptr<double>(), rhos.data_ptr<double>(), stream),
             "subspace_pga_rhos");
}

at::Tensor subspace_pga_rhos_cuda(const at::Tensor& x_in, const at::Tensor& bases_in, const at::Tensor& ref_ranks_in) {
  const int64_t n = check_rhos_inputs(x_in, bases_in, ref_ranks_in);
  TORCH_CHECK(x_in.is_cuda(), "subspace_pga_rhos (cuda): CUDA tensors");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.detach().contiguous();
  const at::Tensor bases = bases_in.detach().contiguous();
  const at::Tensor ref = ref_ranks_in.detach().contiguous();
  // The reference ranks travel through each sort as the integers 2·s (checked on the device,
  // one synchronization): multiples of 1/2 in [1, n] that sum to n(n+1)/2.
  at::Tensor twice_ref;  // 2·s < 2^32, carried as uint32 bits (the temporaries die here)
  {
    const at::Tensor twice = ref * 2.0;
    const bool valid = at::logical_and(at::logical_and(twice >= 2.0, twice <= 2.0 * static_cast<double>(n)),
                                       twice == at::floor(twice))
                           .all()
                           .item<bool>();
    TORCH_CHECK(valid, "subspace_pga_rhos: ref_ranks must be average ranks (multiples of 1/2 in [1, n])");
    const at::Tensor twice_i64 = twice.to(at::kLong);
    TORCH_CHECK(twice_i64.sum().item<int64_t>() == n * (n + 1),
                "subspace_pga_rhos: ref_ranks must be average ranks (they sum to n(n+1)/2)");
    twice_ref = twice_i64.to(at::kInt);
  }
  const double mean = 0.5 * static_cast<double>(n + 1);
  const double ref_sum_sq = (ref - mean).square().sum().item<double>();
  at::Tensor rhos = at::empty({bases.size(0)}, x.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "subspace_pga_rhos_cuda",
                             [&] { subspace_pga_rhos_cuda_impl<scalar_t>(x, bases, twice_ref, ref_sum_sq, rhos); });
  return rhos;
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(repcap_fast, CPU, m) {
  m.impl("subspace_pga_ranks", &subspace_pga_ranks_cpu);
  m.impl("subspace_pga_rhos", &subspace_pga_rhos_cpu);
}

#ifdef REPCAP_WITH_CUDA
TORCH_LIBRARY_IMPL(repcap_fast, CUDA, m) {
  m.impl("subspace_pga_ranks", &subspace_pga_ranks_cuda);
  m.impl("subspace_pga_rhos", &subspace_pga_rhos_cuda);
}
#endif
