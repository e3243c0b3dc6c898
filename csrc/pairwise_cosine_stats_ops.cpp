// Launchers of pairwise_cosine_stats (CPU and CUDA), registered for the op whose schema is in
// csrc/module.cpp. The kernels are plain C++ (csrc/cpu) and CUDA (csrc/cuda), sharing the tile
// epilogue csrc/pairwise_cosine_stats_epilogue.h.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/pairwise_cosine_stats_cpu.h"
#include "cpu/parallel_blocks.h"
#include "kernel_settings.h"
#include "pairwise_cosine_stats_epilogue.h"

#ifdef REPCAP_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "cuda/operand_rounding_cuda.h"
#include "cuda/pairwise_cosine_stats_cuda.h"
#endif

namespace {

using StatsTuple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// Output layout shared by every backend:
//   moments float64[4] = (Σc, Σc², min, max); counts int64[3] = (pairs, below, above);
//   hist int64[bins] (left for the caller to fill).
StatsTuple make_outputs(const repcap::CosinePartial& total, int64_t pairs, int64_t below,
                        int64_t above, int64_t bins) {
  at::Tensor moments = at::empty({4}, at::TensorOptions().dtype(at::kDouble));
  at::Tensor counts = at::empty({3}, at::TensorOptions().dtype(at::kLong));
  double* mom = moments.data_ptr<double>();
  mom[0] = total.sum;
  mom[1] = total.sum_sq;
  mom[2] = total.min;
  mom[3] = total.max;
  int64_t* cnt = counts.data_ptr<int64_t>();
  cnt[0] = pairs;
  cnt[1] = below;
  cnt[2] = above;
  return {moments, counts, at::empty({bins}, at::TensorOptions().dtype(at::kLong))};
}

void check_inputs(const at::Tensor& a, const at::Tensor& a_inv_norm,
                  const c10::optional<at::Tensor>& b, const c10::optional<at::Tensor>& b_inv_norm,
                  int64_t bins, double lo, double hi, int64_t precision) {
  TORCH_CHECK(a.dim() == 2, "pairwise_cosine_stats: a must be 2-D, got ", a.dim(), "-D");
  TORCH_CHECK(a.size(0) >= 1 && a.size(1) >= 1, "pairwise_cosine_stats: a must be non-empty");
  TORCH_CHECK(a_inv_norm.dim() == 1 && a_inv_norm.size(0) == a.size(0) &&
                  a_inv_norm.scalar_type() == at::kFloat,
              "pairwise_cosine_stats: a_inv_norm must be float32 of shape (", a.size(0), ",)");
  TORCH_CHECK(b.has_value() == b_inv_norm.has_value(),
              "pairwise_cosine_stats: b and b_inv_norm go together");
  if (b.has_value()) {
    TORCH_CHECK(b->dim() == 2 && b->size(1) == a.size(1),
                "pairwise_cosine_stats: b must be 2-D with d=", a.size(1));
    TORCH_CHECK(b->size(0) >= 1, "pairwise_cosine_stats: b must be non-empty");
    TORCH_CHECK(b->scalar_type() == a.scalar_type(), "pairwise_cosine_stats: a and b dtypes differ");
    TORCH_CHECK(b->device() == a.device(), "pairwise_cosine_stats: a and b devices differ");
    TORCH_CHECK(b_inv_norm->dim() == 1 && b_inv_norm->size(0) == b->size(0) &&
                    b_inv_norm->scalar_type() == at::kFloat,
                "pairwise_cosine_stats: b_inv_norm must be float32 of shape (", b->size(0), ",)");
    TORCH_CHECK(b_inv_norm->device() == a.device(), "pairwise_cosine_stats: b_inv_norm is not on a's device");
  }
  TORCH_CHECK(a_inv_norm.device() == a.device(), "pairwise_cosine_stats: a_inv_norm is not on a's device");
  TORCH_CHECK(bins >= 1 && bins <= repcap::limits::kMaxHistogramBins, "pairwise_cosine_stats: bins must be in [1, ",
              repcap::limits::kMaxHistogramBins, "], got ", bins);
  TORCH_CHECK(lo < hi, "pairwise_cosine_stats: histogram range needs lo < hi");
  TORCH_CHECK(precision >= 0 && precision < repcap::kPrecisionCount, "pairwise_cosine_stats: unknown precision code ",
              precision);
  TORCH_CHECK(precision != static_cast<int64_t>(repcap::Precision::kBF16),
              "pairwise_cosine_stats: precision bf16 is gram_offdiag_penalty's (the packing steps); this op takes "
              "highest or tf32");
}

int64_t pair_count(int64_t m, int64_t n, bool self_pairs) {
  return self_pairs ? m * (m - 1) / 2 : m * n;
}

// CPU: row blocks of the upper triangle (or of the full grid) are shared among OpenMP threads in
// one parallel region; each thread runs a single-threaded BLAS GEMM per 256 x 512 tile into its
// own L2-sized buffer, then the fused epilogue. Per-row float64 partials are merged in row order
// afterwards, so the result does not depend on the thread count or the schedule.
StatsTuple pairwise_cosine_stats_cpu(const at::Tensor& a, const at::Tensor& a_inv_norm,
                                     const c10::optional<at::Tensor>& b,
                                     const c10::optional<at::Tensor>& b_inv_norm, int64_t bins,
                                     double lo, double hi, int64_t precision) {
  check_inputs(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision);
  // The CPU forms float32 dot products with float32 FMA whatever the precision (no TF32 there).
  const bool self_pairs = !b.has_value();
  // Values only (this op has no autograd formula; out= GEMMs refuse inputs that require grad).
  const at::Tensor a32 = a.detach().to(at::kFloat).contiguous();
  const at::Tensor b32 = self_pairs ? a32 : b->detach().to(at::kFloat).contiguous();
  const at::Tensor a_inv = a_inv_norm.contiguous();
  const at::Tensor b_inv = self_pairs ? a_inv : b_inv_norm->contiguous();
  const int64_t m = a32.size(0), n = b32.size(0);
  const float* a_inv_ptr = a_inv.data_ptr<float>();
  const float* b_inv_ptr = b_inv.data_ptr<float>();

  constexpr int64_t kTileRows = 256;
  constexpr int64_t kTileCols = 512;
  const auto spec = repcap::make_histogram_spec(static_cast<float>(lo), static_cast<float>(hi),
                                                static_cast<int32_t>(bins));
  const int64_t row_blocks = (m + kTileRows - 1) / kTileRows;
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), row_blocks)));
  std::vector<repcap::CosinePartial> row_partials(static_cast<size_t>(m), repcap::empty_partial());
  std::vector<repcap::cpu::ThreadCounts> counts(static_cast<size_t>(threads),
                                                repcap::cpu::ThreadCounts(spec, kTileCols));
  // Inside the parallel region BLAS runs single-threaded on each thread.
  const std::string error = repcap::cpu::for_each_block(
      threads, row_blocks,
      [&](int) { return at::empty({kTileRows * kTileCols}, a32.options()); },
      [&](int t, int64_t rb, at::Tensor& tile) {
        const int64_t row0 = rb * kTileRows;
        const int64_t rows = std::min(kTileRows, m - row0);
        const at::Tensor a_block = a32.narrow(0, row0, rows);
        for (int64_t col0 = self_pairs ? row0 : 0; col0 < n; col0 += kTileCols) {
          const int64_t cols = std::min(kTileCols, n - col0);
          at::Tensor dots = tile.narrow(0, 0, rows * cols).view({rows, cols});
          at::mm_out(dots, a_block, b32.narrow(0, col0, cols).t());
          repcap::cpu::reduce_tile(dots.data_ptr<float>(), cols, rows, cols, row0, col0,
                                   self_pairs, a_inv_ptr, b_inv_ptr, spec, &counts[t],
                                   row_partials.data() + row0);
        }
      });
  TORCH_CHECK(error.empty(), "pairwise_cosine_stats (cpu): ", error);

  repcap::CosinePartial total = repcap::empty_partial();
  for (const repcap::CosinePartial& p : row_partials) repcap::merge_partial(&total, p);
  int64_t pairs = 0;
  std::vector<int64_t> slots(static_cast<size_t>(bins) + 2, 0);
  for (const auto& c : counts) {
    pairs += c.pairs;
    for (size_t k = 0; k < slots.size(); ++k) slots[k] += c.slots[k];
  }
  TORCH_CHECK(pairs == pair_count(m, n, self_pairs),
              "pairwise_cosine_stats: internal error, visited ", pairs, " pairs");
  auto outputs = make_outputs(total, pairs, slots[static_cast<size_t>(bins)],
                              slots[static_cast<size_t>(bins) + 1], bins);
  std::copy(slots.begin(), slots.begin() + bins, std::get<2>(outputs).data_ptr<int64_t>());
  return outputs;
}

