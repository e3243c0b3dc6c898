// repcap_fast._C: the pybind11 module (build information, the kernels' limits and the test hooks
// of the shared host/device headers) and the schema of every op, registered with the PyTorch
// dispatcher in this one place. Each op's CPU and CUDA launchers live in csrc/<op>_ops.cpp
// (TORCH_LIBRARY_IMPL); its kernels in csrc/cpu and csrc/cuda; its fake (meta) kernel in
// repcap_fast/_ops.py. These are the kernel layer: the public ops that users call,
// torch.ops.repcap_fast.gram_offdiag_penalty and its forms, are Python custom ops over them
// (repcap_fast/ops/gram_offdiag_penalty.py).
#include <torch/extension.h>
#include <torch/version.h>

#include <string>
#include <tuple>
#include <vector>

#include "gram_offdiag_penalty_epilogue.h"
#include "grassmann_normals.h"
#include "kernel_settings.h"
#include "operand_rounding.h"
#include "pairwise_cosine_stats_epilogue.h"
#include "subspace_pga_epilogue.h"
#include "cpu/subspace_pga_cpu.h"

// Op contracts (inputs are validated by the public functions; the launchers check them again):
//
// pairwise_cosine_stats(a m×d, a_inv_norm float32[m], b n×d?, b_inv_norm float32[n]?, bins,
//     lo, hi, precision) -> (moments float64[4] = Σc, Σc², min c, max c;
//                            counts int64[3] = pairs, below lo, above hi; hist int64[bins])
//   over c_ij = clamp(a_i·b_j·inv_a_i·inv_b_j, −1, 1), pairs i<j of a (b absent) or all i, j.
//
// gram_offdiag_penalty_rows(q m×d, x k×d, row_offset, p, with_grad, precision) -> (row_max [m]
//     x.dtype, row_sum float64[m], grad_dir [m, d] or [0])
//   for the rows q_r = x_{row_offset + r} against all rows of x, g = q xᵀ never materialized:
//   row_max_r = max_{j≠i} |g_rj|, row_sum_r = Σ_{j≠i} (|g_rj|/row_max_r)^p,
//   grad_dir_r = Σ_{j≠i} sign(g_rj)(|g_rj|/row_max_r)^(p−1) x_j, with i = row_offset + r.
//   The square penalty of x is q = x, row_offset = 0. precision (float32 x): the operands of both
//   GEMMs (x, and the weights sign(g)(|g|/row_max)^(p−1)) rounded to TF32 or bfloat16, or not.
//
// subspace_pga_ranks(x N×d) -> float64[N(N−1)/2]: average ranks of the cosine distances of x's
//   rows, pairs in SciPy's condensed order.
// subspace_pga_rhos(x N×d, bases B×d×k, ref_ranks float64[N(N−1)/2]) -> float64[B]: Spearman's
//   ρ of ref_ranks against the ranks of the distances of x·bases[b] (NaN: a zero projected row
//   or all distances equal).
//
// grassmann_normals(out float64 B×d×k, seed, first_basis) -> (): fills out[b] with the d·k
//   standard normals of basis first_basis + b (csrc/grassmann_normals.h: Philox4x32-10 keyed by
//   the seed, counted by (element / 4, basis)).
TORCH_LIBRARY(repcap_fast, m) {
  m.def(
      "pairwise_cosine_stats(Tensor a, Tensor a_inv_norm, Tensor? b, Tensor? b_inv_norm, "
      "int bins, float lo, float hi, int precision) -> (Tensor, Tensor, Tensor)");
  m.def(
      "gram_offdiag_penalty_rows(Tensor q, Tensor x, int row_offset, int p, bool with_grad, int precision) "
      "-> (Tensor, Tensor, Tensor)");
  m.def("subspace_pga_ranks(Tensor x) -> Tensor");
  m.def("subspace_pga_rhos(Tensor x, Tensor bases, Tensor ref_ranks) -> Tensor");
  m.def("grassmann_normals(Tensor(a!) out, int seed, int first_basis) -> ()");
}

