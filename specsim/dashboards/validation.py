"""Measured vs predicted times for the dashboard's validation figures, from pluggable readers.

Three formats are read:

- a JSON list of points (or ``{"points": [...]}``)::

      [{"label": "verify b=8 ctx=16K k=4", "measured_ms": 3.91, "predicted_ms": 3.70,
        "group": "verify"},                     # "group" is optional (colours the points)
       ...]

- a calibration file written by ``specsim calibrate --gpu`` (``{"specsim_calibration": 1,
  ...}``): every measured step median against the roofline model's prediction for the same
  operation and shape, on the dashboard's model and hardware;
- ``specsim validate report --json``: each configuration's seconds per iteration measured on
  the GPU against the plan's prediction.

More formats plug in with :func:`register_reader`: a reader says whether it recognises a parsed
JSON document and turns it into :class:`ValidationPoint` s, given a :class:`ReadContext`
(the model and hardware, for readers that predict).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from specsim.errors import SpecsimError, quote
from specsim.specs import HardwareSpec, ModelSpec


@dataclass(frozen=True)
class ValidationPoint:
    label: str
    measured_ms: float
    predicted_ms: float
    group: str = ""
    priced_by: str = ""       # the cost source of the prediction (e.g. "roofline model")

    @property
    def relative_error(self) -> float:
        """``predicted / measured − 1``: positive when the model predicts too slow."""
        return self.predicted_ms / self.measured_ms - 1.0


@dataclass(frozen=True)
class ReadContext:
    """What a reader may need to predict times itself."""

    model: ModelSpec | None = None
    hardware: HardwareSpec | None = None


ReadFunction = Callable[[object, str, ReadContext], list[ValidationPoint]]


@dataclass(frozen=True)
class Reader:
    name: str
    accepts: Callable[[object], bool]
    read: ReadFunction
    describe: str = ""        # what "predicted" means for this format


_READERS: list[Reader] = []


def register_reader(name: str, accepts: Callable[[object], bool], read: ReadFunction,
                    describe: str = "") -> None:
    """Add a format; readers are tried in registration order, the first that accepts reads."""
    _READERS[:] = [r for r in _READERS if r.name != name] + [Reader(name, accepts, read,
                                                                    describe)]


def readers() -> list[str]:
    return [r.name for r in _READERS]


def load_validation(path: str | Path, context: ReadContext | None = None
                    ) -> tuple[str, list[ValidationPoint]]:
    """Parse ``path`` with the first reader that recognises it: (description, points)."""
    path = str(path)
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise SpecsimError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SpecsimError(f"{path}:{exc.lineno}: bad JSON: {exc.msg}") from None
    for reader in _READERS:
        if reader.accepts(doc):
            points = reader.read(doc, path, context or ReadContext())
            if not points:
                raise SpecsimError(f"{path}: no measured/predicted points")
            return reader.describe or reader.name, points
    raise SpecsimError(f"{path}: not a validation file specsim knows (formats: "
                       f"{', '.join(readers())}); expected a JSON list of "
                       f'{{"label", "measured_ms", "predicted_ms"}}')


# --------------------------------------------------------------------------------------------
# the minimal format: a list of {"label", "measured_ms", "predicted_ms"[, "group"]}
# --------------------------------------------------------------------------------------------


def _point_list(doc):
    return doc.get("points") if isinstance(doc, dict) else doc


def _accepts_points(doc) -> bool:
    items = _point_list(doc)
    return isinstance(items, list) and all(isinstance(x, dict) for x in items) and \
        any("measured_ms" in x for x in items)


def _read_points(doc, path: str, context: ReadContext) -> list[ValidationPoint]:
    out = []
    for n, item in enumerate(_point_list(doc)):
        where = f"{path}: point {n}"
        for key in ("label", "measured_ms", "predicted_ms"):
            if key not in item:
                raise SpecsimError(f"{where}: {key}: expected a value, got none (missing)")
        values = {}
        for key in ("measured_ms", "predicted_ms"):
            x = item[key]
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) \
                    or x <= 0:
                raise SpecsimError(f"{where}: {key}: expected a positive number, got "
                                   f"{quote(x)}")
            values[key] = float(x)
        out.append(ValidationPoint(str(item["label"]), values["measured_ms"],
                                   values["predicted_ms"], str(item.get("group", "")),
                                   str(item.get("priced_by", ""))))
    return out


register_reader("points", _accepts_points, _read_points, "measured vs predicted points")


# --------------------------------------------------------------------------------------------
# specsim calibration files: measured medians vs the roofline model
# --------------------------------------------------------------------------------------------


def _accepts_calibration(doc) -> bool:
    from specsim.costs.calibration_file import FORMAT_KEY
    return isinstance(doc, dict) and FORMAT_KEY in doc


def _read_calibration(doc, path: str, context: ReadContext) -> list[ValidationPoint]:
    """Each step measurement's median against :class:`RooflineCostModel` for the same
    operation, batch, context, q and s (selection at k = 1, as the calibrated model looks it
    up). Loop overheads (``overhead:…``: what a decoding loop spends beyond its steps, a
    residual near 0) are not steps the roofline prices, and are left out."""
    from specsim.costs import RooflineCostModel
    from specsim.costs.calibration_file import read_calibration
    from specsim.dashboards.figures import tokens_label

    if context.model is None or context.hardware is None:
        raise SpecsimError(f"{path}: a calibration file needs a model and hardware to compare "
                           f"the roofline model with")
    calibration = read_calibration(path)   # validates the file
    roofline = RooflineCostModel(context.model, context.hardware)
    out = []
    for m in calibration.measurements:
        contexts = [m.context] * m.batch
        kind, _, policy = m.op.partition(":")
        if kind == "overhead":
            continue
        if kind == "plain":
            cost, what = roofline.plain_step(contexts), ""
        elif kind == "prefill":
            cost, what = roofline.prefill([m.context]), ""
        elif kind == "verify":
            cost, what = roofline.verify(contexts, m.q), f" q={m.q}"
        elif kind == "draft":
            cost, what = roofline.draft_step(contexts, m.s, policy), f" s={m.s:g}"
        else:
            cost, what = roofline.selection(contexts, m.s, policy, 1), f" s={m.s:g}"
        label = f"{m.op} b={m.batch} ctx={tokens_label(m.context)}{what}"
        out.append(ValidationPoint(label, m.median_ms, cost.seconds * 1e3, m.op,
                                   "roofline model"))
    return out


register_reader("calibration", _accepts_calibration, _read_calibration,
                "specsim calibration: measured medians vs the roofline model")


# --------------------------------------------------------------------------------------------
# specsim validate report --json: every configuration's iteration time, measured vs predicted
# --------------------------------------------------------------------------------------------


def _accepts_validate_report(doc) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("setups"), list) and \
        any(isinstance(st, dict) and "rows" in st for st in doc["setups"])


def _read_validate_report(doc, path: str, context: ReadContext) -> list[ValidationPoint]:
    """The seconds per iteration of every measured (policy, k, s) in each setup's steady
    window against what the plan predicted (``specsim validate report --json``), grouped by
    setup and policy. A report of several models shows only the dashboard model's setups
    (all of them when none is of that model)."""
    out = []
    setups = [st for st in doc["setups"] if isinstance(st, dict)]
    if context.model is not None:
        own = [st for st in setups
               if (st.get("setup") or {}).get("model") == context.model.name]
        setups = own or setups
    for n, st in enumerate(setups):
        name = st.get("name", f"setup {n}")
        for row in st.get("rows", []) + st.get("excluded", []):
            try:
                measured = float(row["iteration_ms_measured"])
                predicted = float(row["iteration_ms_predicted"])
                label = f"{name} {row['policy']} s={row['s']:g} k={row['k']}"
            except (KeyError, TypeError, ValueError):
                raise SpecsimError(f"{path}: setup {name}: a row without policy, s, k and "
                                   f"iteration_ms_measured/predicted (write it with "
                                   f"`specsim validate report --json`)") from None
            if measured > 0 and predicted > 0:
                out.append(ValidationPoint(label, measured, predicted,
                                           f"{name} {row['policy']}", str(st.get("costs") or "")))
    return out


register_reader("validate-report", _accepts_validate_report, _read_validate_report,
                "specsim validate: iteration time per configuration, measured on the GPU vs "
                "predicted before the run")


# --------------------------------------------------------------------------------------------
# figure data
# --------------------------------------------------------------------------------------------


def validation_data(points: list[ValidationPoint], source: str = "") -> dict:
    """Points and the error summary: mean and largest |predicted/measured − 1|."""
    errors = np.array([p.relative_error for p in points])
    return {
        "source": source,
        "priced_by": sorted({p.priced_by for p in points if p.priced_by}),
        "points": [{"label": p.label, "group": p.group, "measured_ms": p.measured_ms,
                    "predicted_ms": p.predicted_ms, "relative_error": p.relative_error}
                   for p in points],
        "mean_abs_relative_error": float(np.mean(np.abs(errors))),
        "max_abs_relative_error": float(np.max(np.abs(errors))),
        "mean_relative_error": float(np.mean(errors)),
    }
