"""Input checks shared by every public function: each returns the value in canonical form or
raises a ValueError/TypeError that names the argument and what was expected."""

from __future__ import annotations

import math
import os
import tempfile
from typing import Optional, Sequence, Tuple

import numpy as np
import torch


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type: a TypeError, and a ValueError like every other bad-input
    error (the command line reports both in one line; a bare TypeError is a bug)."""


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPE_NAMES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
               "float16": torch.float16}
_NORM_CHUNK_BYTES = 4 << 20  # float64 working copy of a row chunk


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype kernels compute in: float64 stays float64, every other float is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _kind(value) -> str:
    return type(value).__name__ if not isinstance(value, torch.Tensor) else f"tensor({value.dtype})"


def as_int(value, name: str, integral_real: bool = False) -> int:
    """`value` as a Python int: a Python, numpy or torch integer (a one-element tensor), or, with
    `integral_real`, a finite integral real of those kinds (8.0 → 8). Refused with an error that
    names the argument: bools, strings, None, non-integral reals (8.5 is never truncated to 8),
    NaN and ±inf, complex numbers, tensors of more than one element. A symbolic integer
    (torch.SymInt, under torch.compile with dynamic shapes) is returned as it is."""
    if isinstance(value, torch.SymInt):
        return value
    shown = value
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ArgumentTypeError(f"{name} must be an integer, got a tensor of shape {tuple(value.shape)}")
        if value.dtype == torch.bool or value.is_complex():
            raise ArgumentTypeError(f"{name} must be an integer, got {_kind(value)}")
        value = value.detach().cpu().reshape(()).item()  # int or float, exactly
    elif isinstance(value, np.ndarray):
        if value.size != 1:
            raise ArgumentTypeError(f"{name} must be an integer, got an array of shape {value.shape}")
        value = value.reshape(())[()]
    if isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be an integer, got a bool ({shown!r})")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        if not integral_real:
            raise ArgumentTypeError(f"{name} must be an integer, got {_kind(shown)} {shown!r}")
        # In value's own type (a long double 8 + 2^-60 is not 8); Python floats through math,
        # which torch.compile traces as constants.
        finite = math.isfinite(value) if isinstance(value, float) else bool(np.isfinite(value))
        if not finite:
            raise ValueError(f"{name} must be a finite integer, got {float(value)}")
        if not (value.is_integer() if isinstance(value, float) else bool(value == np.floor(value))):
            raise ValueError(f"{name} must be an integer (it is never truncated), got {value!r}")
        return int(value)  # exact for every integral float (a long double too)
    raise ArgumentTypeError(f"{name} must be an integer, got {_kind(shown)} {shown!r}")


def check_int(value, name: str, minimum: Optional[int] = None, maximum: Optional[int] = None,
              integral_real: bool = False) -> int:
    """An integer (Python, numpy or torch; not a bool; see `as_int`) in [minimum, maximum]."""
    value = as_int(value, name, integral_real)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = (f"in [{minimum}, {maximum}]" if minimum is not None and maximum is not None
                  else f">= {minimum}" if minimum is not None else f"<= {maximum}")
        raise ValueError(f"{name} must be {bounds}, got {value}")
    return value


MAX_SEED = 2**63 - 1


def check_seed(seed, name: str = "seed") -> int:
    """A seed: an int in [0, 2^63 − 1] (every seed draws its own values: none is reduced modulo
    anything, so no two seeds alias, and floats such as 1.5 are refused, not truncated)."""
    return check_int(seed, name, 0, MAX_SEED)


def check_n_null(n_null) -> int:
    """The number of null subspaces of Subspace PGA: an int ≥ 2 (the null's std needs two)."""
    n_null = as_int(n_null, "n_null")
    if n_null < 2:
        raise ValueError(f"n_null must be an int >= 2 (the null std needs two), got {n_null!r}")
    return n_null


def check_bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_choice(value, name: str, choices: Sequence):
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def as_real(value, name: str) -> float:
    """`value` as a finite Python float: a Python, numpy or torch real (a one-element tensor).
    Refused with an error naming the argument: bools, strings ("2" is not a number here), None,
    complex numbers, NaN and ±inf, values beyond float64."""
    shown = value
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
            raise ArgumentTypeError(f"{name} must be a real number, got {_kind(value)} of shape {tuple(value.shape)}")
        value = value.detach().cpu().reshape(()).item()
    elif isinstance(value, np.ndarray):
        if value.size != 1:
            raise ArgumentTypeError(f"{name} must be a real number, got an array of shape {value.shape}")
        value = value.reshape(())[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(f"{name} must be a real number, got {_kind(shown)} {shown!r}")
    try:
        out = float(value)
    except OverflowError:
        raise ValueError(f"{name} must be a finite number, got {shown!r} (beyond float64)") from None
    if not math.isfinite(out):
        raise ValueError(f"{name} must be a finite number, got {out}")
    return out


def check_real(value, name: str, minimum: Optional[float] = None, maximum: Optional[float] = None,
               open_min: bool = False) -> float:
    """A finite real (see `as_real`) in [minimum, maximum] (or (minimum, maximum] with open_min)."""
    value = as_real(value, name)
    if minimum is not None and (value < minimum or (open_min and value == minimum)):
        raise ValueError(f"{name} must be {'>' if open_min else '>='} {minimum:g}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum:g}, got {value!r}")
    return value


def check_positive_float(value, name: str) -> float:
    """A finite real > 0."""
    return check_real(value, name, 0.0, open_min=True)


def check_device(device, name: str = "device") -> torch.device:
    """A torch.device that exists here: a CUDA device needs a CUDA build of torch with that
    many GPUs (checked before any work, with the build named in the error)."""
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise ArgumentTypeError(f"{name} must be a device name or torch.device (e.g. cpu, cuda, cuda:1), got "
                                f"{type(device).__name__} {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"{name} {device!r} is not a device (e.g. cpu, cuda, cuda:1): "
                         f"{' '.join(str(exc).split())[:200]}") from None
    if dev.type == "meta":
        raise ValueError(f"{name} {device!r}: the meta device holds shapes but no values, and every analysis here "
                         "needs the values; use cpu or cuda")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} {device!r}: this torch has no CUDA device (torch {torch.__version__}"
                             f"{', a CPU-only build' if torch.version.cuda is None else ''})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name} {device!r}: there are {torch.cuda.device_count()} CUDA devices")
    elif dev.type != "cpu":
        if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError(f"{name} {device!r}: MPS is not available here")
    return dev


def check_dtype(dtype, name: str = "dtype") -> torch.dtype:
    """A float torch.dtype, given as one or by name ("float32", ...)."""
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"{name} must be one of {tuple(DTYPE_NAMES)}, got {dtype!r}")
        return DTYPE_NAMES[dtype]
    if dtype not in FLOAT_DTYPES:
        raise ArgumentTypeError(f"{name} must be a float dtype, got {dtype!r}")
    return dtype


