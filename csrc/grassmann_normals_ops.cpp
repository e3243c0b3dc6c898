// Launchers of grassmann_normals (CPU and CUDA), registered for the op whose schema is in
// csrc/module.cpp:
//   grassmann_normals(out float64 B×d×k, seed, first_basis) fills out[b] with the d·k standard
//   normals of basis first_basis + b for `seed` (entry (i, j) is normal i·k + j), as
//   csrc/grassmann_normals.h defines them: a function of (seed, basis, element) alone.
// The kernels are plain C++ (csrc/cpu/grassmann_normals_cpu.*) and CUDA
// (csrc/cuda/grassmann_normals_cuda.cu), sharing csrc/grassmann_normals.h.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <string>

#include "cpu/grassmann_normals_cpu.h"

#ifdef REPCAP_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/grassmann_normals_cuda.h"
#endif

namespace {

void check_out(const at::Tensor& out, int64_t seed, int64_t first_basis) {
  TORCH_CHECK(out.dim() == 3 && out.scalar_type() == at::kDouble && out.is_contiguous(),
              "grassmann_normals: out must be a contiguous float64 B×d×k tensor");
  TORCH_CHECK(seed >= 0, "grassmann_normals: seed must be >= 0, got ", seed);
  TORCH_CHECK(first_basis >= 0, "grassmann_normals: first_basis must be >= 0, got ", first_basis);
}

void grassmann_normals_cpu(at::Tensor out, int64_t seed, int64_t first_basis) {
  check_out(out, seed, first_basis);
  const std::string error = repcap::cpu::grassmann_normals(
      static_cast<uint64_t>(seed), static_cast<uint64_t>(first_basis), out.size(0), out.size(1) * out.size(2),
      out.data_ptr<double>(), at::get_num_threads());
  TORCH_CHECK(error.empty(), "grassmann_normals: ", error);
}

#ifdef REPCAP_WITH_CUDA
void grassmann_normals_cuda(at::Tensor out, int64_t seed, int64_t first_basis) {
  check_out(out, seed, first_basis);
  const c10::cuda::CUDAGuard guard(out.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(out.get_device()).stream();
  const char* error = repcap::cuda::grassmann_normals_cuda(
      static_cast<uint64_t>(seed), static_cast<uint64_t>(first_basis), out.size(0), out.size(1) * out.size(2),
      out.data_ptr<double>(), stream);
  TORCH_CHECK(error == nullptr, "grassmann_normals: ", error);
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(repcap_fast, CPU, m) { m.impl("grassmann_normals", &grassmann_normals_cpu); }

#ifdef REPCAP_WITH_CUDA
TORCH_LIBRARY_IMPL(repcap_fast, CUDA, m) { m.impl("grassmann_normals", &grassmann_normals_cuda); }
#endif
