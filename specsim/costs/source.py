"""Which cost model a command prices with, and where its prices come from: one resolver.

:func:`resolve_cost_source` takes the user's ``--costs`` choice and returns a
:class:`CostSource`: the cost model, the kind of source (a calibration of this model on this
GPU, or the roofline), the file, and the note reports print. Under ``auto`` the sources are
tried in order of trust (:data:`AUTO_SOURCES`: the shipped calibration, then the roofline);
each says why it does not apply, and a fallback to the roofline is flagged with that reason.
Another source (an operator table, say) slots into that order as one more function.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specsim.costs.base import CostModel
from specsim.costs.roofline import RooflineCostModel
from specsim.errors import SpecsimError
from specsim.specs import HardwareSpec, ModelSpec


@dataclass(frozen=True)
class CostSource:
    """A cost model and where its prices come from."""

    cost_model: CostModel
    kind: str                     # "calibration" | "roofline"
    note: str                     # what reports print: which model, from what, and why
    path: str | None = None       # the calibration file
    fallback: str | None = None   # why a calibration was not used, where one was wanted


class _NotHere(Exception):
    """A source that does not apply: why (the roofline's note names it)."""


def shipped_calibration(model: ModelSpec, hardware: HardwareSpec) -> Path | None:
    """Path of the calibration shipped for (hardware, model), or None:
    ``models/calibrations/<hardware key>/<model name>.json`` in the catalogue."""
    from specsim.shipped import catalog_file
    path = catalog_file(f"calibrations/{hardware.key}/{model.name}.json")
    return path if hardware.key and path.is_file() else None


def uncovered_policies(calibration) -> list[str]:
    """Sparse policies a calibration has no draft measurements for."""
    from specsim.policies import SELECTION_POLICIES
    measured = {m.op.split(":", 1)[1] for m in calibration.measurements
                if m.op.startswith("draft:")}
    return [p for p in SELECTION_POLICIES if p not in measured]


def _calibrated(calibration, model, hardware, tp) -> CostSource:
    from specsim.costs.calibrated import CalibratedCostModel
    from specsim.costs.provenance import engine_summary
    from specsim.shipped import display_name

    cm = CalibratedCostModel(calibration, model, hardware, tp)
    # a shipped file by its name in the repository (reports get committed: an absolute path
    # names one machine's checkout), any other path as given
    note = (f"calibrated cost model ({display_name(calibration.path)}; "
            f"{engine_summary(calibration)})")
    if cm.warnings:
        note += "; WARNING: " + "; ".join(cm.warnings)
    return CostSource(cm, "calibration", note, str(calibration.path))


def _roofline(model, hardware, tp, why: str | None = None) -> CostSource:
    note = "roofline cost model" + (f" ({why})" if why else "")
    return CostSource(RooflineCostModel(model, hardware, tp), "roofline", note, fallback=why)


def shipped_calibration_source(model, hardware, tp, required: bool) -> CostSource:
    """The calibration shipped for this model on this GPU, at tp = 1. Under ``auto``
    (``required`` False) it must cover every policy: mixing measured and roofline costs
    across policies would bias their comparison."""
    from specsim.costs.calibration_file import read_calibration

    path = shipped_calibration(model, hardware)
    if path is None or tp != 1:
        if required:
            raise SpecsimError(f"no shipped calibration for {model.name} on "
                               f"'{hardware.key}'" + (" at tp=1" if tp != 1 else "")
                               + "; run `specsim calibrate --gpu` or use --costs roofline")
        raise _NotHere("tensor parallelism" if path is not None else "no calibration shipped")
    calibration = read_calibration(str(path))
    missing = uncovered_policies(calibration)
    if missing and not required:
        raise _NotHere(f"the shipped calibration {path.name} does not cover "
                       f"{', '.join(missing)}; pass --costs {path} to use it anyway")
    return _calibrated(calibration, model, hardware, tp)


#: The sources ``auto`` tries, most trusted first; the roofline prices what none covers.
AUTO_SOURCES = (shipped_calibration_source,)


def resolve_cost_source(model: ModelSpec, hardware: HardwareSpec, tp: int = 1,
                        costs: str = "auto") -> CostSource:
    """The cost model a command prices with, and its source.

    ``costs``: ``auto`` (the first of :data:`AUTO_SOURCES` that applies — the shipped
    calibration for this hardware and model, at tp = 1, covering every policy — else the
    roofline, its note saying why), ``roofline``, ``calibrated`` (the shipped calibration,
    required), or a path to a calibration file.
    """
    if costs == "roofline":
        return _roofline(model, hardware, tp)
    if costs in ("auto", "calibrated"):
        reasons = []
        for source in AUTO_SOURCES:
            try:
                return source(model, hardware, tp, required=costs == "calibrated")
            except _NotHere as why:
                reasons.append(str(why))
        return _roofline(model, hardware, tp, "; ".join(reasons))
    if os.path.exists(costs):
        from specsim.costs.calibration_file import read_calibration
        return _calibrated(read_calibration(str(costs)), model, hardware, tp)
    raise SpecsimError(f"--costs must be auto, roofline, calibrated or a calibration file; "
                       f"'{costs}' is none of these")


def make_cost_model(model: ModelSpec, hardware: HardwareSpec, tp: int = 1,
                    costs: str = "auto") -> tuple[CostModel, str]:
    """:func:`resolve_cost_source` as (cost model, note)."""
    source = resolve_cost_source(model, hardware, tp, costs)
    return source.cost_model, source.note