#ifdef REPCAP_WITH_CUDA
// The per-block partials of a CUDA variant, on the device, poisoned (NaN, huge counts) so that a
// slot a kernel fails to write shows up; block k writes only slot k.
struct BlockPartials {
  at::Tensor sum, sum_sq, min, max, outside;  // [nb] float64, float64, float32, float32; [nb, 2] int64

  static BlockPartials poisoned(int64_t nb, const at::TensorOptions& dev) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    return {at::full({nb}, nan, dev.dtype(at::kDouble)), at::full({nb}, nan, dev.dtype(at::kDouble)),
            at::full({nb}, nan, dev.dtype(at::kFloat)), at::full({nb}, nan, dev.dtype(at::kFloat)),
            at::full({nb, 2}, int64_t{1} << 60, dev.dtype(at::kLong))};
  }

  // The op's outputs: the partials merged in block order on the host (float64, fixed order:
  // bitwise repeatable), the counts summed (integers), and `hist` (int64 [bins] on the device);
  // a slot left NaN, or a histogram that misses a pair, is an internal error naming `who`.
  StatsTuple finish(int64_t pairs, const at::Tensor& hist, int64_t bins, const char* who) const {
    const at::Tensor sums = sum.cpu(), sums_sq = sum_sq.cpu(), mins = min.cpu(), maxs = max.cpu();
    repcap::CosinePartial total = repcap::empty_partial();
    for (int64_t k = 0; k < sums.numel(); ++k) {
      repcap::CosinePartial p;
      p.sum = sums.data_ptr<double>()[k];
      p.sum_sq = sums_sq.data_ptr<double>()[k];
      p.min = mins.data_ptr<float>()[k];
      p.max = maxs.data_ptr<float>()[k];
      TORCH_CHECK(!std::isnan(p.sum) && !std::isnan(p.sum_sq) && !std::isnan(p.min) && !std::isnan(p.max), who,
                  ": internal error, block ", k, " did not write its partials");
      repcap::merge_partial(&total, p);
    }
    const at::Tensor counts = outside.sum(0).cpu();
    const int64_t below = counts.data_ptr<int64_t>()[0], above = counts.data_ptr<int64_t>()[1];
    StatsTuple outputs = make_outputs(total, pairs, below, above, bins);
    at::Tensor& out_hist = std::get<2>(outputs);
    out_hist.copy_(hist);
    TORCH_CHECK(out_hist.sum().item<int64_t>() + below + above == pairs, who,
                ": internal error, the histogram does not count every pair");
    return outputs;
  }
};

