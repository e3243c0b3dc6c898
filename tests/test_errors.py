"""Bad input gets a clear error that names the argument."""

import numpy as np
import pytest
import torch

import repcap_fast as rf


def good(v=10, d=4):
    return torch.randn(v, d, generator=torch.Generator().manual_seed(v * 31 + d))


@pytest.mark.parametrize("fn", [rf.pairwise_cosine_stats, rf.cosine_moments])
class TestMatrixChecks:
    def test_nan(self, fn):
        a = good()
        a[4, 2] = float("nan")
        with pytest.raises(ValueError, match=r"A contains 1 NaN/Inf values \(first in row 4\)"):
            fn(a)

    def test_inf(self, fn):
        a = good()
        a[7, 0] = float("inf")
        a[8, 0] = float("-inf")
        with pytest.raises(ValueError, match="A contains 2 NaN/Inf"):
            fn(a)

    def test_nan_in_b(self, fn):
        b = good(5)
        b[1, 1] = float("nan")
        with pytest.raises(ValueError, match="B contains 1 NaN/Inf"):
            fn(good(), b)

    def test_zero_rows_error_counts_and_names_them(self, fn):
        a = good(30)
        a[[2, 11, 29]] = 0
        with pytest.raises(ValueError, match=r"A has 3 zero-norm rows \(rows \[2, 11, 29\]\).*zero_rows='drop'"):
            fn(a)

    def test_zero_rows_bad_policy(self, fn):
        with pytest.raises(ValueError, match="zero_rows must be"):
            fn(good(), zero_rows="ignore")

    @pytest.mark.parametrize("shape", [(10,), (2, 3, 4)])
    def test_ndim(self, fn, shape):
        with pytest.raises(ValueError, match=r"A must be 2-D"):
            fn(torch.randn(*shape))

    def test_integer_dtype(self, fn):
        with pytest.raises(TypeError, match="A must be float16, bfloat16, float32 or float64"):
            fn(torch.ones(5, 3, dtype=torch.int64))

    def test_integer_numpy(self, fn):
        with pytest.raises(TypeError, match="A must have a floating dtype"):
            fn(np.ones((5, 3), dtype=np.int32))

    def test_not_a_matrix(self, fn):
        with pytest.raises(TypeError, match="A must be a torch.Tensor or numpy.ndarray"):
            fn([[1.0, 2.0], [3.0, 4.0]])

    @pytest.mark.parametrize("shape", [(0, 4), (5, 0)])
    def test_empty(self, fn, shape):
        with pytest.raises(ValueError, match="A is empty"):
            fn(torch.randn(*shape))

    def test_one_row(self, fn):
        with pytest.raises(ValueError, match="A needs at least 2 rows"):
            fn(torch.randn(1, 4))

    def test_one_row_left_after_drop(self, fn):
        a = torch.zeros(3, 4)
        a[0, 0] = 1
        with pytest.raises(ValueError, match="at least 2 rows to form a pair, got 1 after dropping 2 zero-norm rows"):
            fn(a, zero_rows="drop")

    def test_b_d_mismatch(self, fn):
        with pytest.raises(ValueError, match=r"A and B must have the same d"):
            fn(good(10, 4), good(10, 5))

    def test_devices_differ(self, fn):
        # The only other device on a CPU machine is meta, which is refused first (it holds no values);
        # the two-device message is checked with a second device that has values in the GPU tests.
        with pytest.raises(ValueError, match="B is on the meta device: it holds no values"):
            fn(good(), torch.empty(3, 4, device="meta"))
        A, B = good(), good()
        B.__class__ = type("OtherDevice", (torch.Tensor,), {"device": property(lambda self: torch.device("cuda:7"))})
        with pytest.raises(ValueError, match="A is on cpu but B is on cuda:7"):
            fn(A, B)

    @pytest.mark.parametrize("n_rows", [0, 11, -1])
    def test_n_rows_out_of_range(self, fn, n_rows):
        with pytest.raises(ValueError, match=r"n_rows must be in \[1, 10\]"):
            fn(good(), n_rows=n_rows)

    def test_n_rows_not_int(self, fn):
        with pytest.raises(TypeError, match="n_rows must be an int"):
            fn(good(), n_rows=2.5)


@pytest.mark.parametrize("bins", [0, -3, 2.5, True, 65537])  # 65537: past the kernels' limit
def test_bins(bins):
    with pytest.raises(ValueError, match="bins must be an int"):
        rf.pairwise_cosine_stats(good(), bins=bins)


@pytest.mark.parametrize("value_range", [(1.0, -1.0), (0.0, 0.0), (0, float("inf")), (1,), "ab"])
def test_range(value_range):
    with pytest.raises(ValueError, match="range must be"):
        rf.pairwise_cosine_stats(good(), range=value_range)


def test_precision():
    with pytest.raises(ValueError, match="precision must be one of"):
        rf.pairwise_cosine_stats(good(), precision="bf16")


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend must be one of"):
        rf.pairwise_cosine_stats(good(), backend="metal")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA kernels")
def test_cuda_backend_not_built_says_how_to_build():
    with pytest.raises(RuntimeError, match="(built without CUDA kernels|runs on CUDA tensors)"):
        rf.pairwise_cosine_stats(good(), backend="cuda")


def test_cpu_backend_refuses_gpu_or_meta_tensor():
    with pytest.raises(ValueError, match="A is on the meta device: it holds no values"):
        rf.pairwise_cosine_stats(torch.empty(4, 3, device="meta"), backend="cpu")


def test_triton_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        rf.pairwise_cosine_stats(good(), backend="triton")


def test_env_override_is_validated(monkeypatch):
    monkeypatch.setenv("REPCAP_BACKEND", "fast")
    with pytest.raises(ValueError, match="REPCAP_BACKEND must be one of"):
        rf.pairwise_cosine_stats(good())
