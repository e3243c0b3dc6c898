"""Helpers shared by the Triton launchers: whether the interpreter runs them, the device guard,
tl.dot's input precision, TF32 operand rounding, and the upper-triangle tile enumeration (a jit
function)."""

import contextlib

import torch
import triton
import triton.language as tl

# interpreting(): whether the kernels run under the Triton interpreter (TRITON_INTERPRET=1, CPU
# tensors); input_precision(precision, dtype): tl.dot's input_precision for operands of dtype at the
# op's precision. Both are defined with the dispatch layer, which decides the same questions.
from .._backends import triton_input_precision as input_precision
from .._backends import triton_interpreting as interpreting

__all__ = ["device_guard", "input_precision", "interpreting", "round_to_tf32", "tile_counts", "upper_tile_coords"]


def device_guard(t: torch.Tensor):
    """Launches on t's GPU (a no-op context for CPU tensors under the interpreter)."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """A copy of float32 x rounded to TF32 (10 explicit mantissa bits) to nearest, ties away from
    zero: csrc/operand_rounding.h's round_to_tf32 (PTX cvt.rna.tf32.f32) in torch's integer ops,
    add 2^12 to the magnitude's bits and clear the 13 dropped bits. NaN and ±Inf pass through; a
    finite value past the largest finite TF32 value becomes ±Inf. Tensor cores fed these values
    use them exactly, whether they round or truncate their float32 operands."""
    if x.dtype != torch.float32:
        raise TypeError(f"round_to_tf32: x must be float32, got {x.dtype}")
    x = x.contiguous()
    rounded = x.view(torch.int32) + 0x1000  # the sign bit is apart: this adds to the magnitude
    rounded.bitwise_and_(-0x2000)  # 0xFFFFE000
    return torch.where(torch.isfinite(x), rounded.view(torch.float32), x)


def tile_counts(m: int, n: int, self_pairs: bool, block: int):
    """(tiles, column tiles) of the block×block tile grid: the tiles bi ≤ bj of the m×m grid
    (self_pairs: the pairs i<j, enumerated by upper_tile_coords), else all of the m×n grid."""
    row_tiles, col_tiles = triton.cdiv(m, block), triton.cdiv(n, block)
    return (row_tiles * (row_tiles + 1) // 2 if self_pairs else row_tiles * col_tiles), col_tiles


# Row-major enumeration of tiles bi <= bj of an nb × nb tile grid: row bi starts at
# bi*nb - bi*(bi-1)/2 (the same map as upper_tile_coords in csrc/pairwise_cosine_stats_epilogue.h).
@triton.jit
def upper_tile_coords(t, nb):
    two_n1 = tl.cast(2 * nb + 1, tl.float64)  # nb may be a constexpr int (== 1) on GPU
    disc = two_n1 * two_n1 - 8.0 * t.to(tl.float64)
    bi = ((two_n1 - tl.sqrt(tl.maximum(disc, 0.0))) * 0.5).to(tl.int64)
    bi = tl.minimum(tl.maximum(bi, 0), nb - 1)
    bi = tl.where(bi * nb - bi * (bi - 1) // 2 > t, bi - 1, bi)
    bi = tl.where((bi + 1) * nb - (bi + 1) * bi // 2 <= t, bi + 1, bi)
    bj = bi + (t - (bi * nb - bi * (bi - 1) // 2))
    return bi, bj
