// Launchers of gram_offdiag_penalty (CPU and CUDA), registered for the op whose schema is in
// csrc/module.cpp. The kernels are plain C++ (csrc/cpu) and CUDA (csrc/cuda), sharing the
// elementwise weight and rescaling of csrc/gram_offdiag_penalty_epilogue.h.
//
// Op contract, for the rows q (m x d) that are rows [row_offset, row_offset + m) of x (k x d,
// float32 or float64), and g = q xᵀ, never materialized (i = row_offset + r is row r's own index):
//   row_max[r] = m_r = max_{j≠i} |g_rj|                              (x.dtype, [m])
//   row_sum[r] = s_r = Σ_{j≠i} (|g_rj|/m_r)^p                         (float64, [m])
//   grad_dir[r] = Σ_{j≠i} sign(g_rj)(|g_rj|/m_r)^(p-1) x_j            (x.dtype, [m, d]; [0] when
//                                                                      with_grad is false)
// (rows with m_r = 0 give 0). The square penalty of x is q = x, row_offset = 0. The caller forms
// L = Σ_r m_r^p s_r and ∂L/∂x_i = 2p m_r^(p-1) grad_dir_r in float64. Both launchers stream the
// Gram matrix in tiles with a running row maximum (online rescaling): rows are independent, each
// visited in fixed column order.
//
// precision (csrc/kernel_settings.h; float32 x only): kTF32 and kBF16 round the operands of both
// GEMMs, x and each tile of weights, to TF32 or bfloat16 (csrc/operand_rounding.h) before float32
// GEMMs: on the CPU this is the emulation of the tensor cores (their products are exact in
// float32, so only the order of the float32 sums differs); on CUDA the GEMMs then run on TF32
// tensor cores (the Python launcher sets cuBLAS's float32 precision), which hold both formats'
// values exactly.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/gram_offdiag_penalty_cpu.h"
#include "cpu/parallel_blocks.h"
#include "kernel_settings.h"

#ifdef REPCAP_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/gram_offdiag_penalty_cuda.h"
#include "cuda/operand_rounding_cuda.h"
#endif

namespace {

using PenaltyTuple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

void check_penalty_inputs(const at::Tensor& q, const at::Tensor& x, int64_t row_offset, int64_t p,
                          int64_t precision) {
  TORCH_CHECK(x.dim() == 2, "gram_offdiag_penalty: x must be 2-D (k x d), got ", x.dim(), "-D");
  TORCH_CHECK(x.size(0) >= 1 && x.size(1) >= 1, "gram_offdiag_penalty: x must be non-empty");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "gram_offdiag_penalty: x must be float32 or float64 (the public function converts "
              "16-bit inputs), got ", x.scalar_type());
  TORCH_CHECK(p >= 1 && p <= repcap::limits::kMaxPenaltyP, "gram_offdiag_penalty: p must be in [1, ",
              repcap::limits::kMaxPenaltyP, "], got ", p);
  TORCH_CHECK(q.dim() == 2 && q.size(1) == x.size(1) && q.size(0) >= 1,
              "gram_offdiag_penalty: q must be m x d with m >= 1 and x's d = ", x.size(1));
  TORCH_CHECK(q.scalar_type() == x.scalar_type() && q.device() == x.device(),
              "gram_offdiag_penalty: q and x must share dtype and device");
  TORCH_CHECK(row_offset >= 0 && row_offset + q.size(0) <= x.size(0),
              "gram_offdiag_penalty: rows [row_offset, row_offset + m) must lie in x's ", x.size(0),
              " rows, got row_offset ", row_offset, " and m ", q.size(0));
  TORCH_CHECK(precision >= 0 && precision < repcap::kPrecisionCount, "gram_offdiag_penalty: unknown precision code ",
              precision);
}

// The precision that applies to x's dtype: float64 runs in float64 at any precision.
repcap::Precision operand_precision(const at::Tensor& x, int64_t precision) {
  return x.scalar_type() == at::kFloat ? static_cast<repcap::Precision>(precision) : repcap::Precision::kHighest;
}

PenaltyTuple make_penalty_outputs(const at::Tensor& x, bool with_grad) {
  const int64_t k = x.size(0), d = x.size(1);
  return {at::zeros({k}, x.options()), at::zeros({k}, x.options().dtype(at::kDouble)),
          with_grad ? at::zeros({k, d}, x.options()) : at::empty({0}, x.options())};
}

