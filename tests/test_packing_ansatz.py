"""The ansätze of the equiangular-frame search (``repcap_fast.packing.ansatz``): their orbits on the pairs,
their sizes, the change of F of every orbit flip, and the portfolio."""

import itertools

import numpy as np
import pytest
import torch

from repcap_fast.packing import ansatz
from repcap_fast.packing.ansatz import Ansatz, _Orbits


def _brute_orbits(k, generators):
    """The orbits of the pairs by closing each pair under the generators (a set per orbit)."""
    seen, orbits = set(), []
    for pair in itertools.combinations(range(k), 2):
        if pair in seen:
            continue
        orbit, todo = {pair}, [pair]
        while todo:
            i, j = todo.pop()
            for g in generators:
                image = tuple(sorted((int(g[i]), int(g[j]))))
                if image not in orbit:
                    orbit.add(image)
                    todo.append(image)
        seen |= orbit
        orbits.append(orbit)
    return orbits


CASES = [Ansatz(36, "cycles", 7), Ansatz(30, "cycles", 5), Ansatz(10, "cycles", 1), Ansatz(12, "cycles", 3),
         Ansatz(9, "cycles", 2), Ansatz(36, "cycles", 5, t=2), Ansatz(23, "cycles", 7, t=3),
         Ansatz(26, "affine", 5, 2, 4), Ansatz(18, "affine", 17, 1, 8), Ansatz(16, "affine", 2, 4),
         Ansatz(28, "affine", 3, 3, 2), Ansatz(50, "affine", 7, 2, 3), Ansatz(28, "unital", 3),
         Ansatz(28, "unital", 3, 1, 8),
         Ansatz(126, "unital", 5, 1, 24), Ansatz(126, "unital", 5, 1, 3)]


@pytest.mark.parametrize("a", CASES, ids=lambda a: f"{a.k}:{a.name}")
def test_the_labels_are_the_orbits_of_the_pairs_under_the_group(a):
    labels, n = a.orbits()
    k = a.k
    assert (labels == labels.T).all() and (np.diag(labels) == -1).all()
    assert sorted(set(labels[labels >= 0].tolist())) == list(range(n))
    orbits = _brute_orbits(k, a.generators())
    assert len(orbits) == n == a.size()
    for orbit in orbits:
        assert len({int(labels[i, j]) for i, j in orbit}) == 1, (a, sorted(orbit))
    first = [min(o) for o in orbits]  # numbered by first pair in row-major order
    assert [int(labels[i, j]) for i, j in sorted(first)] == list(range(n))


@pytest.mark.parametrize("a", CASES, ids=lambda a: f"{a.k}:{a.name}")
def test_the_generators_are_permutations_of_the_lines(a):
    for g in a.generators():
        assert sorted(g.tolist()) == list(range(a.k))


def test_the_size_formula_of_the_cycles_counts_the_orbits():
    for k in range(2, 40):
        for p in [1] + ansatz.primes(k):
            a = Ansatz(k, "cycles", p)
            assert a.size() == ansatz.pair_orbits(k, a.generators())[1], (k, p)
    assert ansatz.symmetry_orbits(10, 1)[1] == 45


def test_the_paley_groups_have_few_orbits():
    # x ↦ sx + v, s a square: 3 orbits of the pairs of Z_q ∪ {∞} for prime q ≡ 1 mod 4, 1 + (q − 1)/(p − 1)
    # for q = p² (the module docstring)
    assert Ansatz(38, "affine", 37, 1, 18).size() == 3
    assert Ansatz(62, "affine", 61, 1, 30).size() == 3
    assert Ansatz(50, "affine", 7, 2, 3).size() == 9  # multipliers of order 3 of Z_7 only: 1 + 48/6 = 9
    assert Ansatz(26, "affine", 5, 2, 4).size() == 7  # q = 25: 1 + 24/4
    # the unital's point stabilizer: H alone has (q³ − 1)/2 orbits on its pairs (by h⁻¹h' up to inverse), + 1
    assert Ansatz(126, "unital", 5).size() == 63 and Ansatz(28, "unital", 3).size() == 14
    assert Ansatz(126, "unital", 5, 1, 24).size() == 5


def test_the_unital_group_is_the_sylow_subgroup_and_its_torus():
    q = 5
    left_a, left_w, torus = Ansatz(126, "unital", q, 1, 24).generators()
    order = lambda g: next(n for n in range(1, 200) if (np.linalg.matrix_power(np.eye(126, dtype=int)[g], n)
                                                          == np.eye(126, dtype=int)).all())
    assert order(left_a) == order(left_w) == q and order(torus) == 24  # exponent q; λ of order q² − 1
    assert not np.array_equal(left_a[left_w], left_w[left_a])  # H is not abelian
    assert all(g[125] == 125 for g in (left_a, left_w, torus))  # ∞ fixed


