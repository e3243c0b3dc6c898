// The CPU kernel of grassmann_normals (plain C++, no torch headers): the normals of
// csrc/grassmann_normals.h for a range of bases.
#pragma once
#include <cstdint>
#include <string>

namespace repcap {
namespace cpu {

// out[b·per_basis + e] = normal e of basis first_basis + b (b < n_bases, e < per_basis), on
// `threads` OpenMP threads. Returns "" or the first error.
std::string grassmann_normals(uint64_t seed, uint64_t first_basis, int64_t n_bases, int64_t per_basis, double* out,
                              int threads);

}  // namespace cpu
}  // namespace repcap
