"""How well a calibration predicts itself: part of its grid held out, predicted from the
rest by the calibrated cost model (``specsim calibrate --check``)."""
from __future__ import annotations

import numpy as np

from specsim.costs.calibrated import CalibratedCostModel
from specsim.costs.calibration_file import Calibration, Measurement
from specsim.errors import SpecsimError
from specsim.policies import get_policy
from specsim.specs import HardwareSpec, ModelSpec


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
            got = fitted.loop_overhead(r.op, np.asarray(ctx), r.q - 1)
            if got is not None:
                overheads.setdefault(r.op, []).append((r.median_ms, got[0] * 1e3))
            continue
        if kind == "prefill":
            cost = fitted.prefill([r.context])
        elif kind == "plain":   # the step alone, as measured (plain_step adds the loop overhead)
            cost = fitted.measured_step("plain", ctx)
        elif kind == "verify":
            cost = fitted.policy_verify(ctx, r.q, policy) if policy else fitted.verify(ctx, r.q)
        elif kind == "draft":
            cost = fitted.draft_step(ctx, r.s, policy)
        else:
            cost = fitted.measured_step(r.op, ctx, r.q, r.s)
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
