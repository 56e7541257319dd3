"""Calibrated cost model: measured step times, decomposed and interpolated.

A calibration file (written by ``specsim calibrate --gpu``) holds, per operation — ``plain``
(one decode step), ``verify`` (one verify pass of q query tokens), ``draft:<policy>`` (one sparse
draft step), ``selection:<policy>`` — raw timing samples at grid points (batch, context, q, s),
with medians and spread, plus provenance (GPU, driver, CUDA, torch, triton, kernel
configuration hash, model spec hash, date).

Each operation (and each q) is modelled as two additive, monotone terms and no hidden third::

    T(tokens, bytes) = W(tokens) + K(bytes)

- ``W``: weight-bound work and per-step overhead, a function of the tokens in the batch
  (``batch · q``), monotone non-decreasing, piecewise linear between measured token counts;
- ``K``: KV-bound work, a function of the KV bytes the step attends to (summed per sequence, so
  ragged batches are costed exactly), monotone non-decreasing, piecewise linear, ``K(0) = 0``.

Both are fitted by backfitting with isotonic (pool-adjacent-violators) regression. Inside the
measured ranges the model interpolates; outside them it never extrapolates silently: it falls
back to a roofline ``T = c₀ + c₁·tokens + c₂·bytes`` fitted (non-negative least squares) to the
same measurements, and every :class:`~specsim.costs.base.Cost` it returns says so in ``notes``.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from specsim.atomic import atomic_writer, read_json
from specsim.costs.base import Cost, IterationCost, as_contexts, compose_iteration
from specsim.costs.roofline import RooflineCostModel
from specsim.errors import SpecsimError
from specsim.policies import SPARSESPEC_WINDOW, get_policy, resolve_ranking
from specsim.specs import FULL_ATTENTION, HardwareSpec, ModelSpec

FORMAT_KEY = "specsim_calibration"
VERSION = 1
#: Measured loop overheads: per plain step, per speculative iteration.
OVERHEAD_OPS = ("overhead:plain", "overhead:speculative")
PROVENANCE_FIELDS = ("gpu", "gpu_memory_bytes", "driver", "cuda", "torch", "triton",
                     "kernel_config_hash", "model_spec_hash", "model", "date")


# --------------------------------------------------------------------------------------------
# isotonic regression and the additive fit
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# the calibration file
# --------------------------------------------------------------------------------------------


@dataclass
class Measurement:
    op: str                 # plain | verify | verify:<policy> | draft:<policy> | selection:<policy>
    batch: int
    context: int
    q: int = 1
    s: float | None = None
    samples_ms: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    def to_json(self) -> dict:
        x = np.asarray(self.samples_ms, float)
        return {"op": self.op, "batch": self.batch, "context": self.context, "q": self.q,
                "s": self.s, "median_ms": float(np.median(x)),
                "p10_ms": float(np.percentile(x, 10)), "p90_ms": float(np.percentile(x, 90)),
                "samples_ms": [round(float(v), 6) for v in x]}


@dataclass
class Calibration:
    provenance: dict
    ceilings: dict
    measurements: list[Measurement]
    path: str | None = None

    def ops(self) -> list[str]:
        return sorted({m.op for m in self.measurements})

    def to_json(self) -> dict:
        return {FORMAT_KEY: VERSION, "provenance": self.provenance, "ceilings": self.ceilings,
                "measurements": [m.to_json() for m in self.measurements]}

    def write(self, path: str) -> None:
        with atomic_writer(path) as fh:
            json.dump(self.to_json(), fh, indent=1)


#: Step timings (as opposed to loop overheads), which ``merge_calibrations`` may carry over.
STEP_KINDS = ("plain", "verify", "draft", "selection")


def _same_model_and_gpu(a: Calibration, b: Calibration) -> None:
    """Rows of two calibrations may be combined only for the same model on the same GPU."""
    for key in ("model", "model_spec_hash", "gpu"):
        x, y = a.provenance.get(key), b.provenance.get(key)
        if x != y:
            raise SpecsimError(f"cannot merge calibrations of different {key}: {x!r} vs {y!r}")


def merge_calibrations(primary: Calibration, extra: Calibration, note: str,
                       exclude_ops: tuple[str, ...] = ()) -> Calibration:
    """``primary``'s rows, plus ``extra``'s step timings (plain, verify, draft, selection) at
    the (batch, context) shapes ``primary`` did not reach — e.g. when a time budget cut a
    newer run short. Loop overheads come from ``primary`` alone (they depend on the loop's
    host code, not only the kernels). Both must describe the same model on the same GPU; the
    merge is recorded in the provenance (``merged``: the other run's date, kernel hash,
    shapes, ``note``) so a reader can tell which rows came from which run. Draft steps are
    taken only when both runs timed them the same way (``provenance.engine``'s
    ``draft_timed_as_chain_of``: single steps and chained steps differ by up to ~12%), and
    Quest's steps only when both runs padded their caches alike (``cache_align``; absent in
    runs before the padding: an odd number of Quest pages made its draft step 14% slower).
    Plain and draft steps only when both wrote their one new position alike
    (``fused_append``: one Triton kernel, or the torch writes). A policy's refresh (and
    Quest's draft step, which ranks pages) only when both ranked its lists alike (``ranking``,
    ``SPECSIM_RANKING`` resolved per policy). Settings a file predates: ``ENGINE_DEFAULTS``.

    An op is not taken either when ``primary`` measured it at other q (its series mean
    something else there: SparseSpec-L's refresh once at q = 1, now by ranked rows at q = 3,
    9, 16), or when it is in ``exclude_ops`` (its implementation changed between the runs in
    code the kernel hash does not cover: last-token's refresh gathers its row in one pass
    since the second round, 1.2 ms where the older rows say 1.9 at Qwen3-8B batch 4, 32K)."""
    _same_model_and_gpu(primary, extra)
    kinds = set(STEP_KINDS)
    engines = [c.provenance.get("engine", {}) for c in (primary, extra)]
    chain = [e.get("draft_timed_as_chain_of") for e in engines]
    if chain[0] != chain[1]:
        kinds.discard("draft")
    append = [engine_setting(e, "fused_append") for e in engines]
    if append[0] != append[1]:   # one-position writes (plain and draft steps) timed otherwise
        kinds -= {"plain", "draft"}
    align = [e.get("cache_align") for e in engines]
    same_pages = align[0] == align[1]
    have = {(m.batch, m.context) for m in primary.measurements}
    qs_of = lambda cal: {op: {m.q for m in cal.measurements if m.op == op}  # noqa: E731
                         for op in {m.op for m in cal.measurements}}
    mine, theirs = qs_of(primary), qs_of(extra)
    theirs = {op: q for op, q in theirs.items() if op.split(":", 1)[0] in kinds}
    skipped = {op: "excluded" for op in exclude_ops if op in theirs}
    # a policy's lists ranked another way there (SPECSIM_RANKING): its refresh and, for Quest
    # (pages ranked at every draft step), its draft step are other timings
    ranked = [engine_setting(e, "ranking") for e in engines]
    for op in theirs:
        family, _, policy = op.partition(":")
        if family in ("draft", "selection") and policy and op not in skipped and \
                (family == "selection" or policy == "quest"):
            here, there = (resolve_ranking(policy, r) for r in ranked)
            if here != there:
                skipped[op] = f"ranked by {there} there, {here} here"
    skipped.update({op: f"measured at q {sorted(theirs[op])} there, {sorted(mine[op])} here"
                    for op in theirs if op in mine and theirs[op] != mine[op]
                    and op not in skipped})
    added = [m for m in extra.measurements
             if (m.batch, m.context) not in have and m.op.split(":", 1)[0] in kinds
             and (same_pages or not m.op.endswith(":quest")) and m.op not in skipped]
    shapes = sorted({(m.batch, m.context) for m in added})
    prov = dict(primary.provenance)
    prov["merged"] = list(prov.get("merged", [])) + [{
        "date": extra.provenance.get("date"),
        "kernel_config_hash": extra.provenance.get("kernel_config_hash"),
        "torch": extra.provenance.get("torch"), "triton": extra.provenance.get("triton"),
        "shapes": [list(x) for x in shapes], "ops": sorted({m.op for m in added}),
        "rows": len(added), "note": note,
        "draft_steps": "taken" if "draft" in kinds else
                       f"skipped: timed as chains of {chain[1]} there, {chain[0]} here"
                       if chain[0] != chain[1] else
                       f"skipped: fused append {append[1]} there, {append[0]} here",
        "plain_steps": "taken" if "plain" in kinds else
                       f"skipped: fused append {append[1]} there, {append[0]} here",
        "quest_steps": "taken" if same_pages else
                       f"skipped: caches padded to {align[1]} there, {align[0]} here",
        "ops_skipped": dict(sorted(skipped.items()))}]
    return Calibration(prov, dict(primary.ceilings), list(primary.measurements) + added)


def replace_ops(base: Calibration, new: Calibration, families: list[str], note: str,
                keep_other_shapes: bool = False) -> Calibration:
    """``base`` with every row of the op ``families`` (``plain``, ``verify``, ``draft``,
    ``selection``, ``overhead``: the op name before its first ':') replaced by ``new``'s rows
    of those families: e.g. the loop overheads re-measured alone after a change to the loop's
    host code (``CalibrationGrid(only=["overhead"])``), the kernels' timings kept. An entry
    with a ':' names one op exactly (``draft:quest``: Quest's draft steps alone, after a
    change to them; ``verify`` alone would also take the shared verify). Same model and GPU;
    recorded under ``provenance.replaced`` (the other run's date, software, kernel hash,
    families, rows, ``note``). ``keep_other_shapes``: keep ``base``'s rows of an op at the
    (batch, context) shapes ``new`` did not measure it at (a re-measurement a time budget cut
    short, of kernels that did not change: verify rows re-timed to add shapes) — not for ops
    whose every row changed meaning (loop overheads after a host-code fix). Where ``new`` ran
    with other engine settings (:data:`ENGINE_SETTING_FAMILIES`: the fused one-position
    append, the ranking), the families those settings touch must all be replaced, and the
    file's ``provenance.engine`` then takes ``new``'s settings."""
    _same_model_and_gpu(base, new)
    wanted = set(families)

    def family(m):   # the entry of ``families`` that covers the row's op, if any
        return m.op if m.op in wanted else m.op.split(":", 1)[0]

    taken = [m for m in new.measurements if family(m) in wanted]
    missing = sorted(wanted - {family(m) for m in taken})
    if missing:
        raise SpecsimError(f"the new calibration has no {', '.join(missing)} rows to put in")
    measured = {(m.op, m.batch, m.context) for m in taken}
    kept = [m for m in base.measurements if family(m) not in wanted
            or (keep_other_shapes and (m.op, m.batch, m.context) not in measured)]
    prov = dict(base.provenance)
    engine = _replaced_engine(base.provenance.get("engine", {}),
                              new.provenance.get("engine", {}), wanted, keep_other_shapes)
    if engine is not None:
        prov["engine"] = engine
    prov["replaced"] = list(prov.get("replaced", [])) + [{
        "families": sorted(wanted), "rows": len(taken), "kept_other_shapes": keep_other_shapes,
        "replaced_rows": len(base.measurements) - len(kept),
        "date": new.provenance.get("date"),
        "kernel_config_hash": new.provenance.get("kernel_config_hash"),
        "torch": new.provenance.get("torch"), "triton": new.provenance.get("triton"),
        "engine": new.provenance.get("engine"), "note": note}]
    return Calibration(prov, dict(base.ceilings), kept + taken)


#: Engine settings (``provenance.engine``) that change how some step families run, and those
#: families (or single ops, ``family:policy``, where the setting touches one policy's rows
#: only): a file may take another run's rows under other settings only when it takes every
#: row of every family they touch, and then it takes the settings too.
ENGINE_SETTING_FAMILIES = {
    "fused_append": ("plain", "draft"),      # one-position writes of plain and draft steps
    "ranking": ("selection", "draft"),       # each refresh; Quest's draft step ranks pages
    "verify_splits": ("plain", "verify"),    # how full-attention passes cut keys into chunks
    "c2q": ("verify", "selection:vegas"),    # Vegas' collected rows, or their sum, and its refresh
}
#: How files from before a setting was recorded ran (torch writes, topk ranking, chunks by
#: programs per multiprocessor, Collect-2-Query's rows per head).
ENGINE_DEFAULTS = {"fused_append": False, "ranking": "topk", "verify_splits": "sm",
                   "c2q": "rows"}


def engine_setting(engine: dict, key: str):
    """A calibration's ``provenance.engine`` setting ``key`` (:data:`ENGINE_DEFAULTS` where the
    file predates it)."""
    return engine.get(key, ENGINE_DEFAULTS[key])


def _replaced_engine(old: dict, new: dict, wanted: set[str],
                     keep_other_shapes: bool) -> dict | None:
    """``old`` with the settings of :data:`ENGINE_SETTING_FAMILIES` that ``new`` ran
    differently, when the replaced ``wanted`` families cover what they touch (else an error:
    the file would mix timings of two engines and describe one of them); None if none
    differ."""
    changed = {key: engine_setting(new, key) for key in ENGINE_DEFAULTS
               if engine_setting(new, key) != engine_setting(old, key)}
    if not changed:
        return None
    for key, value in changed.items():
        uncovered = [f for f in ENGINE_SETTING_FAMILIES[key]
                     if f not in wanted and f.split(":", 1)[0] not in wanted]
        if uncovered or keep_other_shapes:
            why = (f"not replacing {', '.join(uncovered)}" if uncovered
                   else "keeping the old rows at other shapes")
            raise SpecsimError(
                f"the new calibration ran with {key}={value!r}, the old one with "
                f"{key}={engine_setting(old, key)!r}; {why} would mix the two in "
                f"one file: replace all of {', '.join(ENGINE_SETTING_FAMILIES[key])} "
                f"without keeping other shapes")
    return {**old, **changed}


def _bad(path, message) -> SpecsimError:
    return SpecsimError(f"{path}: bad calibration file: {message}")


def read_calibration(path: str) -> Calibration:
    """Read and validate; truncated or malformed files are rejected with a clear message."""
    doc = read_json(path, "calibration file")
    if not isinstance(doc, dict) or doc.get(FORMAT_KEY) != VERSION:
        raise _bad(path, f"expected \"{FORMAT_KEY}\": {VERSION}")
    prov = doc.get("provenance")
    if not isinstance(prov, dict):
        raise _bad(path, "missing provenance")
    missing = [f for f in PROVENANCE_FIELDS if f not in prov]
    if missing:
        raise _bad(path, f"provenance lacks {', '.join(missing)}")
    rows = doc.get("measurements")
    if not isinstance(rows, list) or not rows:
        raise _bad(path, "no measurements")
    out = []
    for i, row in enumerate(rows):
        where = f"measurements[{i}]"
        if not isinstance(row, dict):
            raise _bad(path, f"{where}: not an object")
        try:
            op, batch, context = str(row["op"]), int(row["batch"]), int(row["context"])
            q = int(row.get("q", 1))
            s = row.get("s")
            samples = [float(v) for v in row["samples_ms"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise _bad(path, f"{where}: missing or bad field ({exc})") from None
        if batch < 1 or context < 1 or q < 1 or not samples:
            raise _bad(path, f"{where}: batch, context, q must be ≥ 1 and samples non-empty")
        kind = op.split(":", 1)[0]
        if kind not in (*STEP_KINDS, "overhead"):
            raise _bad(path, f"{where}: unknown op '{op}'")
        if kind == "overhead":   # a residual: wall time minus the parts, noise may be < 0
            if op not in OVERHEAD_OPS and not op.startswith("overhead:speculative:"):
                raise _bad(path, f"{where}: unknown op '{op}' (overheads: "
                                 f"{', '.join(OVERHEAD_OPS)}, overhead:speculative:<policy>)")
            if op.startswith("overhead:speculative:"):
                get_policy(op.split(":", 2)[2])
            if not all(np.isfinite(samples)):
                raise _bad(path, f"{where}: samples must be finite milliseconds")
        elif not all(np.isfinite(samples)) or min(samples) <= 0:
            raise _bad(path, f"{where}: samples must be positive finite milliseconds")
        if kind == "verify" and ":" in op:   # a policy's own verify pass (verify:quest)
            get_policy(op.split(":", 1)[1])
        if kind in ("draft", "selection"):
            if ":" not in op:
                raise _bad(path, f"{where}: op '{op}' needs a policy (e.g. draft:vegas)")
            get_policy(op.split(":", 1)[1])
            if s is None or not 0 < float(s) <= 1:
                raise _bad(path, f"{where}: op '{op}' needs a sparsity s in (0, 1]")
        out.append(Measurement(op, batch, context, q, None if s is None else float(s), samples))
    return Calibration(prov, doc.get("ceilings", {}), out, path)


def collect_provenance(model: ModelSpec, kernel_config_hash: str) -> dict:
    """The software and hardware this process runs on (GPU fields only with CUDA)."""
    import platform

    prov = {"gpu": None, "gpu_memory_bytes": None, "driver": None, "cuda": None, "torch": None,
            "triton": None, "kernel_config_hash": kernel_config_hash,
            "model_spec_hash": model.spec_hash(), "model": model.name,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": platform.node()}
    try:
        import torch
        prov["torch"] = torch.__version__
        prov["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            prov["gpu"], prov["gpu_memory_bytes"] = p.name, int(p.total_memory)
            try:
                import subprocess
                prov["driver"] = subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True, text=True, timeout=10).stdout.strip() or None
            except (OSError, subprocess.SubprocessError):
                prov["driver"] = None
    except ImportError:
        pass
    try:
        import triton
        prov["triton"] = triton.__version__
    except ImportError:
        pass
    return prov


# --------------------------------------------------------------------------------------------
# the cost model
# --------------------------------------------------------------------------------------------


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


def _strictly_between(values, x) -> tuple | None:
    """The nearest measured values strictly below and strictly above ``x`` (None entries and
    an ``x`` of None ignored), or None when ``x`` is not inside them."""
    values = sorted(v for v in set(values) if v is not None)
    below = [v for v in values if x is not None and v < x]
    above = [v for v in values if x is not None and v > x]
    return (below[-1], above[0]) if below and above else None


def _bracket(xs: list[int], x: float, extrapolate: bool = False) -> tuple[int, int]:
    """The measured points (sorted ``xs``) to interpolate ``x`` between: its neighbours; beyond
    the ends the nearest end twice (held), or with ``extrapolate`` the two end points."""
    lo = max([v for v in xs if v <= x] or [xs[0]])
    hi = min([v for v in xs if v >= x] or [xs[-1]])
    if extrapolate and lo == hi and len(xs) > 1 and not xs[0] < x < xs[-1] and x != lo:
        lo, hi = (xs[0], xs[1]) if x < xs[0] else (xs[-2], xs[-1])
    return lo, hi


def _interp(value, lo: int, hi: int, x: float) -> float:
    """``value`` linear in x through lo and hi (``value(lo)`` when they coincide)."""
    a = value(lo)
    return a if lo == hi else a + (value(hi) - a) * (x - lo) / (hi - lo)


class CalibratedCostModel:
    """Measured costs behind the :class:`~specsim.costs.base.CostModel` interface."""

    name = "calibrated"

    def __init__(self, calibration: Calibration, model: ModelSpec, hardware: HardwareSpec,
                 tp: int = 1):
        if tp != 1:
            raise SpecsimError("calibrations are measured on one GPU; use the roofline model "
                               "for tensor parallelism")
        self.calibration, self.model, self.hardware = calibration, model, hardware
        # the roofline beneath the fits prices Vegas' refresh as the calibrated engine ran it
        self.roofline = RooflineCostModel(
            model, hardware, tp, c2q=engine_setting(calibration.provenance.get("engine", {}),
                                                    "c2q"))
        self.warnings = provenance_warnings(calibration, model)
        self.overheads = self.roofline.overheads
        self._full = [t == FULL_ATTENTION for t in model.layer_types]
        self.fits: dict[tuple[str, int, float | None], TermFit] = {}
        groups: dict[tuple, list[Measurement]] = {}
        for m in calibration.measurements:
            # a draft step's cost depends on s only through the bytes it attends to: one fit
            # over every measured s, so s between them is interpolated in bytes
            draft = m.op.startswith("draft:")
            groups.setdefault((m.op, m.q, None if draft else m.s), []).append(m)
        for key, rows in groups.items():
            op, q, s = key
            tokens = np.array([r.batch * q for r in rows], float)
            kv = np.array([self._op_bytes(op, np.full(r.batch, r.context), r.s) for r in rows])
            seconds = np.array([r.median_ms / 1e3 for r in rows])
            if np.unique(tokens).size * np.unique(kv).size < 2 or len(rows) < 2:
                continue
            self.fits[key] = fit_terms(tokens, kv, seconds)
        # the ops ``_gridded`` names are interpolated on their measured (batch, context) grid
        # inside it (``_on_grid``); the fits price what lies outside
        by_s: dict[tuple, list[Measurement]] = {}
        for m in calibration.measurements:
            by_s.setdefault((m.op, m.q, m.s), []).append(m)
        self.grids: dict[tuple[str, int, float | None], MeasuredGrid] = {
            key: MeasuredGrid.of(rows) for key, rows in by_s.items() if self._gridded(key[0])}

    # ---- bytes each operation's K term is a function of --------------------------------
    def _op_bytes(self, op: str, contexts: np.ndarray, s: float | None) -> float:
        kind, _, policy = op.partition(":")
        per = self.model.kv_bytes_per_token_layer()
        n_full = sum(self._full)
        window = self.model.sliding_window
        sliding = (self.model.num_layers - n_full) * float(
            np.sum(np.minimum(contexts, window))) if window else 0.0
        if kind in ("plain", "verify"):
            return per * (n_full * float(contexts.sum()) + sliding)
        if kind == "draft":
            pol = get_policy(policy)
            selected = pol.selected_array(contexts, s).astype(float)
            if pol.rescore_every_draft:
                # Quest reads every page's min and max key at each draft step: 2 key rows per
                # page = one token's K+V bytes, a driver that does not shrink with s (fitted
                # on selected bytes alone, s = 0.03 and 0.1 disagreed by up to 23%); it scores
                # the pages of the whole cache buffer, sized for the longest sequence
                selected = selected + np.ceil(contexts.max() / pol.page_size)
            return per * (n_full * float(selected.sum()) + sliding)
        # a refresh ranks every row over the whole buffer, which the engine sizes for the
        # longest sequence: a short one in a ragged batch costs as much as the longest
        # (SmolLM2 batch 32, prompts 2K–6.5K, H200: Vegas' refresh measured 0.62 ms where
        # Σ contexts priced 0.48; SparseSpec-L's 1.42 / 1.49 / 1.85 / 2.12 / 2.19 ms at
        # k = 2 / 4 / 8 / 12 / 15, priced 1.45 / 1.59 / 1.87 / 2.11 / 2.29 on the longest and
        # 1.05 / 1.15 / 1.35 / 1.51 / 1.63 on the mean — its attention-mass kernel skips the
        # blocks past each length, its top-K does not)
        if kind == "selection":
            return per * n_full * float(contexts.max()) * contexts.size
        return per * n_full * float(contexts.sum())          # loop overheads

    def _lookup(self, op: str, q: int, s: float | None, contexts: np.ndarray,
                roofline_cost: Cost) -> Cost:
        tokens = contexts.size * q
        kv = self._op_bytes(op, contexts, s)
        key = (op, q, None if op.startswith("draft:") else s)
        fit = self.fits.get(key)
        note = None
        if self._gridded(op):
            on_grid = self._on_grid(op, q, s, contexts)
            if on_grid is not None:
                seconds, label = on_grid
                return _relabel(roofline_cost, float(seconds), label)
        if fit is None and op.startswith("selection:"):
            between = self._between_s(op, q, s, tokens, kv)
            if between is not None:
                seconds, inside, note = between
                return _relabel(roofline_cost, float(seconds), note if inside else
                                note + "; outside the measured grid: fitted roofline")
        if fit is None and op == "verify":
            fit, note = self._verify_between_q(q, tokens, kv,
                                               self._equivalent_context(op, contexts))
            if fit is not None:
                seconds, inside = fit
                return _relabel(roofline_cost, float(seconds), note if inside else
                                note + "; outside the measured grid: fitted roofline")
        if fit is None:
            nearest = self._nearest_s(op, q, s)
            if nearest is not None:
                fit = self.fits[nearest]
                note = f"{op}: s={s} not calibrated, used the fit at s={nearest[2]}"
        if fit is None:
            return _relabel(roofline_cost, roofline_cost.seconds,
                            f"{op} q={q} not calibrated: roofline model")
        seconds, inside = fit.predict(tokens, kv)
        label = "calibrated" if inside else (
            f"{op}: outside the measured grid (tokens {tokens}, KV {kv / 1e9:.2f} GB): "
            f"fitted roofline")
        if note:
            label = f"{note}; {label}"
        return _relabel(roofline_cost, float(seconds), label)

    def _equivalent_context(self, op: str, contexts: np.ndarray) -> float:
        """The uniform context a ragged batch is priced at on a measured grid: its longest
        sequence for a selection refresh (``_op_bytes``) and a draft step, its mean for a plain
        step or a verify pass.

        A draft step's attention launch is planned for the longest list in the batch (the
        engine sizes the index lists, and so the split plan, by the selection at the cache
        buffer's length, the longest sequence's): at SmolLM2's batch 32 its longest chunks,
        not the batch's bytes, set most of the time. Validation round 5
        (SmolLM2 b32, prompts 2K–7K, H200), draft phase per iteration predicted vs measured
        over the 40 non-Quest configurations: the two-term fit in selected bytes MAPE 2.3%
        (worst 5.6%; it under-prices the step's growth with s: 0.08 ms per step from s = 0.03
        to 0.1 where the runs took 0.19), the grid at the mean context 1.5% (bias −1.2%), at
        the longest 1.3% (bias +1.2%); throughput: StreamingLLM's k*/s* regret 0.963 with the
        fit, 1.000 on the grid at the longest (every policy ≤ 2.4% MAPE)."""
        if op.startswith(("selection:", "draft:")):
            return float(contexts.max())
        return float(contexts.mean())

    @classmethod
    def _gridded(cls, op: str) -> bool:
        """Priced on its measured grid inside it: plain steps, verify passes (``verify:<policy>``
        too), selection refreshes and draft steps; the fits price what lies outside.

        Quest's draft re-scores every page of the buffer (~25 launches per layer of page
        scoring and ranking, not a read of the selected rows): the two-term fit missed it
        (held-out 6.1% on Qwen3-8B, 3.5% on the grid; the H200 runs at batch 4, 32K: 15.2 ms
        per step, fit 16.1, grid 15.4). The other drafts' fit is exact at the calibration's
        uniform shapes (0.6–1.3% held-out) but not in ragged runs (``_equivalent_context``)."""
        return op.split(":", 1)[0] in STEP_KINDS

    def _on_grid(self, op: str, q: int, s: float | None, contexts: np.ndarray
                 ) -> tuple[float, str] | None:
        """An op ``_gridded`` names, interpolated on its measured (batch, context) grid, at
        ``s`` (or between the two measured sparsities around it: a draft linearly in the
        positions it selects at that context, which the floor of ``min_selected`` and the
        recent window make non-linear in s; other ops linearly in s); None outside the grid.

        The two-term fit (tokens, bytes) smooths across shapes what the kernels do not: a
        refresh ranks rows whose cost trades rows against length and jumps where
        ``torch.topk`` changes algorithm, and the verify kernel's tile and split plan change
        with batch and q. Held-out on the shipped files (each batch's series interpolated in
        context, then across batches): Qwen3-8B verify 5.2 → 1.5%, Vegas' refresh 9.1 →
        4.1%, Llama-3.1-8B verify 6.2 → 1.6%."""
        batch, context = contexts.size, self._equivalent_context(op, contexts)
        grid = self.grids.get((op, q, s))
        if grid is not None:
            got = grid(batch, context)
            return None if got is None else (got, "calibrated (measured grid)")
        around = _strictly_between([k[2] for k in self.grids if k[0] == op and k[1] == q], s)
        if around is None:
            return None
        lo, hi = around
        t_lo, t_hi = self.grids[(op, q, lo)](batch, context), self.grids[(op, q, hi)](batch,
                                                                                    context)
        if t_lo is None or t_hi is None:
            return None
        w = (s - lo) / (hi - lo)
        if op.startswith("draft:"):
            pol = get_policy(op.split(":", 1)[1])
            n_lo, n_s, n_hi = (float(pol.selected_array(np.array([context]), x)[0])
                               for x in (lo, s, hi))
            w = (n_s - n_lo) / (n_hi - n_lo) if n_hi > n_lo else 0.0
        return ((1 - w) * t_lo + w * t_hi,
                f"{op}: s={s} interpolated between measured s={lo} and s={hi} (measured grid)")

    def _verify_tile(self, q: int) -> int:
        """Rows of the verify kernel's tile at ``q`` (``plan_verify``: the KV head's group × q
        query rows, to a power of two ≥ 16): its configuration changes where this does."""
        rows = self.model.group_size * q
        return max(16, 1 << (rows - 1).bit_length())

    def _verify_between_q(self, q: int, tokens: float, kv: float, context: float):
        """A verify at an unmeasured q, linear in q between measured ones *of the same tile*
        (the kernel's configuration changes with its row count: SmolLM2's q = 9 runs the
        32-row tile of q = 6–10, 3.64 ms in the H200 runs, where interpolating between q = 8
        and q = 12 (64 rows) priced 3.09); beyond them in the tile, linear through its two
        nearest (held with one); across tiles only when the tile has no measured q."""
        measured = sorted(k[1] for k in self.fits if k[0] == "verify")
        tile = [x for x in measured if self._verify_tile(x) == self._verify_tile(q)]
        if tile:
            lo, hi = _bracket(tile, q, extrapolate=True)
            how = f"in its {self._verify_tile(q)}-row tile from measured q={lo}" + \
                (f" and q={hi}" if hi != lo else "")
        else:
            around = _strictly_between(measured, q)
            if around is None:
                return None, None
            lo, hi = around
            how = f"between measured q={lo} and q={hi}"
        batch = tokens / q

        def at(q0):   # the measured grid where it covers the shape, else the fit
            grid = self.grids.get(("verify", q0, None))
            got = grid(int(round(batch)), context) if grid is not None else None
            if got is not None:
                return got, True
            return self.fits[("verify", q0, None)].predict(batch * q0, kv)

        (t_lo, in_lo), (t_hi, in_hi) = at(lo), at(hi)
        w = 0.0 if hi == lo else (q - lo) / (hi - lo)
        return (max(0.0, (1 - w) * t_lo + w * t_hi), bool(in_lo and in_hi)), \
            f"verify q={q} interpolated {how}"

    def _between_s(self, op, q, s, tokens, kv):
        """A selection at an s between two calibrated ones: linear in s between their fits."""
        around = _strictly_between([k[2] for k in self.fits if k[0] == op and k[1] == q], s)
        if around is None:
            return None
        lo, hi = around
        t_lo, in_lo = self.fits[(op, q, lo)].predict(tokens, kv)
        t_hi, in_hi = self.fits[(op, q, hi)].predict(tokens, kv)
        w = (s - lo) / (hi - lo)
        return ((1 - w) * t_lo + w * t_hi, bool(in_lo and in_hi),
                f"{op}: s={s} interpolated between measured s={lo} and s={hi}")

    def _nearest_s(self, op, q, s):
        candidates = [k for k in self.fits if k[0] == op and k[1] == q and k[2] is not None]
        if not candidates or s is None:
            return None
        return min(candidates, key=lambda k: abs(k[2] - s))

    # ---- the interface ------------------------------------------------------------------
    def _overhead(self, op: str, contexts: np.ndarray, k: int | None = None
                  ) -> tuple[float, str] | None:
        """A measured loop overhead (``overhead:plain`` / ``overhead:speculative``) at these
        contexts, seconds ≥ 0, or None when the calibration has none. Speculative overheads
        measured at several draft lengths (q = k + 1) are linear in k between and beyond them
        (the host's per-iteration work grows with the drafts it reads back); one measured k
        is used at every k."""
        qs = sorted(key[1] for key in self.fits if key[0] == op)
        if not qs:
            return None
        kv = self._op_bytes(op, contexts, None)

        def at(q):
            return self.fits[(op, q, None)].predict(contexts.size * q, kv)

        if k is None or len(qs) == 1:
            seconds, inside = at(qs[0])
            how = ""
        else:
            q = k + 1
            lo, hi = _bracket(qs, q, extrapolate=True)
            seconds = _interp(lambda x: at(x)[0], lo, hi, q)
            inside = at(lo)[1] and at(hi)[1]
            how = (f" at k={k}, " + ("interpolated" if qs[0] <= q <= qs[-1] else
                                     "extrapolated") + f" from k={lo - 1}, {hi - 1}")
        note = f"{op} measured{how}" + ("" if inside else
                                        " (outside the grid: fitted roofline)")
        return max(float(seconds), 0.0), note

    def plain_step(self, contexts: Sequence[int]) -> Cost:
        """One plain step in a decoding loop: the measured step plus, when calibrated, the
        loop's measured per-step overhead (host work and launch gaps)."""
        ctx = as_contexts(contexts)
        cost = self._lookup("plain", 1, None, ctx, self.roofline.plain_step(ctx))
        extra = self._overhead("overhead:plain", ctx)
        if extra is None:
            return cost
        out = _relabel(cost, cost.seconds + extra[0], extra[1])
        return Cost(out.seconds, out.weight_bytes, out.kv_bytes, out.other_bytes, out.flops,
                    out.overhead_s + extra[0], out.comm_s, out.bound, out.notes)

    def verify(self, contexts: Sequence[int], q: int) -> Cost:
        ctx = as_contexts(contexts)
        return self._lookup("verify", q, None, ctx, self.roofline.verify(ctx, q))

    def policy_verify(self, contexts: Sequence[int], q: int, policy: str) -> Cost:
        """A verify pass as ``policy``'s engine runs it, where the calibration timed it there
        (``verify:<policy>``): the shared ``verify`` (timed on a Vegas engine, which collects
        two rows' logits) plus the measured difference — negative for a policy that collects
        none (StreamingLLM: 0.6–1.1 ms below Vegas' at Qwen3-8B batch 4, 32K), never more
        negative than half the shared pass. Quest's page-bound updates are measured at one q
        and added at every q (they depend on the pages a pass touches, not on q); the
        all-row logits of last-token and SparseSpec-L at several q, the difference
        interpolated linearly in q between them and held at the nearest beyond."""
        ctx = as_contexts(contexts)
        base = self.verify(ctx, q)
        op = f"verify:{get_policy(policy).name}"
        qs = sorted(key[1] for key in self.fits if key[0] == op)
        if not qs:
            return base

        def extra_at(q0):
            own = self._lookup(op, q0, None, ctx, self.roofline.verify(ctx, q0))
            shared = self.verify(ctx, q0).seconds
            return max(-0.5 * shared, own.seconds - shared)

        lo, hi = _bracket(qs, q)
        extra = _interp(extra_at, lo, hi, q)
        where = f"q={lo}" if lo == hi else f"q={lo}..{hi}"
        return _relabel(base, base.seconds + extra,
                        f"{op} measured: {extra * 1e6:+.0f} µs over the shared verify at "
                        f"{where}")

    def draft_step(self, contexts: Sequence[int], s: float, policy: str) -> Cost:
        ctx = as_contexts(contexts)
        return self._lookup(f"draft:{policy}", 1, s, ctx,
                            self.roofline.draft_step(ctx, s, policy))

    def selection(self, contexts: Sequence[int], s: float, policy: str, k: int) -> Cost:
        ctx = as_contexts(contexts)
        base = self.roofline.selection(ctx, s, policy, k)
        if get_policy(policy).name in ("full", "streamingllm"):
            return base
        # Quest's per-step page scoring runs inside its measured draft step; what remains here
        # is the refresh after each verify, once per iteration like every other policy
        op = f"selection:{policy}"
        rows = sorted(key[1] for key in self.fits if key[0] == op and key[1] != 1)
        if not rows:
            return self._lookup(op, 1, s, ctx, base)
        # measured at several numbers of ranked rows (SparseSpec-L: the last min(k + 1, W)
        # verify rows): linear between them, the nearest beyond
        want = min(k + 1, SPARSESPEC_WINDOW)
        lo, hi = _bracket(rows, want)
        t_lo = self._lookup(op, lo, s, ctx, base)
        if lo == hi:
            return t_lo
        seconds = _interp(lambda r: self._lookup(op, r, s, ctx, base).seconds, lo, hi, want)
        return _relabel(t_lo, seconds, f"{op}: {want} rows interpolated between measured "
                                       f"{lo} and {hi}")

    def prefill(self, prompt_lengths: Sequence[int]) -> Cost:
        cost = self.roofline.prefill(prompt_lengths)
        return _relabel(cost, cost.seconds, "prefill not calibrated: roofline model")

    def iteration(self, contexts: Sequence[int], k: int, s: float, policy: str) -> IterationCost:
        """``compose_iteration``, with the measured per-iteration loop overhead (accept,
        rollback, host bookkeeping, launch gaps) in place of the roofline's constant when the
        calibration has it: the policy's own (``overhead:speculative:<policy>``), else the
        policy-agnostic one of older files (``overhead:speculative``)."""
        cost = compose_iteration(self, contexts, k, s, policy)
        ctx = as_contexts(contexts)
        if any(key[0] == f"verify:{get_policy(policy).name}" for key in self.fits):
            cost = dataclasses.replace(cost, verify=self.policy_verify(ctx, k + 1, policy))
        extra = self._overhead(f"overhead:speculative:{get_policy(policy).name}", ctx, k) \
            or self._overhead("overhead:speculative", ctx, k)
        return cost if extra is None else dataclasses.replace(cost, overhead_s=extra[0])


def _relabel(cost: Cost, seconds: float, note: str) -> Cost:
    return Cost(seconds, cost.weight_bytes, cost.kv_bytes, cost.other_bytes, cost.flops,
                cost.overhead_s, cost.comm_s, cost.bound, (*cost.notes, note))


def provenance_warnings(calibration: Calibration, model: ModelSpec) -> list[str]:
    """Flags for a calibration used away from where it was measured."""
    prov = calibration.provenance
    out = []
    if "cache_align" not in prov.get("engine", {}):
        # files measured before session 6's engine (padded caches, loop overheads by the loop's
        # own clock, each policy's verify): the re-measured files' speculative overheads fell
        # 40–60% (Quest's 2–3×) and their policies' verify moved by up to 20%
        out.append(f"calibration measured by an older engine ({prov.get('date', '?')[:10]}: "
                   f"before padded caches, per-policy verify rows and the loop overheads' "
                   f"re-measurement): its speculative loop overheads run high, and the "
                   f"policies that collect every verify row (last-token, SparseSpec-L) are "
                   f"priced at the shared verify — re-measure with `specsim calibrate --gpu` "
                   f"for validated figures")
    if prov.get("model_spec_hash") != model.spec_hash():
        out.append(f"calibration measured on model '{prov.get('model')}' shapes "
                   f"(spec {prov.get('model_spec_hash')}), used for '{model.name}' "
                   f"(spec {model.spec_hash()})")
    try:
        import torch
        here = torch.cuda.get_device_properties(0).name if torch.cuda.is_available() else None
        if here and prov.get("gpu") and here != prov["gpu"]:
            out.append(f"calibration measured on {prov['gpu']}, this GPU is {here}")
        if here and prov.get("torch") and prov["torch"] != torch.__version__:
            out.append(f"calibration measured with torch {prov['torch']}, this is "
                       f"{torch.__version__}")
    except ImportError:
        pass
    return out


# --------------------------------------------------------------------------------------------
# held-out check
# --------------------------------------------------------------------------------------------


def held_out_check(calibration: Calibration, model: ModelSpec, hardware: HardwareSpec,
                   every: int = 3) -> dict:
    """Predict a held-out part of the grid from the rest: every ``every``-th *interior*
    context point of each (op, q, s, batch) series is held out (so it is interpolated, not
    extrapolated). Reports MAPE and the worst case per operation."""
    series: dict[tuple, list[Measurement]] = {}
    for m in calibration.measurements:
        series.setdefault((m.op, m.q, m.s, m.batch), []).append(m)
    held, kept = [], []
    for rows in series.values():
        rows = sorted(rows, key=lambda r: r.context)
        for i, r in enumerate(rows):
            interior = 0 < i < len(rows) - 1
            (held if interior and i % every == 1 else kept).append(r)
    if not held:
        raise SpecsimError("the grid is too small for a held-out check (need ≥ 3 contexts "
                           "per series)")
    fitted = CalibratedCostModel(Calibration(calibration.provenance, calibration.ceilings, kept),
                                 model, hardware)
    per_op: dict[str, list[float]] = {}
    overheads: dict[str, list[tuple[float, float]]] = {}
    rows_out = []
    for r in held:
        ctx = [r.context] * r.batch
        kind, _, policy = r.op.partition(":")
        if kind == "overhead":   # a residual near 0: absolute error, not relative
            got = fitted._overhead(r.op, np.asarray(ctx), r.q - 1)
            if got is not None:
                overheads.setdefault(r.op, []).append((r.median_ms, got[0] * 1e3))
            continue
        if kind == "plain":   # the step alone, as measured (plain_step adds the loop overhead)
            cost = fitted._lookup("plain", 1, None, np.asarray(ctx),
                                  fitted.roofline.plain_step(ctx))
        elif kind == "verify":
            cost = fitted.policy_verify(ctx, r.q, policy) if policy else fitted.verify(ctx, r.q)
        elif kind == "draft":
            cost = fitted.draft_step(ctx, r.s, policy)
        else:
            cost = fitted._lookup(r.op, r.q, r.s, np.asarray(ctx),
                                  fitted.roofline.selection(ctx, r.s, policy, 1))
        if kind == "selection" and get_policy(policy).rescore_every_draft:
            # Quest's refresh after a verify is empty (its selection runs in each draft step):
            # ~10–30 µs of launch time, a residual like the overheads, not a term to scale
            overheads.setdefault(r.op, []).append((r.median_ms, cost.seconds * 1e3))
            continue
        err = cost.seconds * 1e3 / r.median_ms - 1.0
        key = r.op if kind != "verify" or policy else "verify"
        per_op.setdefault(key, []).append(err)
        rows_out.append({"op": r.op, "batch": r.batch, "context": r.context, "q": r.q, "s": r.s,
                         "measured_ms": r.median_ms, "predicted_ms": cost.seconds * 1e3,
                         "error": err})
    summary = {op: {"points": len(e), "mape": float(np.mean(np.abs(e))),
                    "worst": float(np.max(np.abs(e)))} for op, e in sorted(per_op.items())}
    all_err = np.abs([r["error"] for r in rows_out])
    over = {op: {"points": len(v), "measured_ms_median": float(np.median([m for m, _ in v])),
                 "mean_abs_error_ms": float(np.mean([abs(p - m) for m, p in v])),
                 "worst_abs_error_ms": float(np.max([abs(p - m) for m, p in v]))}
            for op, v in sorted(overheads.items())}
    return {"held_out": len(held), "kept": len(kept), "per_op": summary, "overheads": over,
            "mape": float(all_err.mean()), "worst": float(all_err.max()), "rows": rows_out}
