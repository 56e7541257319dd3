"""Monotone fits and measured grids: properties on random data, recovery of known structure."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.costs.calibration_file import Measurement
from specsim.costs.fitting import (MeasuredGrid, MonotoneCurve, bracket, fit_terms,
                                   interpolate, isotonic)

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
values = st.lists(finite, min_size=1, max_size=40)


def weighted_sse(fit, y, w):
    return float(np.sum(w * (np.asarray(fit) - np.asarray(y)) ** 2))


@given(values, st.data())
@settings(max_examples=200, deadline=None)
def test_isotonic_is_the_least_squares_non_decreasing_fit(y, data):
    """Non-decreasing, and no other non-decreasing sequence fits the data better (weighted
    squared error), whatever the weights; the weighted mean is kept."""
    w = np.array(data.draw(st.lists(st.floats(0.1, 10), min_size=len(y), max_size=len(y))))
    fit = isotonic(y, w)
    assert fit.shape == (len(y),)
    assert np.all(np.diff(fit) >= -1e-9)
    assert np.sum(w * fit) == pytest.approx(np.sum(w * np.asarray(y)), rel=1e-9, abs=1e-6)
    steps = data.draw(st.lists(st.floats(0, 100), min_size=len(y), max_size=len(y)))
    other = np.cumsum(steps) + data.draw(finite)               # any non-decreasing sequence
    best = weighted_sse(fit, y, w)
    # the sorted data and the weighted mean are non-decreasing candidates too
    for candidate in (other, np.sort(y), np.full(len(y), np.average(y, weights=w))):
        assert best <= weighted_sse(candidate, y, w) * (1 + 1e-9) + 1e-6


def min_max_fit(y, w):
    """The least-squares non-decreasing fit by its closed form: at i, the largest over j ≤ i
    of the smallest over k ≥ i of the weighted mean of y[j..k]."""
    y, w = np.asarray(y, float), np.asarray(w, float)
    n = len(y)
    mean = lambda j, k: np.sum(w[j:k + 1] * y[j:k + 1]) / np.sum(w[j:k + 1])  # noqa: E731
    return np.array([max(min(mean(j, k) for k in range(i, n)) for j in range(i + 1))
                     for i in range(n)])


@given(st.lists(finite, min_size=1, max_size=12), st.data())
@settings(max_examples=100, deadline=None)
def test_isotonic_equals_the_closed_form(y, data):
    w = data.draw(st.lists(st.floats(0.1, 10), min_size=len(y), max_size=len(y)))
    assert isotonic(y, w) == pytest.approx(min_max_fit(y, w), rel=1e-9, abs=1e-9)


@given(st.lists(finite, min_size=1, max_size=30))
def test_isotonic_leaves_non_decreasing_data_alone(y):
    y = np.sort(y)
    assert isotonic(y) == pytest.approx(y)


def test_additive_fit_recovers_both_terms():
    """T = 1 ms + 20 µs per token + bytes / 4 TB/s: both terms recovered, both monotone,
    K(0) = 0."""
    tokens, kv, t = [], [], []
    for b in (1, 2, 4, 8, 16, 32, 64, 128):
        for c in (1e8, 5e8, 1e9, 5e9, 1e10):
            tokens.append(b)
            kv.append(b * c)
            t.append(0.001 + 2e-5 * b + b * c / 4e12)
    fit = fit_terms(tokens, kv, t)
    pred, inside = fit.predict(tokens, kv)
    assert inside.all()
    assert np.max(np.abs(pred / np.array(t) - 1)) < 0.02
    assert np.all(np.diff(fit.K.y) >= 0) and np.all(np.diff(fit.W.y) >= 0)
    assert fit.K(0.0) == 0.0


@given(st.floats(1.01, 100), st.floats(1.01, 100))
@settings(max_examples=50, deadline=None)
def test_a_fit_never_extrapolates_its_curves(tokens_factor, bytes_factor):
    """Beyond the measured tokens or bytes the fit says it is outside and prices by its
    roofline line, not by holding or stretching the curves."""
    rng = np.random.default_rng(0)
    tokens = np.repeat([1.0, 2, 4, 8], 4)
    kv = np.tile([1e8, 1e9, 4e9, 1e10], 4) * tokens
    t = 0.002 + 1e-5 * tokens + kv / 3e12 + rng.normal(0, 1e-5, tokens.size)
    fit = fit_terms(tokens, kv, t)
    c0, c1, c2 = fit.roofline
    for x, b in ((tokens.max() * tokens_factor, kv.max() / 2),
                 (tokens.max() / 2, kv.max() * bytes_factor),
                 (tokens.min() / tokens_factor, kv.max() / 2)):
        seconds, inside = fit.predict(x, b)
        assert not inside
        assert seconds == pytest.approx(c0 + c1 * x + c2 * b)
    assert np.all(fit.roofline >= 0)                           # non-negative least squares
    _, inside = fit.predict(tokens, kv)
    assert inside.all()


def test_a_fit_needs_two_points():
    from specsim.errors import SpecsimError
    with pytest.raises(SpecsimError, match="at least 2"):
        fit_terms([1], [1e9], [0.01])


def test_monotone_curve_covers_only_its_knots():
    curve = MonotoneCurve(np.array([10.0, 20.0]), np.array([1.0, 3.0]))
    assert curve(15) == pytest.approx(2.0)
    assert curve.covers(np.array([10, 15, 20])).all()
    assert not curve.covers(np.array([9.9, 20.1])).any()


@given(st.lists(st.floats(0.01, 100), min_size=2, max_size=8), st.integers(1, 64))
def test_measured_grid_is_exact_at_measured_points_and_non_decreasing(medians, batch):
    """Per batch, the grid's curve goes through the isotonic fit of the medians: exact where
    they are already non-decreasing, non-decreasing in context everywhere, None beyond."""
    contexts = [1024 * 2 ** i for i in range(len(medians))]
    grid = MeasuredGrid.of([Measurement("plain", batch, c, 1, None, [y])
                            for c, y in zip(contexts, medians)])
    xs = np.linspace(contexts[0], contexts[-1], 50)
    got = np.array([grid(batch, x) for x in xs])
    assert np.all(np.diff(got) >= -1e-12)
    fitted = isotonic(np.array(medians) / 1e3)
    assert [grid(batch, c) for c in contexts] == pytest.approx(fitted)
    assert grid(batch, contexts[0] - 1) is None and grid(batch, contexts[-1] + 1) is None
    assert grid(batch + 1, contexts[0]) is None


def test_measured_grid_is_linear_between_contexts_and_batches():
    rows = [Measurement("selection:vegas", b, c, 1, 0.05, [b * 1.0 + c / 1024])
            for b in (2, 8) for c in (1024, 4096)]
    grid = MeasuredGrid.of(rows)
    assert grid(2, 2560) * 1e3 == pytest.approx(2 + 2.5)
    assert grid(5, 1024) * 1e3 == pytest.approx(5 + 1)
    assert grid(5, 2560) * 1e3 == pytest.approx(5 + 2.5)
    assert grid(1, 2048) is None and grid(9, 2048) is None


@given(st.lists(st.integers(1, 100), min_size=1, max_size=10, unique=True),
       st.floats(0, 120))
def test_bracket_returns_the_neighbours_or_holds_the_end(xs, x):
    xs = sorted(xs)
    lo, hi = bracket(xs, x)
    assert lo in xs and hi in xs and lo <= hi
    if xs[0] <= x <= xs[-1]:
        assert lo <= x <= hi
        assert not any(lo < v < hi for v in xs)
    else:
        assert lo == hi == (xs[0] if x < xs[0] else xs[-1])
    lo, hi = bracket(xs, x, extrapolate=True)
    if len(xs) > 1 and not xs[0] <= x <= xs[-1]:
        assert (lo, hi) == ((xs[0], xs[1]) if x < xs[0] else (xs[-2], xs[-1]))


def test_interpolate_is_linear_through_its_two_points():
    line = lambda x: 3.0 + 2.0 * x                     # noqa: E731
    assert interpolate(line, 2, 6, 5) == pytest.approx(line(5))
    assert interpolate(line, 2, 6, 9) == pytest.approx(line(9))
    assert interpolate(line, 4, 4, 9) == line(4)
