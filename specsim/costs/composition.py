"""How far a model's steps composed from operator tables land from the same steps measured end
to end: the composition error of :class:`~specsim.costs.operators.OperatorCostModel` against a
calibration of that model on the same GPU (``specsim calibrate --check CAL --compose TABLE``)."""
from __future__ import annotations

import numpy as np

from specsim.costs.calibration_file import Calibration
from specsim.costs.operators import OperatorCostModel

#: Ops a composition is scored on (loop overheads are not composed from operators, and Quest's
#: refresh, which does nothing, has no relative error).
SKIPPED = ("overhead", "selection:quest", "selection:streamingllm")


def composed_step(model: OperatorCostModel, op: str, batch: int, context: int, q: int = 1,
                  s: float | None = None, residual: bool = True) -> float:
    """Seconds of one calibration op (``plain``, ``verify``, ``verify:<policy>``,
    ``draft:<policy>``, ``selection:<policy>``) at a uniform batch, as the operators price it.
    A selection measured at q ranked rows is priced at draft length k = q − 1. Without
    ``residual``, the operators alone (no fitted composition residual); never the loop's
    host overhead, which the calibration times apart."""
    ctx = [context] * batch
    kind, _, policy = op.partition(":")
    if kind == "prefill":     # one prompt a pass: no fitted residual prices a prefill
        return batch * model.prefill([context]).seconds
    if kind in ("plain", "verify", "draft", "selection"):
        return model.step(op if kind != "verify" else f"verify:{policy or 'vegas'}", ctx, q,
                          s, max(1, q - 1) if q > 1 else 4, residual=residual).seconds
    raise ValueError(f"op {op!r} is not composed from operators")


def composition_error(calibration: Calibration, model: OperatorCostModel,
                      residual: bool = True) -> dict:
    """Per op: points, MAPE, worst and mean signed error (bias) of the composed price against
    each measured median, and over all ops; every point listed. ``residual``: as
    :func:`composed_step`."""
    per_op: dict[str, list[float]] = {}
    rows = []
    for m in calibration.measurements:
        if m.op.startswith(SKIPPED) or m.op.split(":", 1)[0] in SKIPPED:
            continue
        measured = m.median_ms / 1e3
        composed = composed_step(model, m.op, m.batch, m.context, m.q, m.s, residual)
        error = composed / measured - 1.0
        per_op.setdefault(m.op, []).append(error)
        rows.append({"op": m.op, "batch": m.batch, "context": m.context, "q": m.q, "s": m.s,
                     "measured_ms": measured * 1e3, "composed_ms": composed * 1e3,
                     "error": error})
    if not rows:
        raise ValueError("the calibration holds no step an operator table composes")

    def summary(errors):
        e = np.asarray(errors)
        return {"points": int(e.size), "mape": float(np.mean(np.abs(e))),
                "worst": float(e[np.argmax(np.abs(e))]), "bias": float(np.mean(e))}

    return {"per_op": {op: summary(e) for op, e in sorted(per_op.items())},
            "all": summary([r["error"] for r in rows]), "points": rows}


__all__ = ["composed_step", "composition_error"]
