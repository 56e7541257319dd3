"""Terms of the operator cost model fitted on other models' end-to-end calibrations.

An operator table prices each kernel alone; a model's step is more than the sum (the gaps
between different kernels in one graph, the engine's small copies and casts, work the
composition models coarsely, such as Quest's page bounds on every K write), and the decoding
loop adds host work per step and per iteration that no operator holds. Both are fitted here on
the calibrations of *other* models measured on the same GPU, so a model is never priced with
terms fitted on its own measurements (a leave-one-model-out fit whenever it is calibrated
itself):

- **composition residuals**, one per step family (``plain``, ``draft:<policy>``,
  ``verify:<policy>``, ``selection:<policy>``), in the form :data:`FORMS` gives it: a factor
  on the composed time (``scale``; the median over the other models' points of measured over
  composed), or seconds per layer added (``per_layer``; the least-squares fit of
  measured − composed over the layer count, each point's miss relative to its measured
  time). The forms were chosen by leave-one-model-out error
  on the H200's four calibrations: a verify pass misses by a near-constant 13–22 µs per layer on
  models from 135M to 8B parameters, a plain or draft step by a near-constant fraction;
- **loop overheads**: the decoding loop's per-step (``overhead:plain``) and per-iteration
  (``overhead:speculative:<policy>``) host time, linear in the batch (and in q = k + 1 for an
  iteration), by relative least squares over the other models' points, never below zero.

A family with fewer than :data:`MIN_POINTS` points among the other models has no term, and the
cost model says so.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: How each step family's composition residual is fitted.
FORMS = {"plain": "scale", "draft": "scale", "verify": "per_layer", "selection": "scale"}
#: Fewest points a term is fitted from.
MIN_POINTS = 3


@dataclass(frozen=True)
class FittedTerms:
    """Residuals and loop overheads fitted on the calibrations of ``models``."""

    models: tuple[str, ...]
    scale: dict[str, float] = field(default_factory=dict)        # family → factor
    per_layer_s: dict[str, float] = field(default_factory=dict)  # family → seconds per layer
    overhead: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # overhead: "plain" → (a, per batch) seconds; "speculative:<policy>" → (a, per batch, per q)
    skipped: tuple[str, ...] = ()   # calibrations not used, with why

    @property
    def source(self) -> str:
        return f"fitted on the calibrations of {', '.join(self.models)}"

    def residual(self, family: str, seconds: float, layers: int) -> tuple[float, str | None]:
        """``seconds`` composed for ``family`` corrected by its residual, with what was done."""
        if family in self.scale:
            f = self.scale[family]
            return seconds * f, f"{family}: composition residual x{f:.3f} ({self.source})"
        if family in self.per_layer_s:
            b = self.per_layer_s[family]
            return (seconds + b * layers,
                    f"{family}: composition residual {b * 1e6:+.1f} us per layer ({self.source})")
        return seconds, None

    def loop_overhead(self, kind: str, batch: int, q: int = 1) -> float | None:
        """Seconds of loop overhead (``plain`` per step, ``speculative:<policy>`` per
        iteration) at this batch and q, or None where it was not fitted."""
        beta = self.overhead.get(kind)
        if beta is None:
            return None
        x = (1.0, float(batch), float(q))[:len(beta)]
        return max(0.0, float(np.dot(beta, x)))


def family_of(op: str) -> str:
    """A calibration op's residual family: the shared ``verify`` is Vegas' engine's."""
    return "verify:vegas" if op == "verify" else op


def relative_lstsq(x: np.ndarray, y: np.ndarray, relative_to: np.ndarray | None = None
                    ) -> np.ndarray:
    """β minimising Σ ((y − xβ) / r)², r = ``relative_to`` (default y): each point's miss
    relative to the time it prices."""
    r = y if relative_to is None else relative_to
    w = 1.0 / np.maximum(np.abs(r), 1e-12)
    return np.linalg.lstsq(x * w[:, None], y * w, rcond=None)[0]


def fit_terms(table, others, hardware) -> FittedTerms:
    """Fit on ``others``, a list of (ModelSpec, Calibration) measured on the table's GPU: each
    composed from ``table`` without fitted terms and compared with its measured steps."""
    return fit_rows([_rows(table, spec, calibration, hardware) for spec, calibration in others])


def _rows(table, spec, calibration, hardware) -> tuple:
    """What one calibration contributes to a fit: (model name, {family: [(measured s,
    composed s, layers)]}, {overhead kind: [(measured s, batch, q)]})."""
    from specsim.costs.composition import composition_error
    from specsim.costs.operators import OperatorCostModel

    composed = OperatorCostModel.as_calibrated(table, spec, hardware, calibration)
    report = composition_error(calibration, composed, residual=False)
    points: dict[str, list[tuple[float, float, int]]] = {}
    for row in report["points"]:
        if row["op"] == "prefill":      # priced without a fitted residual
            continue
        points.setdefault(family_of(row["op"]), []).append(
            (row["measured_ms"] / 1e3, row["composed_ms"] / 1e3, spec.num_layers))
    overheads: dict[str, list[tuple[float, int, int]]] = {}
    for m in calibration.measurements:
        if m.op.startswith("overhead:"):
            overheads.setdefault(m.op.split(":", 1)[1], []).append(
                (m.median_ms / 1e3, m.batch, m.q))
    return spec.name, points, overheads