// The CUDA kernel variant, by name: REPCAP_CUDA_STATS_KERNEL = "tiles" (the fused persistent
// kernel), "panels" (cuBLAS panels and a reduction kernel, pairwise_cosine_stats_cuda_panels) or
// "auto" ("tiles" here; the Python launcher replaces "auto" by the measured table's choice,
// repcap_fast/_kernel_choices.py, for each call).
bool use_cuda_panels() {
  const char* env = std::getenv("REPCAP_CUDA_STATS_KERNEL");
  const std::string name = env == nullptr ? "auto" : env;
  TORCH_CHECK(name == "auto" || name == "tiles" || name == "panels",
              "REPCAP_CUDA_STATS_KERNEL must be auto, tiles or panels, got '", name, "'");
  return name == "panels";
}

// The "panels" variant: the pairs in panels of at most kPanel x kPanel dot products (the upper
// triangle of panels for self pairs, the diagonal panels whole), each formed by one cuBLAS GEMM
// into a float32 scratch buffer (at most kPanel² · 4 B = 256 MB; float32 GEMMs follow torch's
// cuBLAS float32 precision, which the Python launcher sets from `precision`; at kTF32 the float32
// rows are first copied rounded to TF32 to nearest, as the tiles kernel rounds them (cvt.rna), so
// the TF32 GEMMs use them exactly whether cuBLAS's kernels round or truncate float32 operands;
// 16-bit inputs give float32 dot products of exact products, at::mm's out_dtype), then reduced by
// one kernel launch (csrc/cuda/pairwise_cosine_stats_panels_cuda.cu) into per-block partials
// merged here in block order. Cost: the GEMMs (half the full V×d×V, plus the diagonal panels'
// lower halves) and about 8 B of memory traffic per pair (the panel written, then read); at kTF32
// also one rounded copy of the rows. Two scratch panels: the reduction of panel t runs on a side
// stream while the caller's stream forms panel t + 1 (the GEMMs are compute-bound, the reduction
// memory- and atomic-bound); panel t + 2 waits for the reduction of panel t, whose buffer it
// reuses. The reductions stay in panel order on one stream, so the partials are the same bits.
// REPCAP_CUDA_PANELS_OVERLAP=0 runs both on the caller's stream with one buffer (the A/B of
// bench/panels_breakdown.py).
constexpr int64_t kPanel = 8192;

