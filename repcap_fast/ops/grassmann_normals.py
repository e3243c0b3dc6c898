"""grassmann_normals: the standard normals behind Subspace PGA's null subspaces.

They are drawn on the tensors' device by a counter-based generator, so that a normal depends on
(seed, basis, element) alone: the same values on CPU and GPU and whatever the batch
(csrc/grassmann_normals.h):

    key     = (seed mod 2^32, seed div 2^32)
    counter = (g mod 2^32, g div 2^32, b mod 2^32, b div 2^32),  g = e div 4
    words   = Philox4x32-10(counter, key)  →  u_i = (w_i + 1/2)·2^-32
    (n_0, n_1) = sqrt(−2 ln u_0)·(cos 2πu_1, sin 2πu_1), (n_2, n_3) likewise;  normal e = n_(e mod 4)

for element e = i·k + j, entry (i, j) of the d×k basis b. The words are bitwise equal on every
backend; the normals differ only by the platform's log, cos and sin rounding (a few ulp).

Layers: ``grassmann_normals`` (validates) → ``KERNELS["grassmann_normals"][backend]``
(``_grassmann_normals_compiled`` for cpu and cuda, ``_grassmann_normals_triton``,
``_grassmann_normals_torch``) → the kernels (torch.ops.repcap_fast.grassmann_normals from
csrc/cpu and csrc/cuda, triton_kernels.grassmann_normals, reference.grassmann_normals_reference).
Every launcher takes (out, seed, first_basis) and fills out (B×d×k, float64, contiguous).
"""

from __future__ import annotations

import torch

from .. import _validation as val
from .._backends import custom_op, eager_only, launcher, register_kernel, resolve_backend, triton_kernels
from .._ops import grassmann_normals_fake
from ..reference import grassmann_normals_reference


@eager_only
def grassmann_normals(n: int, d: int, k: int, seed: int = 0, *, first_basis: int = 0, device="cpu",
                      backend: str = "auto") -> torch.Tensor:
    """The (n, d, k) float64 standard normals of bases first_basis … first_basis + n − 1 for `seed`.

    Drawn on `device` by a counter-based generator (Philox4x32-10 and Box–Muller, see the module
    docstring): basis b's values do not depend on n, first_basis, the device or the backend
    (beyond a few ulp of log/cos/sin).

    Args:
        n: the number of bases, ≥ 1.
        d: the rows of each basis, ≥ 1.
        k: the columns of each basis, ≥ 1.
        seed: an int in [0, 2^63 − 1] (default 0).
        first_basis: the index of the first basis drawn, ≥ 0 (default 0); first_basis + n ≤ 2^63 − 1.
        device: where to draw them (default "cpu").
        backend: "auto" (the C++ kernel for CPU tensors; cuda, else triton, for CUDA tensors),
            "cpu", "cuda", "triton" or "torch" (the reference, plain int64 torch ops).

    Returns:
        torch.Tensor: (n, d, k) float64 on `device`.

    Raises:
        ValueError: n, d or k < 1, a seed or first_basis out of range, a device that does not
            exist here, or an unknown backend.
        TypeError: an argument of the wrong type (a float or bool for an integer).
        repcap_fast._backends.BackendUnavailableError: the backend asked for is not built here.

    Examples:
        >>> from repcap_fast.ops.grassmann_normals import grassmann_normals
        >>> z = grassmann_normals(2, 3, 1, seed=7)
        >>> z.shape, torch.equal(z[1], grassmann_normals(1, 3, 1, seed=7, first_basis=1)[0])
        (torch.Size([2, 3, 1]), True)
    """
    n, d, k = val.check_int(n, "n", 1), val.check_int(d, "d", 1), val.check_int(k, "k", 1)
    seed = val.check_seed(seed)
    first_basis = val.check_int(first_basis, "first_basis", 0)
    if first_basis + n > val.MAX_SEED:
        raise ValueError(f"first_basis + n must be <= {val.MAX_SEED}, got {first_basis} + {n}")
    device = val.check_device(device)
    name = resolve_backend(backend, device, "grassmann_normals")
    out = torch.empty(n, d, k, dtype=torch.float64, device=device)
    launcher("grassmann_normals", name)(out, seed, first_basis)
    return out


@register_kernel("grassmann_normals", "cpu", "cuda")
def _grassmann_normals_compiled(out, seed, first_basis):
    """The C++ op (csrc/grassmann_normals_ops.cpp), routed to the CPU or CUDA kernel by out's device."""
    torch.ops.repcap_fast.grassmann_normals(out, seed, first_basis)


@register_kernel("grassmann_normals", "triton")
def _grassmann_normals_triton(out, seed, first_basis):
    """The Triton kernel, through its custom op."""
    torch.ops.repcap_fast.grassmann_normals_triton(out, seed, first_basis)


@custom_op("repcap_fast::grassmann_normals_triton", mutates_args=("out",))
def _grassmann_normals_triton_op(out: torch.Tensor, seed: int, first_basis: int) -> None:
    """The Triton kernel as a custom op: the contract of torch.ops.repcap_fast.grassmann_normals."""
    triton_kernels().grassmann_normals_triton(out, seed, first_basis)


_grassmann_normals_triton_op.register_fake(grassmann_normals_fake)


@register_kernel("grassmann_normals", "torch")
def _grassmann_normals_torch(out, seed, first_basis):
    """The reference in plain int64 torch ops."""
    n, d, k = out.shape
    out.copy_(grassmann_normals_reference(n, d, k, seed, first_basis, device=out.device))