def fit_rows(contributions: list[tuple]) -> FittedTerms:
    """The terms fitted on the calibrations' contributions (:func:`_rows`), pooled."""
    points: dict[str, list] = {}
    overheads: dict[str, list] = {}
    for _, p, o in contributions:
        for family, rows in p.items():
            points.setdefault(family, []).extend(rows)
        for kind, rows in o.items():
            overheads.setdefault(kind, []).extend(rows)
    scale, per_layer = {}, {}
    for family, rows in points.items():
        if len(rows) < MIN_POINTS:
            continue
        measured, composed, layers = (np.array(c, float) for c in zip(*rows))
        if FORMS[family.split(":")[0]] == "scale":
            scale[family] = float(np.median(measured / composed))
        else:
            per_layer[family] = float(relative_lstsq(layers[:, None], measured - composed,
                                                      relative_to=measured)[0])
    fitted_overhead = {}
    for kind, rows in overheads.items():
        if len(rows) < MIN_POINTS:
            continue
        y, batch, q = (np.array(c, float) for c in zip(*rows))
        x = np.stack([np.ones_like(y), batch] + ([q] if kind != "plain" else []), axis=1)
        fitted_overhead[kind] = tuple(float(b) for b in relative_lstsq(x, y))
    return FittedTerms(tuple(c[0] for c in contributions), scale, per_layer, fitted_overhead)


def calibrations_on(hardware_key: str) -> list[Path]:
    """The calibrations in the catalogue for ``hardware_key`` (user's first, each name once)."""
    from specsim.shipped import catalog_file, catalog_names
    return [catalog_file(f"calibrations/{hardware_key}/{name}")
            for name in catalog_names(f"calibrations/{hardware_key}", "*.json")]


def fitted_for(table, model, hardware) -> FittedTerms | None:
    """Terms for ``model`` fitted on the catalogue's calibrations of every *other* model on
    ``hardware`` (the table's GPU), or None where there are none."""
    key = hardware.key
    if not key:
        return None
    paths = [p for p in calibrations_on(key) if p.stem != model.name]
    if not paths:
        return None
    stamp = tuple((str(p), os.path.getmtime(p)) for p in paths)
    if getattr(table, "path", None) is None:      # a table built in memory: fitted afresh
        return _fit(stamp, lambda path: _rows_of(table, path, hardware))
    table_stamp = (str(table.path), os.path.getmtime(table.path))
    return _cached_fit(table_stamp, stamp, hardware.key, _Holder(table, hardware))


class _Holder:
    """Carries the table and hardware past the cache's key, which the table file's and the
    hardware's stamps identify (every holder compares equal)."""

    def __init__(self, table, hardware):
        self.table, self.hardware = table, hardware

    def __hash__(self):
        return 0

    def __eq__(self, other):
        return isinstance(other, _Holder)


def _fit(stamp, rows_of) -> FittedTerms | None:
    """The terms fitted on the calibrations of ``stamp`` ((path, mtime) each), ``rows_of(path)``
    giving each one's contribution; one that cannot be read is skipped and named."""
    from specsim.errors import SpecsimError

    contributions, skipped = [], []
    for path, _ in stamp:
        try:
            contributions.append(rows_of(path))
        except SpecsimError as why:       # a file or model the catalogue cannot read: not used
            skipped.append(f"{Path(path).name}: {why}")
    if not contributions:
        return None
    return dataclasses.replace(fit_rows(contributions), skipped=tuple(skipped))


@functools.lru_cache(maxsize=16)
def _cached_fit(table_stamp, stamp, hardware_key, holder) -> FittedTerms | None:
    mtimes = dict(stamp)
    return _fit(stamp, lambda path: _cached_rows(table_stamp, path, mtimes[path],
                                                 hardware_key, holder))


@functools.lru_cache(maxsize=64)
def _cached_rows(table_stamp, path, mtime, hardware_key, holder) -> tuple:
    """One calibration's contribution, composed once per table file and calibration file (a
    process that prices several models fits each on the others' cached rows)."""
    return _rows_of(holder.table, path, holder.hardware)


def _rows_of(table, path, hardware) -> tuple:
    """:func:`_rows` of the calibration in ``path``, for the catalogue model it names."""
    from specsim.costs.calibration_file import read_calibration
    from specsim.specs import load_model

    calibration = read_calibration(path)
    name = calibration.provenance.get("model") or Path(path).stem
    return _rows(table, load_model(name), calibration, hardware)


__all__ = ["FORMS", "FittedTerms", "family_of", "fit_rows", "fit_terms", "fitted_for"]