def check_p(p, maximum: Optional[int] = None) -> int:
    """The penalty exponent p as an int ≥ 1 (≤ maximum): Python, numpy or torch integers, or
    finite integral reals (8.0); 8.5, NaN, inf, bools and strings are refused, never truncated."""
    p = as_int(p, "p", integral_real=True)
    if p < 1 or (maximum is not None and p > maximum):
        raise ValueError(f"p must be an integer in [1, {maximum}], got {p}" if maximum is not None
                         else f"p must be an integer >= 1, got {p}")
    return p


def check_k(k, d: int) -> int:
    """A subspace dimension 1 ≤ k < d."""
    k = as_int(k, "k")
    if not 1 <= k < d:
        raise ValueError(f"k must satisfy 1 <= k < d = {d}, got k={k}")
    return k


def layout_problem(x: torch.Tensor, allow_meta: bool = False) -> Optional[str]:
    """What keeps the tensor x from being read as a dense matrix, or None.

    Sparse layouts (COO, CSR, CSC, BSR, BSC), nested tensors, and (unless allow_meta) tensors on
    the meta device, which hold no values.
    """
    if x.is_nested:
        return "a nested tensor: pass one dense 2-D tensor (torch.cat of its components, or to_padded_tensor)"
    if x.layout != torch.strided:
        layout = str(x.layout).replace("torch.", "")
        return (f"a sparse tensor ({layout}): pass a dense one (.to_dense(); the ops read every entry of a dense "
                "matrix, so densifying costs rows x d memory)")
    if x.is_meta and not allow_meta:
        return "on the meta device: it holds no values to measure (load or materialize its weights first)"
    return None