// A CUDA event without timing, on the current device (the caller's guard), destroyed with it.
struct StreamEvent {
  cudaEvent_t event = nullptr;
  StreamEvent() {
    TORCH_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess,
                "pairwise_cosine_stats (cuda, panels): cannot create a CUDA event");
  }
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  ~StreamEvent() { cudaEventDestroy(event); }
  // record on `from`; `to` waits for it (what `from` has enqueued so far)
  void order(cudaStream_t from, cudaStream_t to) {
    TORCH_CHECK(cudaEventRecord(event, from) == cudaSuccess && cudaStreamWaitEvent(to, event, 0) == cudaSuccess,
                "pairwise_cosine_stats (cuda, panels): cannot order the streams");
  }
};

bool panels_overlap() {
  const char* env = std::getenv("REPCAP_CUDA_PANELS_OVERLAP");
  const std::string value = env == nullptr ? "" : env;
  TORCH_CHECK(value.empty() || value == "0" || value == "1",
              "REPCAP_CUDA_PANELS_OVERLAP must be 0 or 1, got '", value, "'");
  return value != "0";
}

// A copy of the float32 rows x rounded to TF32 to nearest (csrc/operand_rounding.h), on x's stream.
at::Tensor tf32_rounded(const at::Tensor& x) {
  at::Tensor out = x.clone();
  const char* err = repcap::cuda::round_operands_cuda(out.data_ptr<float>(), out.numel(), repcap::Precision::kTF32,
                                                      c10::cuda::getCurrentCUDAStream(out.get_device()).stream());
  TORCH_CHECK(err == nullptr, "pairwise_cosine_stats (cuda, panels): ", err ? err : "");
  return out;
}