def test_prime_powers_and_units():
    assert [ansatz.prime_power(q) for q in (2, 9, 25, 49, 125, 12, 1, 37)] == [
        (2, 1), (3, 2), (5, 2), (7, 2), (5, 3), (0, 0), (0, 0), (37, 1)]
    for p in (3, 5, 7, 13, 37):
        for t in (t for t in range(1, p) if (p - 1) % t == 0):
            r = ansatz._unit_of_order(p, t)
            assert pow(r, t, p) == 1 and all(pow(r, s, p) != 1 for s in range(1, t)), (p, t, r)


@pytest.mark.parametrize("a", [Ansatz(10, "cycles", 1), Ansatz(10, "cycles", 3), Ansatz(16, "cycles", 3),
                               Ansatz(26, "cycles", 13), Ansatz(27, "cycles", 13), Ansatz(38, "cycles", 37),
                               Ansatz(36, "cycles", 5), Ansatz(12, "cycles", 11), Ansatz(21, "cycles", 7),
                               Ansatz(36, "cycles", 5, t=2), Ansatz(26, "affine", 5, 2, 2),
                               Ansatz(28, "affine", 3, 3, 1)], ids=lambda a: f"{a.k}:{a.name}")
def test_the_change_of_f_of_every_flip_is_exact(a):
    """_Orbits.deltas (O(m·k) a flip) against forming every flipped S² (the dense evaluation)."""
    k = a.k
    rng = np.random.default_rng(k * 100 + a.p + a.t)
    orbits = _Orbits(*a.orbits())
    x = torch.from_numpy(rng.choice([-1.0, 1.0], orbits.n))
    S = orbits.signs(x)
    assert torch.equal(S, S.T) and torch.all(S.diagonal() == 0) and torch.all(S.abs() + torch.eye(k) == 1)
    a_, b_ = int(rng.integers(-5, 6)), int(rng.integers(1, 30))
    M = S @ S - a_ * S - b_ * torch.eye(k, dtype=torch.float64)
    F = float((M * M).sum())
    fast = F + orbits.deltas(S, M, x, a_).numpy()
    dense = []
    for o in range(orbits.n):
        T = orbits.flip(S, x, o)
        Mo = T @ T - a_ * T - b_ * torch.eye(k, dtype=torch.float64)
        dense.append(float((Mo * Mo).sum()))
    assert fast.tolist() == dense


def test_the_portfolio():
    names = [a.name for a in ansatz.portfolio(36)]
    # up to 64 lines: no symmetry, then the primes in increasing order, p ≥ 5 in ≥ 2 cycles also with x ↦ −x
    assert names[:5] == ["no symmetry", "18 2-cycles", "12 3-cycles", "7 5-cycles",
                         "7 5-cycles and multipliers of order 2"]
    assert "1 31-cycles and multipliers of order 2" not in names  # one cycle: the same orbits as without
    cycles = [a.p for a in ansatz.portfolio(126) if a.kind == "cycles" and a.t == 1]
    assert cycles[:4] == [7, 3, 2, 1]  # above 64 lines: the cycles without fixed points first (126 = 2·3²·7)
    assert [a.p for a in ansatz.portfolio(128) if a.t == 1][:3] == [2, 127, 1]  # then the Paley cycle (127)
    assert sorted(cycles) == sorted([1] + ansatz.primes(126))
    affine = [a for a in ansatz.portfolio(126) if a.kind == "affine"]  # 125 = 5³, + 1 fixed line
    assert affine and all((a.p, a.e) == (5, 3) for a in affine) and [a.t for a in affine] == sorted(
        [a.t for a in affine], key=lambda t: Ansatz(126, "affine", 5, 3, t).size())
    unital = [a.t for a in ansatz.portfolio(126) if a.kind == "unital"]  # 126 = 5³ + 1: every t | 24
    assert sorted(unital) == [1, 2, 3, 4, 6, 8, 12, 24] and not [a for a in ansatz.portfolio(65) if a.kind == "unital"]
    labels = [a.orbits()[0].tobytes() for a in ansatz.portfolio(50)]
    assert len(set(labels)) == len(labels)  # no ansatz twice


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind must be one of .*got 'cycle'"):
        Ansatz(10, "cycle", 3)
