import math

import numpy as np
import pytest

from repcap_fast import capacity as cap


def test_reference_values_llama2_7b():
    assert cap.full_capacity(4096, 0.0645) == pytest.approx(3.99e7, rel=2e-3)
    assert cap.jl_capacity(4096, 0.0645) == pytest.approx(8.4, rel=5e-3)
    assert cap.jl_capacity(4096, 0.0645, C=cap.JL_C_FITTED) == pytest.approx(277, rel=5e-3)
    assert cap.adjusted_capacity(4096, 0.0645) == pytest.approx(4096 * math.exp(4096 * 0.0645**2 / 1.293))


def test_full_form_inverts():
    d = np.array([64, 768, 4096, 8192])
    eps = np.array([0.3, 0.12, 0.0645, 0.05])
    k = cap.full_capacity(d, eps)
    assert np.allclose(cap.full_epsilon(k, d), eps, rtol=1e-10)


def test_vectorized_and_log_space():
    d = np.array([[512], [4096]])
    eps = np.array([0.05, 0.1, 0.2])
    k = cap.full_capacity(d, eps)
    assert k.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            assert k[i, j] == pytest.approx(cap.full_capacity(int(d[i, 0]), float(eps[j])))
    # Past float64: the log form stays finite, the plain form says inf.
    assert math.isinf(cap.adjusted_capacity(8192, 0.5))
    assert cap.log_adjusted_capacity(8192, 0.5) == pytest.approx(math.log(8192) + 8192 * 0.25 / 1.293)
    assert cap.jl_capacity(16384, 0.2) > 1e15


def test_model_class():
    assert cap.model_class(0.25) == 1
    assert cap.model_class(0.05) == 2
    assert cap.model_class(0.15) == "borderline"
    assert cap.model_class(0.2) == "borderline" and cap.model_class(0.1) == "borderline"
    assert list(cap.model_class([0.3, 0.01])) == [1, 2]


def test_welch_bound_equiangular_lines():
    # The 6 diagonals of the icosahedron: |c| = 1/√5 exactly, meeting the Welch bound.
    assert cap.welch_bound(6, 3) == pytest.approx(1 / math.sqrt(5))
    assert cap.welch_bound(3, 3) == 0.0  # k ≤ d: orthogonal is possible
    assert cap.welch_bound(100, 10) == pytest.approx(math.sqrt(90 / (10 * 99)))
    # Order 2 is sharper for large k.
    assert cap.welch_bound(10**6, 10, order=2) > cap.welch_bound(10**6, 10, order=1)
    with pytest.raises(ValueError):
        cap.welch_bound(1, 3)
    with pytest.raises(ValueError):
        cap.welch_bound(10, 3, order=1.5)


def test_orthoplex_and_floor():
    assert cap.orthoplex_bound(7, 3) == pytest.approx(1 / math.sqrt(3))
    assert cap.orthoplex_bound(6, 3) == 0.0
    floor = cap.coherence_floor(10**5, 64)
    assert floor >= cap.welch_bound(10**5, 64) and floor >= cap.orthoplex_bound(10**5, 64)


def test_levenstein_bound_and_the_certificate():
    # Lines in the plane: the optimum of k lines is cos(π/k); Levenstein meets it at k = 4 and
    # stays below it after (a lower bound), and does not apply at k ≤ d(d+1)/2 = 3.
    assert cap.levenstein_bound(4, 2) == pytest.approx(math.cos(math.pi / 4), abs=1e-15)
    for k in range(5, 40):
        assert cap.orthoplex_bound(k, 2) < cap.levenstein_bound(k, 2) < math.cos(math.pi / k)
    assert cap.levenstein_bound(3, 2) == 0.0 and cap.levenstein_bound(6, 3) == 0.0
    # the formula, and its limit √(3/(d+2)) for many lines
    assert cap.levenstein_bound(100, 3) == pytest.approx(math.sqrt((300 - 9 - 6) / (5 * 97)))
    assert cap.levenstein_bound(10**12, 5) == pytest.approx(math.sqrt(3 / 7), rel=1e-9)
    np.testing.assert_allclose(cap.levenstein_bound(np.array([3, 4]), 2), [0.0, math.sqrt(0.5)])
    # the certificate: the largest bound, named
    assert cap.coherence_bound(16, 6) == (pytest.approx(1 / 3), "welch")
    assert cap.coherence_bound(7, 3) == (pytest.approx(1 / math.sqrt(3)), "orthoplex")
    assert cap.coherence_bound(100, 3)[1] == "levenstein"
    assert cap.coherence_bound(5, 5) == (0.0, "welch")  # k ≤ d: orthonormal vectors meet 0
    assert cap.coherence_bound(10**6, 10)[1] == "levenstein"  # above Welch of order 2 there
    assert cap.coherence_bound(10**6, 10)[0] > cap.welch_bound(10**6, 10, order=2)
    for k, d in ((16, 6), (7, 3), (100, 3), (10**6, 10), (50, 4)):  # the floor without Levenstein
        assert cap.coherence_bound(k, d)[0] == max(cap.coherence_floor(k, d), cap.levenstein_bound(k, d))
    with pytest.raises(ValueError, match="one k and one d"):
        cap.coherence_bound([10, 20], 3)
    with pytest.raises(ValueError, match="k must be"):
        cap.coherence_bound(1, 3)


def test_bad_arguments():
    with pytest.raises(ValueError, match="d must be"):
        cap.jl_capacity(0, 0.1)
    with pytest.raises(ValueError, match="eps must be"):
        cap.full_capacity(10, float("nan"))
    with pytest.raises(ValueError, match="C must be"):
        cap.jl_capacity(10, 0.1, C=0)


def test_capacity_table():
    t = cap.capacity_table(4096, 0.0645, vocab=32000)
    assert t["class"] == 2
    assert t["formulas"]["full"]["capacity"] == pytest.approx(3.99e7, rel=2e-3)
    assert 0 < t["welch_floor_vocab"] < 0.0645