StatsTuple pairwise_cosine_stats_cuda_panels(const at::Tensor& a_rows_in, const at::Tensor& a_inv,
                                             const at::Tensor& b_rows_in, const at::Tensor& b_inv, bool self_pairs,
                                             int64_t bins, double lo, double hi, repcap::Precision precision) {
  const bool round_tf32 = a_rows_in.scalar_type() == at::kFloat && precision == repcap::Precision::kTF32;
  const at::Tensor ac = round_tf32 ? tf32_rounded(a_rows_in) : a_rows_in;
  const at::Tensor bc = self_pairs ? ac : round_tf32 ? tf32_rounded(b_rows_in) : b_rows_in;
  const int64_t m = ac.size(0), n = bc.size(0);
  const int64_t panel_rows = std::min(m, kPanel), panel_cols = std::min(n, kPanel);
  const bool overlap = panels_overlap() && (m > panel_rows || n > panel_cols);  // more than one panel
  const at::Tensor scratch_first = at::empty({panel_rows * panel_cols}, ac.options().dtype(at::kFloat));
  const at::Tensor scratch[2] = {scratch_first, overlap ? at::empty_like(scratch_first) : scratch_first};
  const c10::cuda::CUDAStream main_stream = c10::cuda::getCurrentCUDAStream(ac.get_device());
  const c10::cuda::CUDAStream side_stream =
      overlap ? c10::cuda::getStreamFromPool(false, ac.get_device()) : main_stream;
  StreamEvent gemm_done[2], reduce_done[2];  // per buffer: its GEMM formed it; its reduction read it
  int sm_count = 0;
  TORCH_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, ac.get_device()) == cudaSuccess,
              "pairwise_cosine_stats (cuda): cannot read the SM count");
  const int nb = repcap::cuda::cosine_panel_num_blocks(sm_count);
  const BlockPartials partials = BlockPartials::poisoned(nb, ac.options());
  at::Tensor hist = at::zeros({bins}, ac.options().dtype(at::kLong));
  repcap::cuda::CosinePanelArgs args{};
  args.self_pairs = self_pairs;
  args.hist = repcap::make_histogram_spec(static_cast<float>(lo), static_cast<float>(hi), static_cast<int32_t>(bins));
  args.num_blocks = nb;
  args.block_sum = partials.sum.data_ptr<double>();
  args.block_sum_sq = partials.sum_sq.data_ptr<double>();
  args.block_min = partials.min.data_ptr<float>();
  args.block_max = partials.max.data_ptr<float>();
  args.block_outside = partials.outside.data_ptr<int64_t>();
  args.hist_out = hist.data_ptr<int64_t>();
  args.stream = side_stream.stream();
  bool first = true;
  int64_t t = 0;  // panel index: its buffer is t % 2
  for (int64_t row0 = 0; row0 < m; row0 += panel_rows) {
    const int64_t rows = std::min(panel_rows, m - row0);
    const at::Tensor a_rows = ac.narrow(0, row0, rows);
    // Self pairs: the panels from the diagonal one on (a diagonal panel whose rows are all past
    // the last column keeps no pair, but the triangle's panels always start at col0 = row0).
    for (int64_t col0 = self_pairs ? row0 : 0; col0 < n; col0 += panel_cols) {
      const int64_t cols = std::min(panel_cols, n - col0);
      const int buffer = overlap ? static_cast<int>(t % 2) : 0;
      if (overlap && t >= 2) {  // panel t − 2 is reduced: its buffer is free (recorded below)
        TORCH_CHECK(cudaStreamWaitEvent(main_stream.stream(), reduce_done[buffer].event, 0) == cudaSuccess,
                    "pairwise_cosine_stats (cuda, panels): cannot order the streams");
      }
      at::Tensor dots = scratch[buffer].narrow(0, 0, rows * cols).view({rows, cols});
      const at::Tensor b_cols = bc.narrow(0, col0, cols);
      if (ac.scalar_type() == at::kFloat) {
        at::mm_out(dots, a_rows, b_cols.t());
      } else {
        at::mm_out(dots, a_rows, b_cols.t(), at::kFloat);  // 16-bit operands, float32 dot products
      }
      args.dots = dots.data_ptr<float>();
      args.ld = cols;
      args.rows = rows;
      args.cols = cols;
      args.row0 = row0;
      args.col0 = col0;
      args.a_inv_norm = a_inv.data_ptr<float>() + row0;
      args.b_inv_norm = b_inv.data_ptr<float>() + col0;
      args.first = first;
      if (overlap) gemm_done[buffer].order(main_stream.stream(), side_stream.stream());  // the GEMM first
      const char* err = repcap::cuda::pairwise_cosine_stats_panel_cuda(args);
      TORCH_CHECK(err == nullptr, "pairwise_cosine_stats (cuda, panels): ", err ? err : "");
      if (overlap) {
        TORCH_CHECK(cudaEventRecord(reduce_done[buffer].event, side_stream.stream()) == cudaSuccess,
                    "pairwise_cosine_stats (cuda, panels): cannot record an event");
      }
      first = false;
      ++t;
    }
  }
  if (overlap) {  // the caller's stream (and what it frees) waits for the last reduction
    StreamEvent reductions_done;
    reductions_done.order(side_stream.stream(), main_stream.stream());
  }
  return partials.finish(pair_count(m, n, self_pairs), hist, bins, "pairwise_cosine_stats (cuda, panels)");
}