def check_dense(x: torch.Tensor, name: str, allow_meta: bool = False) -> torch.Tensor:
    """X when it is a dense (strided) tensor with values; else a ValueError naming it and its layout."""
    problem = layout_problem(x, allow_meta)
    if problem is not None:
        raise ValueError(f"{name} is {problem}")
    return x


def as_matrix(x, name: str) -> torch.Tensor:
    """A 2-D floating tensor, non-empty; numpy arrays are converted (without a copy)."""
    if isinstance(x, np.ndarray):
        if not np.issubdtype(x.dtype, np.floating):
            raise ArgumentTypeError(f"{name} must have a floating dtype, got numpy {x.dtype}")
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    check_dense(x, name)
    x = x.detach()  # statistics of the values; nn.Parameter and tensors in a graph are fine
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows x d), got shape {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ArgumentTypeError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {tuple(x.shape)}")
    return x


def as_rank_keys(x, name: str) -> torch.Tensor:
    """A 1-D tensor whose order and ties are exactly those of x's values (any array-like of real
    numbers), for ranking: nothing is rounded on the way. Tensors keep their dtype and device;
    numpy arrays and lists keep their values exactly (floats as float64, integers as int64, and
    integers beyond int64, or mixes of ints and floats, as their dense ranks). NaN is an error."""
    if isinstance(x, torch.Tensor):
        keys = x.detach().reshape(-1)
        if keys.is_complex():
            raise ArgumentTypeError(f"{name} must hold real numbers, got {keys.dtype}")
    else:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError) as exc:
            raise ArgumentTypeError(f"{name} must be an array of real numbers: {exc}") from None
        arr = arr.reshape(-1)
        if arr.dtype.kind == "f" and not isinstance(x, np.ndarray):
            given = np.asarray(x, dtype=object).reshape(-1)  # the values as given, before float64 rounding
            if any(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and abs(int(v)) > 2**53
                   for v in given.tolist()):
                arr = given  # ints beyond 2^53 beside floats: compared exactly below
        if arr.dtype.kind in "biu" and arr.dtype != np.uint64 or arr.dtype.kind == "f" and arr.dtype.itemsize <= 8:
            keys = torch.from_numpy(np.ascontiguousarray(arr if arr.dtype.kind != "u" else arr.astype(np.int64)))
        elif arr.dtype.kind in "fuO":  # long double, uint64, Python ints beyond int64, mixed: exact comparisons
            for v in arr.tolist() if arr.dtype.kind == "O" else ():
                if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                    raise ArgumentTypeError(f"{name} must hold real numbers, got {type(v).__name__} {v!r}")
            values = arr.tolist()
            if any(v != v for v in values):
                raise ValueError(f"{name} contains NaN")
            _, dense = np.unique(np.array(values, dtype=object), return_inverse=True)
            keys = torch.from_numpy(dense.reshape(-1).astype(np.int64))
        else:
            raise ArgumentTypeError(f"{name} must hold real numbers, got numpy {arr.dtype}")
    if keys.dtype.is_floating_point and bool(torch.isnan(keys).any()):
        raise ValueError(f"{name} contains NaN (at index {int(torch.nonzero(torch.isnan(keys))[0])})")
    if keys.dtype == torch.bool:
        keys = keys.to(torch.int64)
    return keys


def restrict_rows(x: torch.Tensor, n_rows: Optional[int], name: str, arg: str = "n_rows"):
    if n_rows is None:
        return x
    n_rows = as_int(n_rows, arg)
    if not 1 <= n_rows <= x.shape[0]:
        raise ValueError(f"{arg} must be in [1, {x.shape[0]}] ({name} has {x.shape[0]} rows), got {n_rows}")
    return x[: int(n_rows)]


