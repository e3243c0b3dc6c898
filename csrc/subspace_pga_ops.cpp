// Torch bindings of subspace PGA's fused kernel (CPU): projection, pair-distance keys, radix
// sort, tie-aware ranks and their correlation. A translation unit of its own; the kernel math is
// plain C++ (csrc/cpu/subspace_pga_cpu.*, csrc/subspace_pga_epilogue.h).
//
// Ops, for x (N×d, float32 or float64, rows nonzero) and n = N(N−1)/2 pairs in SciPy's condensed
// order:
//   subspace_pga_ranks(x) -> float64[n]: the average ranks of the cosine distances of x's rows.
//   subspace_pga_rhos(x, bases (B×d×k), ref_ranks float64[n]) -> float64[B]: for each basis b,
//     Spearman's ρ between ref_ranks and the ranks of the cosine distances of the rows of x·B_b
//     (NaN where a projected row is 0 or all distances are equal, for the caller to tell apart).
// Distances are clamped to [0, 2], as scipy.spatial.distance.pdist(·, "cosine") does.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu/parallel_blocks.h"
#include "cpu/subspace_pga_cpu.h"

namespace {

constexpr int64_t kMaxTokens = 92681;      // N(N−1)/2 < 2^32: pair indices fit uint32
constexpr int64_t kMaxTokensRhos = 65536;  // 2·N(N−1)/2 < 2^32: twice the ranks fit uint32
constexpr int64_t kTileRows = 256;

void check_x(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) >= 2 && x.size(1) >= 1, op, ": x must be N×d with N >= 2");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, op,
              ": x must be float32 or float64");
  TORCH_CHECK(x.device().is_cpu(), op, ": this op runs on CPU tensors");
  TORCH_CHECK(x.size(0) <= kMaxTokens, op, ": at most ", kMaxTokens, " tokens (pair indices are 32-bit), got ",
              x.size(0));
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

// Per-subspace working memory: keys and pair indices (and their radix-sort twins), a Gram tile.
template <typename T>
struct PairBuffers {
  using Key = typename repcap::cpu::KeyFor<T>::type;
  std::vector<Key> keys, tmp_keys;
  std::vector<uint32_t> pairs, tmp_pairs;  // per-pair values carried through the sort
  at::Tensor tile;
  at::Tensor proj;

  PairBuffers() = default;
  PairBuffers(int64_t n_tokens, int64_t k, const at::TensorOptions& options) {
    const int64_t n = n_tokens * (n_tokens - 1) / 2;
    keys.resize(n);
    tmp_keys.resize(n);
    pairs.resize(n);
    tmp_pairs.resize(n);
    tile = at::empty({kTileRows * n_tokens}, options);
    proj = at::empty({n_tokens, k}, options);
  }

  // Keys of the cosine distances of the unit rows u, sorted together with pairs[] (the caller's
  // per-pair values: pair indices, or twice the reference ranks).
  void sort_distances(const at::Tensor& u) {
    const int64_t n_tokens = u.size(0);
    for (int64_t row0 = 0; row0 + 1 < n_tokens; row0 += kTileRows) {
      const int64_t rows = std::min(kTileRows, n_tokens - row0);
      const int64_t cols = n_tokens - row0;  // columns j >= row0: the pairs j > i of these rows
      at::Tensor dots = tile.narrow(0, 0, rows * cols).view({rows, cols});
      at::mm_out(dots, u.narrow(0, row0, rows), u.narrow(0, row0, cols).t());
      repcap::cpu::write_distance_keys<T>(dots.data_ptr<T>(), cols, rows, cols, row0, row0, n_tokens,
                                          keys.data());
    }
    repcap::cpu::radix_sort_pairs<Key>(keys.data(), pairs.data(), tmp_keys.data(), tmp_pairs.data(),
                                       static_cast<int64_t>(keys.size()));
  }
};

at::Tensor subspace_pga_ranks_cpu(const at::Tensor& x_in) {
  check_x(x_in, "subspace_pga_ranks");
  at::Tensor x = x_in.detach().contiguous().clone();
  const int64_t n_tokens = x.size(0);
  const int64_t n = n_tokens * (n_tokens - 1) / 2;
  at::Tensor ranks = at::empty({n}, x.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "subspace_pga_ranks", [&] {
    TORCH_CHECK(normalize_rows<scalar_t>(x), "subspace_pga_ranks: x has a zero row");
    PairBuffers<scalar_t> buffers(n_tokens, 1, x.options());
    for (int64_t t = 0; t < n; ++t) buffers.pairs[t] = static_cast<uint32_t>(t);
    buffers.sort_distances(x);
    repcap::cpu::scatter_average_ranks(buffers.keys.data(), buffers.pairs.data(), n,
                                       ranks.data_ptr<double>());
  });
  return ranks;
}

// Subspaces are shared among OpenMP threads; each thread runs one subspace at a time: the
// projection x·B_b and its Gram tiles with single-threaded BLAS, the keys, the radix sort and
// the rank correlation. Memory: 2·(key + 4 B)·N(N−1)/2 and a 256×N tile per thread.
at::Tensor subspace_pga_rhos_cpu(const at::Tensor& x_in, const at::Tensor& bases_in,
                                 const at::Tensor& ref_ranks_in) {
  check_x(x_in, "subspace_pga_rhos");
  const at::Tensor x = x_in.detach().contiguous();
  const at::Tensor bases = bases_in.detach().contiguous();
  const at::Tensor ref_ranks = ref_ranks_in.detach().contiguous();
  const int64_t n_tokens = x.size(0), d = x.size(1);
  const int64_t n = n_tokens * (n_tokens - 1) / 2;
  TORCH_CHECK(bases.dim() == 3 && bases.size(1) == d && bases.size(2) >= 1,
              "subspace_pga_rhos: bases must be B×d×k with d=", d);
  TORCH_CHECK(bases.scalar_type() == x.scalar_type(), "subspace_pga_rhos: bases and x dtypes differ");
  TORCH_CHECK(ref_ranks.dim() == 1 && ref_ranks.size(0) == n && ref_ranks.scalar_type() == at::kDouble,
              "subspace_pga_rhos: ref_ranks must be float64 of length N(N−1)/2 = ", n);
  TORCH_CHECK(bases.device().is_cpu() && ref_ranks.device().is_cpu(), "subspace_pga_rhos: CPU tensors");
  TORCH_CHECK(n_tokens <= kMaxTokensRhos, "subspace_pga_rhos: at most ", kMaxTokensRhos,
              " tokens (twice the ranks are carried as 32-bit integers), got ", n_tokens);
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
          std::copy(twice_ref.begin(), twice_ref.end(), buf.pairs.begin());
          buf.sort_distances(buf.proj);
          const repcap::RankCorrelationPartial partial =
              repcap::cpu::correlate_ranks(buf.keys.data(), buf.pairs.data(), n);
          out[b] = repcap::rank_correlation(partial, ref_sum_sq);
        });
    TORCH_CHECK(error.empty(), "subspace_pga_rhos (cpu): ", error);
  });
  return rhos;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(repcap_fast, m) {
  m.def("subspace_pga_ranks(Tensor x) -> Tensor");
  m.def("subspace_pga_rhos(Tensor x, Tensor bases, Tensor ref_ranks) -> Tensor");
}

TORCH_LIBRARY_IMPL(repcap_fast, CPU, m) {
  m.impl("subspace_pga_ranks", &subspace_pga_ranks_cpu);
  m.impl("subspace_pga_rhos", &subspace_pga_rhos_cpu);
}
