"""Monotone fits of measured step times: what the calibrated cost model interpolates.

Each operation (and each q) is modelled as two additive, monotone terms and no hidden third::

    T(tokens, bytes) = W(tokens) + K(bytes)

- ``W``: weight-bound work and per-step overhead, a function of the tokens in the batch
  (``batch · q``), monotone non-decreasing, piecewise linear between measured token counts;
- ``K``: KV-bound work, a function of the KV bytes the step attends to (summed per sequence, so
  ragged batches are costed exactly), monotone non-decreasing, piecewise linear, ``K(0) = 0``.

Both are fitted by backfitting with isotonic (pool-adjacent-violators) regression
(:func:`fit_terms`). Beside them each fit carries a roofline, ``T = c₀ + c₁·tokens +
c₂·bytes`` by non-negative least squares on the same points, for shapes outside the measured
ranges, where the curves would extrapolate. :class:`MeasuredGrid` interpolates one op's medians on its
measured (batch, context) grid itself, and says None outside it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.costs.calibration_file import Measurement
from specsim.errors import SpecsimError


def isotonic(y: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    y = np.asarray(y, float)
    w = np.ones_like(y) if w is None else np.asarray(w, float)
    values, weights, sizes = [], [], []
    for yi, wi in zip(y, w):
        values.append(yi)
        weights.append(wi)
        sizes.append(1)
        while len(values) > 1 and values[-2] > values[-1]:
            wsum = weights[-2] + weights[-1]
            merged = (values[-2] * weights[-2] + values[-1] * weights[-1]) / wsum
            values[-2:] = [merged]
            weights[-2:] = [wsum]
            sizes[-2:] = [sizes[-2] + sizes[-1]]
    return np.repeat(values, sizes)


@dataclass
class MonotoneCurve:
    """Piecewise-linear non-decreasing function through (x, y) knots."""

    x: np.ndarray
    y: np.ndarray

    def __call__(self, x) -> np.ndarray:
        return np.interp(x, self.x, self.y)

    def covers(self, x) -> np.ndarray:
        x = np.asarray(x, float)
        return (x >= self.x[0] * (1 - 1e-9)) & (x <= self.x[-1] * (1 + 1e-9))


def _curve(x: np.ndarray, y: np.ndarray, anchor_zero: bool) -> MonotoneCurve:
    """Average y per distinct x, isotonic over x (weights = points per x)."""
    xs, inverse = np.unique(x, return_inverse=True)
    sums = np.bincount(inverse, weights=y)
    counts = np.bincount(inverse)
    means = sums / counts
    if anchor_zero:
        xs = np.concatenate([[0.0], xs])
        means = np.concatenate([[0.0], means])
        counts = np.concatenate([[1e6], counts])   # K(0) = 0 held firmly
    fitted = isotonic(means, counts)
    if anchor_zero:
        fitted = np.maximum(fitted, 0.0)
    return MonotoneCurve(xs.astype(float), fitted)


@dataclass
class TermFit:
    """``T = W(tokens) + K(bytes)`` for one operation (and q), with its roofline fallback."""

    W: MonotoneCurve
    K: MonotoneCurve
    roofline: np.ndarray          # c0, c1 (per token), c2 (per byte)
    points: int

    def predict(self, tokens, kv_bytes) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, inside the measured ranges?)"""
        tokens, kv_bytes = np.asarray(tokens, float), np.asarray(kv_bytes, float)
        inside = self.W.covers(tokens) & (kv_bytes <= self.K.x[-1] * (1 + 1e-9))
        interp = self.W(tokens) + self.K(kv_bytes)
        c0, c1, c2 = self.roofline
        fallback = c0 + c1 * tokens + c2 * kv_bytes
        return np.where(inside, interp, fallback), inside