def finite_matrix(x, name: str) -> torch.Tensor:
    """`as_matrix(x, name)` with no NaN/Inf value (the error names the first bad row)."""
    x = as_matrix(x, name)
    row_norms(x, name)
    return x


def power_of_two_scale(x: torch.Tensor) -> float:
    """2^e ≈ max|x| (1 for a zero x): dividing by it is exact (no rounding) and brings float64
    values of any magnitude, 1e-300 or 1e300, near 1, so products and Gram matrices of x/s
    neither overflow nor underflow. Scale-invariant results (directions, cosines) are unchanged."""
    largest = 0.0
    if x.numel():
        rows = max(1, _NORM_CHUNK_BYTES // (8 * max(1, x[0].numel())))
        # max|x| chunk by chunk: no copy of all of x (W_U may be V×d at 150k×4096)
        largest = max(float(torch.stack(torch.aminmax(x[r0 : r0 + rows])).abs().max())
                      for r0 in range(0, x.shape[0], rows))
    if not math.isfinite(largest):
        raise ValueError("power_of_two_scale: x contains NaN/Inf")
    return 1.0 if largest == 0.0 else math.ldexp(1.0, math.frexp(largest)[1] - 1)  # ≤ max|x|: representable


def row_norms(x: torch.Tensor, name: str, check: bool = True) -> torch.Tensor:
    """Float64 row norms, in row chunks (no float64 copy of all of x); raises on NaN/Inf in x,
    naming the count and the first bad row. A float64 row of finite values whose norm exceeds
    float64's range (about 1.8e308) gets norm inf: it is a valid direction, and `unit_rows`
    normalizes it exactly. check=False skips the NaN/Inf check (a host synchronization): rows with
    NaN/Inf then get a NaN or inf norm, which the caller must check on the device."""
    rows = max(1, _NORM_CHUNK_BYTES // (8 * x.shape[1]))
    norms = torch.empty(x.shape[0], dtype=torch.float64, device=x.device)
    finite = torch.empty(x.shape[0], dtype=torch.bool, device=x.device)
    for r0 in range(0, x.shape[0], rows):
        chunk = x[r0 : r0 + rows]
        if x.dtype != torch.float64:
            # Squares of float32/16-bit values neither overflow nor underflow in float64, and a
            # NaN/Inf value makes its row's norm non-finite.
            norms[r0 : r0 + rows] = torch.linalg.vector_norm(chunk, dim=1, dtype=torch.float64)
            finite[r0 : r0 + rows] = torch.isfinite(norms[r0 : r0 + rows])
            continue
        # ‖x‖ = s·‖x/s‖ with s = max|x|: no overflow or underflow even for extreme float64 rows.
        scale = chunk.abs().amax(dim=1, keepdim=True)
        finite[r0 : r0 + rows] = torch.isfinite(scale[:, 0])
        safe = torch.where((scale > 0) & torch.isfinite(scale), scale, torch.ones_like(scale))
        norms[r0 : r0 + rows] = torch.linalg.vector_norm(chunk / safe, dim=1) * scale[:, 0]
    if check and not bool(finite.all()):
        n_bad = int((~torch.isfinite(x)).sum())
        first = int(torch.nonzero(~finite)[0])
        raise ValueError(f"{name} contains {n_bad} NaN/Inf values (first in row {first})")
    return norms


def unit_rows(x: torch.Tensor, dtype: Optional[torch.dtype] = None, norms: Optional[torch.Tensor] = None,
              name: str = "x", huge_rows: bool = True) -> torch.Tensor:
    """x̂_i = x_i/‖x_i‖, divided in float64 row chunk by row chunk and rounded once to `dtype`
    (x's compute dtype by default), so tiny or huge rows (1/‖x‖ beyond float32, or a float64
    norm beyond float64's range) come out exact; zero rows stay zero. `norms`: the float64 row
    norms when already known. huge_rows=False skips the search for rows whose norm is beyond
    float64's range (a host synchronization); the caller then refuses such rows (inf norms)."""
    if norms is None:
        norms = row_norms(x, name)
    dtype = compute_dtype(x.dtype) if dtype is None else dtype
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    rows = max(1, _NORM_CHUNK_BYTES // (8 * x.shape[1]))
    for r0 in range(0, x.shape[0], rows):
        out[r0 : r0 + rows] = x[r0 : r0 + rows].to(torch.float64) / safe[r0 : r0 + rows, None]
    huge = torch.nonzero(torch.isinf(norms)).flatten() if huge_rows else norms.new_empty(0)
    if huge.numel():  # ‖x‖ beyond float64: x/max|x| first (exact for a power of two), then its norm
        for i in huge.tolist():
            row = x[i].to(torch.float64) / power_of_two_scale(x[i])
            out[i] = row / torch.linalg.vector_norm(row)
    return out


def drop_zero_rows(
    x: torch.Tensor, norms: torch.Tensor, zero_rows: str, name: str
) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """Applies the zero_rows policy: "error" raises, "drop" removes them and counts them."""
    check_choice(zero_rows, "zero_rows", ("error", "drop"))
    zero = norms == 0
    n_zero = int(zero.sum())
    if n_zero == 0:
        return x, norms, 0
    if zero_rows == "error":
        idx = torch.nonzero(zero).flatten()[:10].tolist()
        more = ", ..." if n_zero > 10 else ""
        raise ValueError(
            f"{name} has {n_zero} zero-norm rows (rows {idx}{more}); their cosine is undefined. "
            "Pass zero_rows='drop' to drop them (the count is reported)."
        )
    keep = ~zero
    return x[keep], norms[keep], n_zero


def check_pair(a: torch.Tensor, b: torch.Tensor, name_a: str = "A", name_b: str = "B"):
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"{name_a} and {name_b} must have the same d: {name_a} is {tuple(a.shape)}, "
            f"{name_b} is {tuple(b.shape)}"
        )
    if a.device != b.device:
        raise ValueError(f"{name_a} is on {a.device} but {name_b} is on {b.device}; move them to one device")


def check_histogram(bins, value_range, max_bins: Optional[int] = None) -> Tuple[int, float, float]:
    """(bins, lo, hi) of a fixed-bin histogram; max_bins: the kernels' limit (None: no limit)."""
    bins = as_int(bins, "bins")
    if bins < 1 or (max_bins is not None and bins > max_bins):
        raise ValueError(f"bins must be an int in [1, {max_bins}], got {bins!r}" if max_bins is not None
                         else f"bins must be an int >= 1, got {bins!r}")
    if isinstance(value_range, (str, bytes)) or not hasattr(value_range, "__len__") or len(value_range) != 2:
        raise ValueError(f"range must be a pair (lo, hi), got {value_range!r}")
    lo, hi = (as_real(v, "range") for v in value_range)
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"range must be finite with lo < hi, got {value_range!r}")
    # The kernels bin in float32: lo, hi and bins/(hi − lo) must be finite float32 numbers, and lo
    # and hi distinct after rounding, or every pair would land in one bin (or NaN edges) silently.
    f32 = np.finfo(np.float32)
    if max(abs(lo), abs(hi)) > float(f32.max):
        raise ValueError(f"range must lie within float32's range ±{float(f32.max):.4g} (the kernels bin in "
                         f"float32; cosines lie in [-1, 1]), got {value_range!r}")
    lo32, hi32 = np.float32(lo), np.float32(hi)
    with np.errstate(over="ignore", divide="ignore"):
        per_unit = np.float32(bins / (float(hi32) - float(lo32))) if lo32 < hi32 else np.float32("inf")
    if not lo32 < hi32 or not np.isfinite(per_unit):
        raise ValueError(f"range {value_range!r} is too narrow for {bins} bins in float32 (the kernels bin in "
                         f"float32: lo and hi must differ there and bins/(hi - lo) stay below {float(f32.max):.4g})")
    return int(bins), lo, hi


def check_orthonormal(basis: torch.Tensor, name: str = "basis", tol: Optional[float] = None) -> torch.Tensor:
    """Checks that a d×k basis B has orthonormal columns, and returns it.

    The columns are orthonormal when max |BᵀB − I| ≤ tol, computed in float64.

    Args:
        basis: the d×k basis B, a 2-D tensor of any float dtype.
        name: the argument's name in the error. Defaults to "basis".
        tol: the largest deviation allowed; None (default) means 1e-10 for float64 and 1e-4
            for 16/32-bit floats.

    Returns:
        torch.Tensor: `basis` itself, unchanged.

    Raises:
        ValueError: basis is not a 2-D tensor, or max |BᵀB − I| > tol (the error names it).

    Examples:
        >>> rf.pga.check_orthonormal(torch.eye(4)[:, :2]).shape
        torch.Size([4, 2])
        >>> rf.pga.check_orthonormal(2 * torch.eye(3))
        Traceback (most recent call last):
            ...
        ValueError: basis is not orthonormal: max |BᵀB − I| = 3 > 0.0001
    """
    if isinstance(basis, torch.Tensor):
        check_dense(basis, name)
    if not isinstance(basis, torch.Tensor) or basis.dim() != 2:
        raise ValueError(f"{name} must be a 2-D (d×k) tensor with orthonormal columns")
    if tol is None:
        tol = 1e-10 if basis.dtype == torch.float64 else 1e-4
    b = basis.to(torch.float64)
    dev = float((b.T @ b - torch.eye(b.shape[1], dtype=torch.float64, device=b.device)).abs().max())
    if not dev <= tol:
        raise ValueError(f"{name} is not orthonormal: max |BᵀB − I| = {dev:.3g} > {tol:g}")
    return basis


def check_basis(basis, d: int, name: str = "basis") -> torch.Tensor:
    """A d×k basis of H's space (d rows; finite; orthonormal columns) as float64."""
    if isinstance(basis, torch.Tensor):
        check_dense(basis, name)
    if not isinstance(basis, torch.Tensor) or basis.dim() != 2:
        raise ValueError(f"{name} must be a 2-D (d×k) tensor")
    if basis.shape[0] != d:
        raise ValueError(f"{name} has d={basis.shape[0]} rows but H has d={d}")
    if not bool(torch.isfinite(basis).all()):
        raise ValueError(f"{name} contains NaN/Inf")
    return check_orthonormal(basis, name).to(torch.float64)


def _probe_writable(folder: str, name: str, shown: str) -> None:
    """Creates and removes a file in `folder`: the one test that also catches read-only mounts
    and permissions that os.access misjudges (root)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".repcap-write-test-", dir=folder)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        raise ValueError(f"{name} {shown!r}: cannot write in {folder!r} ({exc.strerror or exc})") from None


def _as_path(path, name: str, what: str) -> str:
    try:
        path = os.fspath(path)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be a path, got {type(path).__name__}") from None
    if not isinstance(path, str) or not path:
        raise ValueError(f"{name} must be a non-empty {what} path, got {path!r}")
    return path


def check_output_file(path, name: str, default_suffix: Optional[str] = None) -> str:
    """An output file path, checked before any work: its parent folders are created, the folder
    must be writable, and the path must not be a folder. With `default_suffix` (".png"), a path
    without a suffix gets it (the name that will really be written). Returns the path."""
    path = _as_path(path, name, "file")
    if default_suffix and not os.path.splitext(path)[1]:
        path += default_suffix
    if os.path.isdir(path) or path.endswith(os.sep):
        raise ValueError(f"{name} {path!r} is a folder; give a file path")
    folder = os.path.dirname(os.path.realpath(path))  # a symlink's target is what gets written
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{name} {path!r}: cannot create its folder {folder!r} ({exc.strerror or exc})") from None
    _probe_writable(folder, name, path)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"{name} {path!r} exists and is not writable")
    return path


def check_output_folder(path, name: str) -> str:
    """An output folder, checked before any work: created (with its parents) and writable; an
    existing file there is an error. Returns the path."""
    path = _as_path(path, name, "folder")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{name} {path!r} is a file; give a folder")
    try:
        os.makedirs(os.path.realpath(path), exist_ok=True)  # a dangling symlink: its target is created
    except OSError as exc:
        raise ValueError(f"{name} {path!r}: cannot create the folder ({exc.strerror or exc})") from None
    _probe_writable(path, name, path)
    return path
