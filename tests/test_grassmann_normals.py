"""grassmann_normals (the counter-based normals of the null subspaces) on every backend against
the int64 torch reference, the Philox4x32-10 known-answer vectors, and grassmann_bases on top."""

import math

import pytest
import torch

from repcap_fast import geometry, pga
from repcap_fast.ops.grassmann_normals import grassmann_normals
from repcap_fast.reference import grassmann_normals_reference, philox4x32_10_reference

from _helpers import device_backends

# Random123's known-answer vectors for philox4x32 with 10 rounds: (counter, key) -> words.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, words", PHILOX_KAT)
def test_philox_matches_the_known_answers_in_torch_and_in_the_shared_header(counter, key, words):
    c = [torch.tensor([v], dtype=torch.int64) for v in counter]
    assert tuple(int(w) for w in philox4x32_10_reference(*c, *key)) == words
    module = pytest.importorskip("repcap_fast._C")
    assert module._philox4x32_10(*counter, *key) == words


def test_the_shared_header_draws_the_reference_normals():
    module = pytest.importorskip("repcap_fast._C")
    seed, basis = 2**40 + 17, 2**33 + 5
    ref = grassmann_normals_reference(1, 1, 4 * 6, seed, first_basis=basis).flatten()
    for group in range(6):
        got = torch.tensor(module._normal_group(seed, basis, group), dtype=torch.float64)
        torch.testing.assert_close(got, ref[4 * group : 4 * group + 4], rtol=4e-16, atol=4e-16)


SHAPES = [(1, 1, 1), (3, 5, 3), (2, 7, 5), (4, 64, 9), (2, 3, 1)]


@pytest.mark.parametrize("device, backend", device_backends())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("seed, first_basis", [(0, 0), (1, 3), (12345678901, 2**35), (2**63 - 1, 7)])
def test_every_backend_draws_the_reference(device, backend, shape, seed, first_basis):
    n, d, k = shape
    ref = grassmann_normals_reference(n, d, k, seed, first_basis)  # on the CPU
    got = grassmann_normals(n, d, k, seed, first_basis=first_basis, device=device, backend=backend)
    assert got.shape == (n, d, k) and got.dtype == torch.float64 and got.device.type == device
    got = got.cpu()
    # the words are equal; log, cos and sin may round differently by an ulp or two
    torch.testing.assert_close(got, ref, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("device, backend", device_backends())
def test_a_normal_depends_on_seed_basis_and_element_only(device, backend):
    def draw(n, d, k, seed=9, first_basis=0):
        return grassmann_normals(n, d, k, seed, first_basis=first_basis, device=device, backend=backend)

    whole = draw(10, 6, 5)
    assert torch.equal(draw(3, 6, 5, first_basis=4), whole[4:7])
    assert torch.equal(draw(1, 6, 5, first_basis=9), whole[9:])
    assert not torch.equal(draw(10, 6, 5, seed=10), whole)
    # the d·k normals of a basis are its first d·k normals, whatever the shape
    flat = draw(2, 30, 1).reshape(2, 30)
    assert torch.equal(flat, whole.reshape(10, 30)[:2])


def test_the_normals_are_standard_normal():
    x = grassmann_normals(64, 128, 32, seed=3).flatten()  # 262,144 draws
    n = x.numel()
    assert abs(float(x.mean())) < 5 / math.sqrt(n)
    assert abs(float(x.var()) - 1.0) < 5 * math.sqrt(2 / n)
    for q, z in ((0.025, -1.959964), (0.5, 0.0), (0.975, 1.959964)):
        assert abs(float(torch.quantile(x[:100_000], q)) - z) < 0.02
    # neighbours within a group of four, and across bases, are uncorrelated
    pairs = x.reshape(-1, 4)
    for i, j in ((0, 1), (0, 2), (1, 3)):
        assert abs(float((pairs[:, i] * pairs[:, j]).mean())) < 5 / math.sqrt(pairs.shape[0])


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 0}, "n must be >= 1"),
    ({"d": 2.5}, "d must be an integer"),
    ({"k": True}, "k must be an integer, got a bool"),
    ({"seed": -1}, "seed"),
    ({"first_basis": -2}, "first_basis must be >= 0"),
    ({"first_basis": 2**63 - 2, "n": 5}, "first_basis \\+ n must be"),
    ({"backend": "metal"}, "backend must be one of"),
])
def test_bad_arguments_name_themselves(kwargs, message):
    args = {"n": 2, "d": 3, "k": 2, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        grassmann_normals(args.pop("n"), args.pop("d"), args.pop("k"), args.pop("seed"), **args)


@pytest.mark.parametrize("device, backend", device_backends())
def test_grassmann_bases_are_the_orthonormalized_normals_on_every_backend(device, backend):
    bases = pga.grassmann_bases(40, 6, 5, seed=4, device=device, backend=backend).cpu()
    q, r = torch.linalg.qr(grassmann_normals_reference(5, 40, 6, 4))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[..., None, :]
    torch.testing.assert_close(bases, q, rtol=0, atol=1e-13)


def test_grassmann_bases_in_batches_equal_one_draw(monkeypatch):
    whole = pga.grassmann_bases(16, 4, 9, seed=2)
    monkeypatch.setattr(geometry, "_CHUNK_BYTES", 8 * 16 * 4 * 2)  # two bases per batch
    assert torch.equal(pga.grassmann_bases(16, 4, 9, seed=2), whole)