// CPU: blocks of 256 rows are shared among OpenMP threads in one parallel region. Per block, for
// each 512-column tile: G = X_I X_Jᵀ (single-threaded BLAS), the row epilogue (running maximum,
// s_i, weights W in place of G), then acc_I ← diag(beta)·acc_I + W X_J (BLAS), acc_I being the
// block's rows of grad_dir. Extra memory: one 256 x 512 tile per thread.
// Rows q (m x d) against all rows x (k x d); q's row r is x's row row_offset + r, whose own Gram
// entry is skipped (the square op is q = x, row_offset = 0).
template <typename T>
void gram_offdiag_penalty_cpu_impl(const at::Tensor& q, const at::Tensor& x, int64_t row_offset, int32_t p,
                                   bool with_grad, repcap::Precision rounding, PenaltyTuple& out) {
  constexpr int64_t kTileRows = 256;
  constexpr int64_t kTileCols = 512;
  const int64_t m = q.size(0);
  const int64_t k = x.size(0);
  T* row_max = std::get<0>(out).data_ptr<T>();
  double* row_sum = std::get<1>(out).data_ptr<double>();
  at::Tensor& grad_dir = std::get<2>(out);
  const int64_t row_blocks = (m + kTileRows - 1) / kTileRows;
  const int threads = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), row_blocks)));
  struct ThreadState {
    at::Tensor tile;  // one Gram tile, reused
    std::vector<T> betas;
  };
  // Inside the parallel region BLAS runs single-threaded on each thread.
  const std::string error = repcap::cpu::for_each_block(
      threads, row_blocks,
      [&](int) {
        return ThreadState{at::empty({kTileRows * kTileCols}, x.options()),
                           std::vector<T>(static_cast<size_t>(kTileRows))};
      },
      [&](int, int64_t rb, ThreadState& state) {
        const int64_t row0 = rb * kTileRows;
        const int64_t rows = std::min(kTileRows, m - row0);
        const at::Tensor x_rows = q.narrow(0, row0, rows);
        at::Tensor acc = with_grad ? grad_dir.narrow(0, row0, rows) : at::Tensor();
        std::vector<T>& betas = state.betas;
        for (int64_t col0 = 0; col0 < k; col0 += kTileCols) {
          const int64_t cols = std::min(kTileCols, k - col0);
          const at::Tensor x_cols = x.narrow(0, col0, cols);
          at::Tensor g = state.tile.narrow(0, 0, rows * cols).view({rows, cols});
          at::mm_out(g, x_rows, x_cols.t());
          T* g_ptr = g.data_ptr<T>();
          bool rescale = false;
          for (int64_t r = 0; r < rows; ++r) {
            betas[r] = repcap::cpu::penalty_row_update<T>(g_ptr + r * cols, cols, row_offset + row0 + r - col0,
                                                          p, row_max + row0 + r,
                                                          row_sum + row0 + r, with_grad);
            rescale = rescale || betas[r] != T(1);
          }
          if (!with_grad) continue;
          if constexpr (std::is_same<T, float>::value) {
            if (rounding != repcap::Precision::kHighest) repcap::cpu::round_operands(g_ptr, rows * cols, rounding);
          }
          if (rescale && col0 > 0) {  // before the first tile acc is 0
            T* acc_ptr = acc.data_ptr<T>();
            const int64_t d = acc.size(1);
            for (int64_t r = 0; r < rows; ++r) {
              if (betas[r] == T(1)) continue;
              T* a = acc_ptr + r * d;
              const T b = betas[r];
              for (int64_t c = 0; c < d; ++c) a[c] *= b;
            }
          }
          acc.addmm_(g, x_cols);
        }
      });
  TORCH_CHECK(error.empty(), "gram_offdiag_penalty (cpu): ", error);
}

// x (and q, unless it is x) as contiguous operands, copied and rounded when `rounding` asks.
std::pair<at::Tensor, at::Tensor> rounded_operands(const at::Tensor& q, const at::Tensor& x,
                                                   repcap::Precision rounding) {
  // Values only (this op has no autograd formula); q may be x itself.
  const bool same = q.is_same(x);
  if (rounding == repcap::Precision::kHighest) {
    const at::Tensor xc = x.detach().contiguous();
    return {same ? xc : q.detach().contiguous(), xc};
  }
  auto rounded = [&](const at::Tensor& t) {
    at::Tensor out = t.detach().contiguous().clone();
#ifdef REPCAP_WITH_CUDA
    if (out.is_cuda()) {
      const char* err = repcap::cuda::round_operands_cuda(
          out.data_ptr<float>(), out.numel(), rounding, c10::cuda::getCurrentCUDAStream(out.get_device()).stream());
      TORCH_CHECK(err == nullptr, "gram_offdiag_penalty (cuda): ", err ? err : "");
      return out;
    }
#endif
    repcap::cpu::round_operands(out.data_ptr<float>(), out.numel(), rounding);
    return out;
  };
  const at::Tensor xr = rounded(x);
  return {same ? xr : rounded(q), xr};
}

