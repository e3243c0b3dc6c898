"""The Triton kernel of grassmann_normals: the standard normals of csrc/grassmann_normals.h
(Philox4x32-10 keyed by the seed, counter (e div 4, basis), two Box–Muller pairs per counter),
one program per BLOCK groups of 4 normals. tl.philox is Triton's Philox4x32-10, the generator of
the C++ and CUDA kernels, so the words are bitwise theirs."""

import torch
import triton
import triton.language as tl

from ._utils import device_guard

_BLOCK = 256


@triton.jit
def _grassmann_normals_kernel(out_ptr, seed, first_basis, per_basis, groups_per_basis, groups,
                              BLOCK: tl.constexpr):
    g = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    live = g < groups
    b = g // groups_per_basis
    group = g - b * groups_per_basis
    basis = b + first_basis
    w0, w1, w2, w3 = tl.philox(seed, (group & 0xFFFFFFFF).to(tl.uint32), (group >> 32).to(tl.uint32),
                               (basis & 0xFFFFFFFF).to(tl.uint32), (basis >> 32).to(tl.uint32))
    # float64 constants: a bare float literal would be a float32 one (2π would lose 3e-7)
    scale = tl.full([], 2.3283064365386962890625e-10, tl.float64)  # 2^-32
    two_pi = tl.full([], 6.283185307179586476925286766559, tl.float64)
    u0 = (w0.to(tl.float64) + 0.5) * scale
    u1 = (w1.to(tl.float64) + 0.5) * scale
    u2 = (w2.to(tl.float64) + 0.5) * scale
    u3 = (w3.to(tl.float64) + 0.5) * scale
    r01 = tl.sqrt(-2.0 * tl.log(u0))
    r23 = tl.sqrt(-2.0 * tl.log(u2))
    e0 = 4 * group
    at = out_ptr + b * per_basis + e0
    tl.store(at, r01 * tl.cos(two_pi * u1), mask=live & (e0 < per_basis))
    tl.store(at + 1, r01 * tl.sin(two_pi * u1), mask=live & (e0 + 1 < per_basis))
    tl.store(at + 2, r23 * tl.cos(two_pi * u3), mask=live & (e0 + 2 < per_basis))
    tl.store(at + 3, r23 * tl.sin(two_pi * u3), mask=live & (e0 + 3 < per_basis))


def grassmann_normals_triton(out: torch.Tensor, seed: int, first_basis: int) -> None:
    """Fills out (B×d×k, float64, contiguous) with the normals of bases first_basis + b."""
    per_basis = out.shape[1] * out.shape[2]
    groups_per_basis = (per_basis + 3) // 4
    groups = out.shape[0] * groups_per_basis
    if groups == 0:
        return
    with device_guard(out):
        _grassmann_normals_kernel[(triton.cdiv(groups, _BLOCK),)](out, seed, first_basis, per_basis, groups_per_basis,
                                                                   groups, BLOCK=_BLOCK)