def fit_terms(tokens, kv_bytes, seconds, iterations: int = 30) -> TermFit:
    """Backfit the two monotone terms, then the roofline fallback on the same points."""
    from scipy.optimize import nnls

    tokens, kv_bytes, seconds = (np.asarray(a, float) for a in (tokens, kv_bytes, seconds))
    if seconds.size < 2:
        raise SpecsimError("a calibrated term needs at least 2 measurements")
    W = _curve(tokens, np.full_like(seconds, seconds.min()), anchor_zero=False)
    K = _curve(kv_bytes, np.zeros_like(seconds), anchor_zero=True)
    for _ in range(iterations):
        K = _curve(kv_bytes, seconds - W(tokens), anchor_zero=True)
        W = _curve(tokens, seconds - K(kv_bytes), anchor_zero=False)
    A = np.stack([np.ones_like(tokens), tokens, kv_bytes], axis=1)
    scale = np.maximum(A.max(0), 1e-30)
    coef, _ = nnls(A / scale, seconds)
    return TermFit(W, K, coef / scale, int(seconds.size))


@dataclass
class MeasuredGrid:
    """Seconds of one (op, q, s) series on its measured (batch, context) points: per batch a
    non-decreasing piecewise-linear function of the context (isotonic through the medians),
    linear in the batch between the two measured batches around it."""

    by_batch: dict[int, MonotoneCurve]

    @classmethod
    def of(cls, rows: list[Measurement]) -> "MeasuredGrid":
        series: dict[int, list[Measurement]] = {}
        for m in rows:
            series.setdefault(m.batch, []).append(m)
        curves = {}
        for batch, ms in series.items():
            ms = sorted(ms, key=lambda m: m.context)
            x = np.array([m.context for m in ms], float)
            if np.unique(x).size == x.size:
                curves[batch] = MonotoneCurve(x, isotonic([m.median_ms / 1e3 for m in ms]))
        return cls(curves)

    def _at(self, batch: int, context: float) -> float | None:
        curve = self.by_batch[batch]
        if not curve.x[0] <= context <= curve.x[-1]:
            return None
        return float(np.interp(context, curve.x, curve.y))

    def __call__(self, batch: int, context: float) -> float | None:
        """Seconds at (batch, context), or None outside the measured grid."""
        batches = sorted(self.by_batch)
        if not batches or not batches[0] <= batch <= batches[-1]:
            return None
        lo = max(b for b in batches if b <= batch)
        hi = min(b for b in batches if b >= batch)
        t_lo, t_hi = self._at(lo, context), self._at(hi, context)
        if t_lo is None or t_hi is None:
            return None
        return t_lo if hi == lo else t_lo + (t_hi - t_lo) * (batch - lo) / (hi - lo)


def strictly_between(values, x) -> tuple | None:
    """The nearest measured values strictly below and strictly above ``x`` (None entries and
    an ``x`` of None ignored), or None when ``x`` is not inside them."""
    values = sorted(v for v in set(values) if v is not None)
    below = [v for v in values if x is not None and v < x]
    above = [v for v in values if x is not None and v > x]
    return (below[-1], above[0]) if below and above else None


def bracket(xs: list[int], x: float, extrapolate: bool = False) -> tuple[int, int]:
    """The measured points (sorted ``xs``) to interpolate ``x`` between: its neighbours; beyond
    the ends the nearest end twice (held), or with ``extrapolate`` the two end points."""
    lo = max([v for v in xs if v <= x] or [xs[0]])
    hi = min([v for v in xs if v >= x] or [xs[-1]])
    if extrapolate and lo == hi and len(xs) > 1 and not xs[0] < x < xs[-1] and x != lo:
        lo, hi = (xs[0], xs[1]) if x < xs[0] else (xs[-2], xs[-1])
    return lo, hi


def interpolate(value, lo: int, hi: int, x: float) -> float:
    """``value`` linear in x through lo and hi (``value(lo)`` when they coincide)."""
    a = value(lo)
    return a if lo == hi else a + (value(hi) - a) * (x - lo) / (hi - lo)