PenaltyTuple gram_offdiag_penalty_cpu(const at::Tensor& q, const at::Tensor& x, int64_t row_offset, int64_t p,
                                      bool with_grad, int64_t precision) {
  check_penalty_inputs(q, x, row_offset, p, precision);
  TORCH_CHECK(x.device().is_cpu(), "gram_offdiag_penalty (cpu): x must be a CPU tensor");
  const repcap::Precision rounding = operand_precision(x, precision);
  const std::pair<at::Tensor, at::Tensor> operands = rounded_operands(q, x, rounding);
  const at::Tensor& qc = operands.first;
  const at::Tensor& xc = operands.second;
  PenaltyTuple out = make_penalty_outputs(qc, with_grad);
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "gram_offdiag_penalty_cpu", [&] {
    gram_offdiag_penalty_cpu_impl<scalar_t>(qc, xc, row_offset, static_cast<int32_t>(p), with_grad, rounding, out);
  });
  return out;
}

#ifdef REPCAP_WITH_CUDA
// CUDA: the same streaming over panels of up to 8192 x 8192 Gram entries (256 MB in float32):
// G = X_I X_Jᵀ by cuBLAS (at::mm_out, on the current stream; float32 GEMMs follow torch's cuBLAS
// float32 precision, which the Python launcher sets from the op's `precision` argument: TF32 for
// kTF32 and kBF16), the row epilogue kernel (which rounds the weights at `rounding`), then
// acc_I ← diag(beta)·acc_I + W X_J by cuBLAS.
// Extra memory: one panel and a beta vector.
constexpr int64_t kCudaPanel = 8192;

template <typename T>
void gram_offdiag_penalty_cuda_impl(const at::Tensor& q, const at::Tensor& x, int64_t row_offset, int32_t p,
                                    bool with_grad, repcap::Precision rounding, PenaltyTuple& out) {
  const int64_t m = q.size(0);
  const int64_t k = x.size(0);
  const int64_t row_panel = std::min(m, kCudaPanel);  // a panel is row_panel x col_panel Gram entries
  const int64_t col_panel = std::min(k, kCudaPanel);
  at::Tensor scratch = at::empty({row_panel * col_panel}, x.options());
  at::Tensor beta = at::empty({row_panel}, x.options());
  at::Tensor& row_max = std::get<0>(out);
  at::Tensor& row_sum = std::get<1>(out);
  at::Tensor& grad_dir = std::get<2>(out);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
  for (int64_t row0 = 0; row0 < m; row0 += row_panel) {
    const int64_t rows = std::min(row_panel, m - row0);
    const at::Tensor x_rows = q.narrow(0, row0, rows);
    at::Tensor acc = with_grad ? grad_dir.narrow(0, row0, rows) : at::Tensor();
    at::Tensor beta_rows = beta.narrow(0, 0, rows);
    for (int64_t col0 = 0; col0 < k; col0 += col_panel) {
      const int64_t cols = std::min(col_panel, k - col0);
      const at::Tensor x_cols = x.narrow(0, col0, cols);
      at::Tensor g = scratch.narrow(0, 0, rows * cols).view({rows, cols});
      at::mm_out(g, x_rows, x_cols.t());
      const char* err = repcap::cuda::gram_offdiag_penalty_epilogue_cuda(
          g.data_ptr<T>(), cols, rows, cols, row_offset + row0, col0, p, row_max.data_ptr<T>() + row0,
          row_sum.data_ptr<double>() + row0, beta_rows.data_ptr<T>(), with_grad, rounding, stream);
      TORCH_CHECK(err == nullptr, "gram_offdiag_penalty (cuda): ", err ? err : "");
      if (!with_grad) continue;
      if (col0 > 0) acc.mul_(beta_rows.unsqueeze(1));  // before the first panel acc is 0
      acc.addmm_(g, x_cols);
    }
  }
}

PenaltyTuple gram_offdiag_penalty_cuda(const at::Tensor& q, const at::Tensor& x, int64_t row_offset, int64_t p,
                                       bool with_grad, int64_t precision) {
  check_penalty_inputs(q, x, row_offset, p, precision);
  TORCH_CHECK(x.is_cuda(), "gram_offdiag_penalty (cuda): x must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(x.device());
  const repcap::Precision rounding = operand_precision(x, precision);
  const std::pair<at::Tensor, at::Tensor> operands = rounded_operands(q, x, rounding);
  const at::Tensor& qc = operands.first;
  const at::Tensor& xc = operands.second;
  PenaltyTuple out = make_penalty_outputs(qc, with_grad);
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "gram_offdiag_penalty_cuda", [&] {
    gram_offdiag_penalty_cuda_impl<scalar_t>(qc, xc, row_offset, static_cast<int32_t>(p), with_grad, rounding,
                                             out);
  });
  return out;
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(repcap_fast, CPU, m) {
  m.impl("gram_offdiag_penalty_rows", &gram_offdiag_penalty_cpu);
}

#ifdef REPCAP_WITH_CUDA
TORCH_LIBRARY_IMPL(repcap_fast, CUDA, m) {
  m.impl("gram_offdiag_penalty_rows", &gram_offdiag_penalty_cuda);
}
#endif