namespace {

py::dict build_info() {
  py::dict info;
#ifdef REPCAP_WITH_CUDA
  info["cuda"] = true;
#else
  info["cuda"] = false;
#endif
#ifdef _OPENMP
  info["openmp"] = true;
#else
  info["openmp"] = false;
#endif
#ifdef REPCAP_CUDA_ARCH_LIST
  info["cuda_arch_list"] = REPCAP_CUDA_ARCH_LIST;
#else
  info["cuda_arch_list"] = "";
#endif
  info["torch_version"] = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                          std::to_string(TORCH_VERSION_PATCH);
  py::dict limits;
  limits["histogram_bins"] = repcap::limits::kMaxHistogramBins;
  limits["pga_tokens"] = repcap::limits::kMaxPgaTokens;
  limits["penalty_p"] = repcap::limits::kMaxPenaltyP;
  info["limits"] = limits;
  py::dict precisions;  // the `precision` argument's codes
  precisions["highest"] = static_cast<int32_t>(repcap::Precision::kHighest);
  precisions["tf32"] = static_cast<int32_t>(repcap::Precision::kTF32);
  precisions["bf16"] = static_cast<int32_t>(repcap::Precision::kBF16);
  info["precisions"] = precisions;
  return info;
}

// For the test hooks of the CPU kernel's bucketed sort: the keys as packed items with their
// payloads, written in rows of 1..max_row items (so the pieces split anywhere).
template <typename Payload>
repcap::cpu::PackedPairs packed_pairs(const std::vector<uint32_t>& keys, Payload payload) {
  const int64_t n = static_cast<int64_t>(keys.size()), max_row = 3000;
  repcap::cpu::PackedPairs packed(n, max_row);
  std::vector<uint64_t> items(keys.size());
  for (size_t t = 0; t < keys.size(); ++t) {
    items[t] = (static_cast<uint64_t>(keys[t]) << 32) | payload(static_cast<int64_t>(t));
  }
  for (int64_t start = 0, row = 1; start < n; start += row, row = row % max_row + 1) {
    packed.write_items(items.data() + start, std::min(row, n - start));
  }
  return packed;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "repcap_fast compiled kernels (ops are registered as torch.ops.repcap_fast.*)";
  m.def("build_info", &build_info, "What this build of repcap_fast._C contains, and the kernels' limits.");

  // Test hooks: the shared host/device functions, called from the CPU build (the CUDA kernels
  // run exactly these).
  m.def("_upper_tile_coords", [](int64_t t, int64_t nb) {
    int64_t bi = 0, bj = 0;
    repcap::upper_tile_coords(t, nb, &bi, &bj);
    return std::make_tuple(bi, bj);
  });
  m.def("_histogram_bin", [](float c, float lo, float hi, int32_t bins) {
    return repcap::histogram_bin(c, repcap::make_histogram_spec(lo, hi, bins));
  });
  m.def("_cosine_from_dot", &repcap::cosine_from_dot);
  // (term, weight) = (r^p, sign(g)·r^(p-1)), r = min(|g|·inv_max, 1), in float32 and float64.
  m.def("_penalty_term_f32", [](float g, float inv_max, int32_t p) {
    const auto t = repcap::penalty_term(g, inv_max, p);
    return std::make_tuple(t.term, t.weight);
  });
  m.def("_penalty_term_f64", [](double g, double inv_max, int32_t p) {
    const auto t = repcap::penalty_term(g, inv_max, p);
    return std::make_tuple(t.term, t.weight);
  });
  m.def("_penalty_rescale_f64", [](double m_old, double m_new, int32_t p) {
    const auto r = repcap::penalty_rescale(m_old, m_new, p);
    return std::make_tuple(r.inv_max, r.alpha, r.beta);
  });
  // The operand rounding of the reduced precisions (the CPU emulation and the CUDA epilogue).
  m.def("_round_to_tf32", &repcap::round_to_tf32);
  m.def("_round_to_bf16", &repcap::round_to_bf16);
  // Grassmann draws: the Philox4x32-10 words of one counter and key, and one group's normals.
  m.def("_philox4x32_10", [](uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
    const auto r = repcap::philox::philox4x32_10(c0, c1, c2, c3, k0, k1);
    return std::make_tuple(r.w[0], r.w[1], r.w[2], r.w[3]);
  });
  m.def("_normal_group", [](uint64_t seed, uint64_t basis, uint64_t group) {
    double n[4];
    repcap::philox::normal_group(seed, basis, group, n);
    return std::make_tuple(n[0], n[1], n[2], n[3]);
  });
  // Subspace PGA: the key map, the run search and the per-position rank pass of the CUDA kernel.
  m.def("_sortable_key_f32", [](float v) { return repcap::sortable_key(v); });
  m.def("_sortable_key_f64", [](double v) { return repcap::sortable_key(v); });
  m.def("_run_bounds", [](const std::vector<uint64_t>& sorted, int64_t t) {
    TORCH_CHECK(t >= 0 && t < static_cast<int64_t>(sorted.size()), "_run_bounds: t out of range");
    return std::make_tuple(repcap::run_start(sorted.data(), t),
                           repcap::run_end(sorted.data(), static_cast<int64_t>(sorted.size()), t));
  });
  // The CPU kernel's bucketed sort of packed items, on given 32-bit keys: the average ranks of the
  // keys (payload = index), and the correlation sums against twice_ref (payload = twice_ref).
  m.def("_bucketed_sort_ranks", [](const std::vector<uint32_t>& keys) {
    repcap::cpu::PackedPairs packed = packed_pairs(keys, [](int64_t t) { return static_cast<uint32_t>(t); });
    std::vector<double> ranks(keys.size(), -1.0);
    packed.scatter_ranks(ranks.data());
    return ranks;
  });
  // vectorized: the AVX-512 pass over each sorted bucket where the CPU has it (_avx512_rank_pass).
  m.def(
      "_bucketed_sort_correlation",
      [](const std::vector<uint32_t>& keys, const std::vector<uint32_t>& twice_ref, bool vectorized) {
        TORCH_CHECK(keys.size() == twice_ref.size(), "_bucketed_sort_correlation: sizes differ");
        repcap::cpu::PackedPairs packed = packed_pairs(keys, [&](int64_t t) { return twice_ref[t]; });
        const repcap::RankCorrelationPartial p = packed.correlate(vectorized);
        return std::make_tuple(p.cross, p.sum_sq);
      },
      pybind11::arg("keys"), pybind11::arg("twice_ref"), pybind11::arg("vectorized") = true);
  m.def("_avx512_rank_pass", &repcap::cpu::avx512_rank_pass_available);
  m.def("_rank_correlation_sorted",
        [](const std::vector<uint64_t>& sorted, const std::vector<uint32_t>& twice_ref, double ref_sum_sq) {
          const int64_t n = static_cast<int64_t>(sorted.size());
          TORCH_CHECK(twice_ref.size() == sorted.size(), "_rank_correlation_sorted: sizes differ");
          repcap::RankCorrelationPartial partial{0.0, 0.0};
          const double mean = 0.5 * static_cast<double>(n + 1);
          for (int64_t t = 0; t < n; ++t) {
            repcap::add_rank_pair(&partial, repcap::average_rank_at(sorted.data(), n, t), twice_ref[t], mean);
          }
          return std::make_tuple(partial.cross, partial.sum_sq, repcap::rank_correlation(partial, ref_sum_sq));
        });
}
