// The CPU kernel of grassmann_normals: every group of 4 normals is independent (a counter-based
// generator), so blocks of groups go to the threads in any order and the result is the same.
#include "grassmann_normals_cpu.h"

#include <algorithm>

#include "parallel_blocks.h"
#include "../grassmann_normals.h"

namespace repcap {
namespace cpu {

std::string grassmann_normals(uint64_t seed, uint64_t first_basis, int64_t n_bases, int64_t per_basis, double* out,
                              int threads) {
  const int64_t groups_per_basis = (per_basis + 3) / 4;
  const int64_t groups = n_bases * groups_per_basis;
  constexpr int64_t kGroupsPerBlock = 4096;
  const int64_t blocks = (groups + kGroupsPerBlock - 1) / kGroupsPerBlock;
  return for_each_block(
      std::max<int>(1, static_cast<int>(std::min<int64_t>(threads, blocks))), blocks, [](int) { return 0; },
      [&](int, int64_t block, int&) {
        const int64_t end = std::min(groups, (block + 1) * kGroupsPerBlock);
        for (int64_t g = block * kGroupsPerBlock; g < end; ++g) {
          philox::fill_group(seed, first_basis, per_basis, groups_per_basis, g, out);
        }
      });
}

}  // namespace cpu
}  // namespace repcap