// CUDA: persistent blocks write per-block partials; they are merged here in block order.
StatsTuple pairwise_cosine_stats_cuda(const at::Tensor& a, const at::Tensor& a_inv_norm,
                                      const c10::optional<at::Tensor>& b,
                                      const c10::optional<at::Tensor>& b_inv_norm, int64_t bins,
                                      double lo, double hi, int64_t precision) {
  check_inputs(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision);
  const c10::cuda::CUDAGuard guard(a.device());
  const bool self_pairs = !b.has_value();
  using repcap::cuda::InputType;
  InputType type;
  switch (a.scalar_type()) {
    case at::kFloat:
      type = InputType::kFloat32;
      break;
    case at::kBFloat16:
      type = InputType::kBFloat16;
      break;
    case at::kHalf:
      type = InputType::kFloat16;
      break;
    default:
      TORCH_CHECK(false, "pairwise_cosine_stats (cuda): a must be float32, bfloat16 or float16");
  }
  const at::Tensor ac = a.contiguous();
  const at::Tensor bc = self_pairs ? ac : b->contiguous();
  const at::Tensor a_inv = a_inv_norm.contiguous();
  const at::Tensor b_inv = self_pairs ? a_inv : b_inv_norm->contiguous();
  if (use_cuda_panels()) {  // values only: out= GEMMs refuse inputs that require grad
    return pairwise_cosine_stats_cuda_panels(ac.detach(), a_inv, bc.detach(), b_inv, self_pairs, bins, lo, hi,
                                             static_cast<repcap::Precision>(precision));
  }

  repcap::cuda::PairwiseCosineStatsArgs args{};
  args.a = ac.data_ptr();
  args.a_inv_norm = a_inv.data_ptr<float>();
  args.m = ac.size(0);
  args.b = bc.data_ptr();
  args.b_inv_norm = b_inv.data_ptr<float>();
  args.n = bc.size(0);
  args.d = ac.size(1);
  args.self_pairs = self_pairs;
  args.type = type;
  args.precision = static_cast<repcap::Precision>(precision);
  args.hist = repcap::make_histogram_spec(static_cast<float>(lo), static_cast<float>(hi),
                                          static_cast<int32_t>(bins));
  int sm_count = 0;
  TORCH_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, a.get_device()) ==
                  cudaSuccess,
              "pairwise_cosine_stats (cuda): cannot read the SM count");
  args.num_blocks = repcap::cuda::pairwise_cosine_stats_cuda_num_blocks(args, sm_count);
  const int64_t nb = args.num_blocks;
  const BlockPartials partials = BlockPartials::poisoned(nb, ac.options());
  // Each block's own histogram slice, poisoned too (a few small device fills per call).
  at::Tensor block_hist = at::full({nb, bins}, int64_t{1} << 60, ac.options().dtype(at::kLong));
  args.block_sum = partials.sum.data_ptr<double>();
  args.block_sum_sq = partials.sum_sq.data_ptr<double>();
  args.block_min = partials.min.data_ptr<float>();
  args.block_max = partials.max.data_ptr<float>();
  args.block_outside = partials.outside.data_ptr<int64_t>();
  args.block_hist = block_hist.data_ptr<int64_t>();
  args.stream = c10::cuda::getCurrentCUDAStream(a.get_device()).stream();
  const char* err = repcap::cuda::pairwise_cosine_stats_cuda(args);
  TORCH_CHECK(err == nullptr, "pairwise_cosine_stats (cuda): ", err ? err : "");
  return partials.finish(pair_count(args.m, args.n, self_pairs), block_hist.sum(0), bins,
                         "pairwise_cosine_stats (cuda)");
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(repcap_fast, CPU, m) {
  m.impl("pairwise_cosine_stats", &pairwise_cosine_stats_cpu);
}

#ifdef REPCAP_WITH_CUDA
TORCH_LIBRARY_IMPL(repcap_fast, CUDA, m) {
  m.impl("pairwise_cosine_stats", &pairwise_cosine_stats_cuda);
}
#endif
