"""Fuzzing of the classes of the third reliability probe (issue 47), in CI with the fixed
hypothesis profile of tests/conftest.py: tensor layouts and devices (sparse, nested, meta),
compiled versus eager error types, higher-order autograd, symlinked outputs, and truncated or
edited CSV sweep files. REPCAP_HYPOTHESIS_SCALE=10 runs ten times the examples."""

import os
import shutil
import tempfile

import pytest
import torch

import repcap_fast as rf
from repcap_fast import packing
from repcap_fast._backends import build_info
from repcap_fast.packing.sweep_file import read_cells, write_cells
from repcap_fast.reference import gram_offdiag_penalty_reference

from _helpers import examples, raised

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

needs_c = pytest.mark.skipif(not build_info(), reason="repcap_fast._C is not built")

# ------------------------------------------------------------------ layouts and devices

LAYOUTS = {
    "coo": lambda x: x.to_sparse(),
    "csr": lambda x: x.to_sparse_csr(),
    "csc": lambda x: x.to_sparse_csc(),
    "bsr": lambda x: x.to_sparse_bsr((1, 1)),
    "nested": lambda x: torch.nested.nested_tensor(list(x.split(max(1, x.shape[0] // 2)))),
    "jagged": lambda x: torch.nested.nested_tensor(list(x.split(max(1, x.shape[0] // 2))), layout=torch.jagged),
    "meta": lambda x: x.to("meta"),
}
W = torch.randn(40, 5, dtype=torch.float64)
H = torch.randn(30, 5, dtype=torch.float64)
OPS = {
    "pairwise_cosine_stats": lambda x: rf.pairwise_cosine_stats(x, bins=8, progress=False),
    "pairwise_cosine_stats B": lambda x: rf.pairwise_cosine_stats(torch.randn(4, 5), x, bins=8, progress=False),
    "cosine_moments": rf.cosine_moments,
    "epsilon": rf.epsilon,
    "gram_offdiag_penalty": lambda x: rf.gram_offdiag_penalty(x, p=4),
    "gram_offdiag_penalty_block": lambda x: rf.gram_offdiag_penalty_block(x, 0, 1, 4),
    "gram_offdiag_log_penalty": lambda x: rf.gram_offdiag_log_penalty(x, 4),
    "gram_offdiag_row_stats": lambda x: rf.gram_offdiag_row_stats(x, 4),
    "gram_offdiag_max": rf.gram_offdiag_max,
    "subspace_pga H": lambda x: rf.subspace_pga(x, W, k=2, n_null=3, progress=False),
    "subspace_pga W_U": lambda x: rf.subspace_pga(H, x, k=2, n_null=3, progress=False),
    "pairwise_cosine_stats_sharded": lambda x: rf.pairwise_cosine_stats_sharded(x, bins=8, progress=False),
}
# (d = 5 throughout: a nested tensor has no shape to read d from.)
# Ops whose results are tensors: a meta input gives meta outputs (shapes only), as any PyTorch op.
META_SHAPES_ONLY = {"gram_offdiag_penalty", "gram_offdiag_penalty_block", "gram_offdiag_row_stats"}


@needs_c
@settings(max_examples=examples(60))
@given(op=st.sampled_from(sorted(OPS)), layout=st.sampled_from(sorted(LAYOUTS)),
       rows=st.integers(4, 12), d=st.just(5), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_every_op_refuses_a_tensor_that_is_not_dense_by_name_and_layout(op, layout, rows, d, dtype):
    try:
        x = LAYOUTS[layout](torch.randn(rows, d, dtype=dtype))
    except (RuntimeError, NotImplementedError):  # torch cannot build this layout from these values
        hypothesis.assume(False)
    if layout == "meta" and op in META_SHAPES_ONLY:
        out = OPS[op](x)
        assert all(t.is_meta for t in (out if isinstance(out, tuple) else (out,)))
        return
    with pytest.raises(ValueError) as raised:  # never a NotImplementedError or a PyTorch internal error
        OPS[op](x)
    message = str(raised.value)
    assert ("meta device" if layout == "meta" else "nested" if layout in ("nested", "jagged") else "sparse") in message
    assert message.split(" ")[0] in ("X", "A", "B", "H", "W_U", "A_local"), message


# --------------------------------------------------------- compiled versus eager errors

BAD_X = st.one_of(
    st.builds(lambda k, d: torch.randn(k, d), st.integers(0, 1), st.integers(1, 4)),
    st.builds(lambda k: torch.randn(k, 0), st.integers(2, 5)),
    st.builds(lambda k, d: torch.ones(k, d, dtype=torch.int64), st.integers(2, 5), st.integers(1, 4)),
    st.builds(lambda n: torch.randn(n), st.integers(1, 6)),
    st.builds(lambda k, d, i: torch.randn(k, d).index_fill_(0, torch.tensor([i % k]), float("nan")),
              st.integers(2, 6), st.integers(1, 4), st.integers(0, 10)),
)
GOOD_X = st.builds(lambda k, d: torch.randn(k, d), st.integers(2, 8), st.integers(1, 5))
BAD_ARGS = st.one_of(
    st.fixed_dictionaries({"p": st.one_of(st.integers(-5, 0), st.integers(2**31, 2**62), st.just(2.5),
                                          st.just(2**70))}),
    st.fixed_dictionaries({"backend": st.sampled_from(["nope", "CPU", "", 3])}),
    st.fixed_dictionaries({"precision": st.sampled_from(["fp8", "HIGHEST", ""])}),
    st.fixed_dictionaries({"normalize": st.sampled_from([1, None, "yes"])}),
)


@needs_c
@settings(max_examples=examples(25))
@given(case=st.one_of(st.tuples(BAD_X, st.just({})), st.tuples(GOOD_X, BAD_ARGS)),
       op=st.sampled_from(["penalty", "row_stats", "log_penalty"]))
def test_compiled_code_raises_the_eager_error_for_random_bad_arguments(case, op):
    x, kwargs = case
    fn = {"penalty": lambda x: rf.gram_offdiag_penalty(x, **kwargs),
          "row_stats": lambda x: rf.gram_offdiag_row_stats(x, **kwargs)[1],
          "log_penalty": lambda x: rf.gram_offdiag_log_penalty(x, kwargs.get("p", 4), **{
              k: v for k, v in kwargs.items() if k in ("backend", "precision")})[1]}[op]
    eager = raised(fn, x)
    hypothesis.assume(eager is not None)
    torch._dynamo.reset()
    assert raised(torch.compile(fn, fullgraph=True, backend="aot_eager"), x) == eager


# ----------------------------------------------------------------- higher-order autograd


@needs_c
@settings(max_examples=examples(30))
@given(k=st.integers(2, 12), d=st.integers(1, 6), p=st.integers(1, 9), normalize=st.booleans(),
       reduction=st.sampled_from(["sum", "mean"]), seed=st.integers(0, 2**32 - 1),
       backend=st.sampled_from(["cpu", "torch"]))
def test_second_order_gradients_match_the_reference(k, d, p, normalize, reduction, seed, backend):
    g = torch.Generator().manual_seed(seed)
    X0 = torch.randn(k, d, generator=g, dtype=torch.float64)
    V = torch.randn(k, d, generator=g, dtype=torch.float64)

    def hvp(loss_fn):
        X = X0.clone().requires_grad_()
        (grad,) = torch.autograd.grad(loss_fn(X), X, create_graph=True)
        (out,) = torch.autograd.grad((grad * V).sum(), X)
        return out

    got = hvp(lambda X: rf.gram_offdiag_penalty(X, p=p, normalize=normalize, reduction=reduction, backend=backend))
    want = hvp(lambda X: gram_offdiag_penalty_reference(X, p=p, normalize=normalize, reduction=reduction))
    # relative to the largest entry, with a floor for a second-order term that is 0 in exact arithmetic
    # (d = 1 or p = 1) and rounding, about p·k·2^-52, in float64
    tolerance = 1e-9 * float(want.abs().max()) + 1e-13 * p * k * float(V.abs().max())
    assert float((got - want).abs().max()) <= tolerance


# --------------------------------------------------------------------- symlinked outputs


@settings(max_examples=examples(20))
@given(chain=st.integers(1, 4), via_folder=st.booleans(), suffix=st.sampled_from([".json", ".csv", ".CSV"]))
def test_writes_through_any_chain_of_symlinks_reach_the_target(chain, via_folder, suffix):
    root = tempfile.mkdtemp(prefix="repcap-links-")
    try:
        os.mkdir(os.path.join(root, "store"))
        target = os.path.join(root, "store", "cells" + suffix)
        cells = packing.sweep([6], [3], target, steps=1, progress=False)
        name = target
        for i in range(chain):  # a link to a link to ... the file, or to a folder holding it
            link = os.path.join(root, f"link{i}" + ("" if via_folder and i == 0 else suffix))
            os.symlink(os.path.dirname(name) if via_folder and i == 0 else name, link)
            name = os.path.join(link, "cells" + suffix) if via_folder and i == 0 else link
        write_cells(name, cells)
        packing.sweep([6, 8], [3], name, steps=1, progress=False)
        assert [c["k"] for c in read_cells(target)] == [6, 8]
        assert sorted(os.listdir(os.path.join(root, "store"))) == ["cells" + suffix]
        assert all(os.path.islink(os.path.join(root, f)) for f in os.listdir(root) if f.startswith("link"))
    finally:
        shutil.rmtree(root)


# ---------------------------------------------------------------------- truncated CSV


@pytest.fixture(scope="module")
def csv_sweep():
    folder = tempfile.mkdtemp(prefix="repcap-csv-")
    out = os.path.join(folder, "cells.csv")
    packing.sweep([6, 8, 10], [3], out, steps=2, progress=False)
    with open(out, "rb") as f:
        raw = f.read()
    yield raw, read_cells(out)
    shutil.rmtree(folder)


@settings(max_examples=examples(80))
@given(data=st.data())
def test_a_csv_sweep_file_cut_or_with_a_row_dropped_never_reads_as_other_values(csv_sweep, data):
    raw, cells = csv_sweep
    lines = raw.split(b"\n")
    damage = data.draw(st.sampled_from(["cut", "drop row", "drop end", "edit digit"]))
    if damage == "cut":
        damaged = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif damage == "drop row":
        i = data.draw(st.integers(2, len(lines) - 3))
        damaged = b"\n".join(lines[:i] + lines[i + 1:])
    elif damage == "drop end":
        damaged = b"\n".join(lines[:-2]) + b"\n"
    else:  # one digit of a row replaced: a valid file with another value, which a reader cannot tell
        i = data.draw(st.integers(2, len(lines) - 3))
        pos = data.draw(st.sampled_from([j for j, c in enumerate(lines[i]) if chr(c).isdigit()]))
        row = bytearray(lines[i])
        row[pos] = ord("7") if row[pos] != ord("7") else ord("3")
        damaged = b"\n".join(lines[:i] + [bytes(row)] + lines[i + 1:])
    folder = tempfile.mkdtemp(prefix="repcap-csv-")
    try:
        path = os.path.join(folder, "cells.csv")
        with open(path, "wb") as f:
            f.write(damaged)
        try:
            got = read_cells(path)
        except ValueError:
            return  # refused: the guarantee
        assert damage == "edit digit", damage  # a cut or a dropped row is always refused
        assert len(got) == len(cells)
    finally:
        shutil.rmtree(folder)
