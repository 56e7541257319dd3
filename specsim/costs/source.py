"""Which cost model a command prices with, and where its prices come from: one resolver.

:func:`resolve_cost_source` takes the user's ``--costs`` choice and returns a
:class:`CostSource`: the cost model, the kind of source (a calibration of this model on this
GPU, this GPU's operator tables, or the roofline), the file, and the note reports print.
Under ``auto`` the sources are tried in order of trust (:data:`AUTO_SOURCES`: the model's
shipped calibration, then the shipped operator table of the hardware, composed for the model by
:class:`~specsim.costs.operators.OperatorCostModel`, then another GPU's shipped operator table
scaled to this one (:mod:`specsim.costs.scaled`, flagged as unvalidated); the roofline prices
what none covers); each says why it does not apply, and a later source's note says why the
earlier ones did not.
"""
from __future__ import annotations

import dataclasses
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
    kind: str          # "calibration" | "operators" | "scaled-operators" | "roofline"
    note: str                     # what reports print: which model, from what, and why
    path: str | None = None       # the calibration file or operator table
    fallback: str | None = None   # why a calibration was not used, where one was wanted
    validated: str = ""           # what the shipped validation runs say of this source here


class _NotHere(Exception):
    """A source that does not apply: why (the roofline's note names it). A ``quiet`` reason
    (no table of this kind exists for the hardware) is named in the note, not in the
    source's ``fallback``."""

    def __init__(self, why: str, quiet: bool = False):
        super().__init__(why)
        self.quiet = quiet


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
    cm.prefill_table = shipped_operator_table(hardware)
    # a shipped file by its name in the repository (reports get committed: an absolute path
    # names one machine's checkout), any other path as given
    note = (f"calibrated cost model ({display_name(calibration.path)}; "
            f"{engine_summary(calibration)})")
    if cm.warnings:
        note += "; WARNING: " + "; ".join(cm.warnings)
    return CostSource(cm, "calibration", note, str(calibration.path))


def _roofline(model, hardware, tp, why: str | None = None, said: str | None = None
              ) -> CostSource:
    """The roofline; ``why`` more trusted sources were not used, ``said`` what the note
    says about them (default ``why``)."""
    said = said or why
    note = "roofline cost model" + (f" ({said})" if said else "")
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


def shipped_operator_table(hardware: HardwareSpec) -> Path | None:
    """Path of the operator table shipped for ``hardware``, or None:
    ``models/operators/<hardware key>.json`` in the catalogue."""
    from specsim.shipped import catalog_file
    path = catalog_file(f"operators/{hardware.key}.json")
    return path if hardware.key and path.is_file() else None


def _operators(table, model, hardware, tp) -> CostSource:
    from specsim.costs.operators import OperatorCostModel
    from specsim.shipped import display_name

    if tp != 1:
        raise SpecsimError("operator tables are measured on one GPU; use --costs roofline "
                           "for tensor parallelism")
    from specsim.costs.fitted import fitted_for

    fitted = fitted_for(table, model, hardware)
    cm = OperatorCostModel(table, model, hardware, tp, fitted=fitted)
    prov = table.provenance
    note = (f"operator cost model: {model.name} composed from measured operators "
            f"({display_name(table.path)}; {prov.get('gpu')}, {prov.get('date')}, engine "
            f"settings {prov['engine'].get('settings_hash')}"
            + ("" if prov.get("complete") else "; an incomplete table") + "; "
            + ("residuals and loop overheads " + fitted.source if fitted else
               f"no other model's calibration on '{hardware.key}': residuals and loop "
               f"overheads not fitted") + ")")
    warnings = list(cm.warnings) + [f"not fitted on {x}" for x in
                                     (fitted.skipped if fitted else ())]
    if warnings:
        note += "; WARNING: " + "; ".join(warnings)
    return CostSource(cm, "operators", note, str(table.path))


def shipped_operator_source(model, hardware, tp, required: bool) -> CostSource:
    """This hardware's shipped operator table composed for ``model``, at tp = 1."""
    from specsim.costs.operator_file import read_operator_table

    path = shipped_operator_table(hardware)
    if path is None or tp != 1:
        if required:
            raise SpecsimError(f"no shipped operator table for '{hardware.key}'"
                               + (" at tp=1" if tp != 1 else "")
                               + "; run `specsim calibrate --gpu --operators` or use "
                                 "--costs roofline")
        if path is None:
            raise _NotHere(f"no operator table shipped for '{hardware.key}'", quiet=True)
        raise _NotHere("tensor parallelism")
    return _operators(read_operator_table(str(path)), model, hardware, tp)


def other_gpu_table(hardware: HardwareSpec) -> Path | None:
    """A shipped operator table of another GPU to scale to ``hardware`` (the H200's where it
    ships, else the first by name), or None."""
    from specsim.shipped import catalog_file, catalog_names

    stems = [n[:-len(".json")] for n in catalog_names("operators", "*.json")
             if n.endswith(".json") and n[:-len(".json")] != hardware.key]
    if not stems:
        return None
    stem = "h200" if "h200" in stems else stems[0]
    return catalog_file(f"operators/{stem}.json")


def scaled_operator_source(model, hardware, tp, required: bool) -> CostSource:
    """Another GPU's shipped operator table scaled to ``hardware`` by the two GPUs' ceilings
    (:mod:`specsim.costs.scaled`), at tp = 1, where ``hardware`` has no table of its own."""
    from specsim.costs.fitted import fitted_for
    from specsim.costs.operator_file import read_operator_table
    from specsim.costs.operators import OperatorCostModel
    from specsim.costs.scaled import scaled_table
    from specsim.shipped import display_name
    from specsim.specs import load_hardware

    if shipped_operator_table(hardware) is not None:
        raise _NotHere(f"'{hardware.key}' has its own operator table", quiet=True)
    path = other_gpu_table(hardware)
    if path is None or tp != 1:
        raise _NotHere("no operator table of another GPU to scale" if path is None else
                       "tensor parallelism", quiet=path is None)
    table = read_operator_table(str(path))
    source_hw = load_hardware(path.stem)
    scaled, notes = scaled_table(table, source_hw, hardware)
    fitted = fitted_for(table, model, source_hw)
    cm = OperatorCostModel(scaled, model, hardware, tp, fitted=fitted)
    cm.warnings = notes + cm.warnings
    cm.source = f"{display_name(path)} scaled to {hardware.key}"
    note = (f"SCALED operator cost model: {model.name} composed from {source_hw.name}'s "
            f"operators ({display_name(path)}, {table.provenance.get('date')}) scaled to "
            f"{hardware.name}"
            + (f"; residuals and loop overheads {fitted.source} on {source_hw.key}"
               if fitted else "") + "; WARNING: " + "; ".join(cm.warnings))
    return CostSource(cm, "scaled-operators", note, str(path))


#: The sources ``auto`` tries, most trusted first; the roofline prices what none covers.
AUTO_SOURCES = (shipped_calibration_source, shipped_operator_source, scaled_operator_source)


def _joined(reasons, quiet: bool = True) -> str | None:
    """The reasons, each once, in order (without the quiet ones unless ``quiet``)."""
    texts = [str(r) for r in reasons if quiet or not getattr(r, "quiet", False)]
    return "; ".join(dict.fromkeys(texts)) or None


def _is_operator_table(path: str) -> bool:
    """Whether the JSON file at ``path`` is an operator table (by its format key)."""
    from specsim.costs.operator_file import FORMAT_KEY
    try:
        with open(path, encoding="utf-8") as fh:
            head = fh.read(256)
    except (OSError, UnicodeDecodeError):
        return False
    return f'"{FORMAT_KEY}"' in head


def resolve_cost_source(model: ModelSpec, hardware: HardwareSpec, tp: int = 1,
                        costs: str = "auto") -> CostSource:
    """The cost model a command prices with, its source, and what the shipped validation runs
    say of that source for this model and GPU (:func:`_resolve`)."""
    from specsim.costs.validated import validation_note

    found = _resolve(model, hardware, tp, costs)
    if costs not in KEYWORDS:
        return dataclasses.replace(found, validated=f"{costs} is a file of your own: no "
                                                    f"shipped validation run priced by it")
    return dataclasses.replace(found, validated=validation_note(found.kind, model.name,
                                                                hardware.key))


#: The --costs choices that are not files.
KEYWORDS = ("auto", "roofline", "calibrated", "operators")


def _resolve(model: ModelSpec, hardware: HardwareSpec, tp: int, costs: str) -> CostSource:
    """The cost model a command prices with, and its source.

    ``costs``: ``auto`` (the first of :data:`AUTO_SOURCES` that applies — the shipped
    calibration for this hardware and model, at tp = 1, covering every policy; then this
    hardware's shipped operator table, at tp = 1; then another GPU's table scaled to this one —
    else the roofline; a later source's note says why the earlier ones did not apply),
    ``roofline``, ``calibrated`` (the shipped calibration, required), ``operators`` (this
    hardware's shipped operator table, else another GPU's scaled to it; required), or a path to
    a calibration file or an operator table.
    """
    if costs == "roofline":
        return _roofline(model, hardware, tp)
    if costs == "calibrated":
        return shipped_calibration_source(model, hardware, tp, required=True)
    if costs == "operators":
        if shipped_operator_table(hardware) is None and tp == 1 and \
                other_gpu_table(hardware) is not None:
            return scaled_operator_source(model, hardware, tp, required=True)
        return shipped_operator_source(model, hardware, tp, required=True)
    if costs == "auto":
        reasons: list[_NotHere] = []
        for source in AUTO_SOURCES:
            try:
                found = source(model, hardware, tp, required=False)
            except _NotHere as why:
                reasons.append(why)
                continue
            if not reasons:
                return found
            why = _joined(reasons, quiet=False)
            return dataclasses.replace(found, note=f"{found.note} (not calibrated: "
                                                   f"{_joined(reasons)})", fallback=why)
        return _roofline(model, hardware, tp, _joined(reasons, quiet=False), _joined(reasons))
    if os.path.exists(costs):
        if _is_operator_table(costs):
            from specsim.costs.operator_file import read_operator_table
            return _operators(read_operator_table(str(costs)), model, hardware, tp)
        from specsim.costs.calibration_file import read_calibration
        return _calibrated(read_calibration(str(costs)), model, hardware, tp)
    raise SpecsimError(f"--costs must be auto, roofline, calibrated, operators, a calibration "
                       f"file or an operator table; '{costs}' is none of these")


def make_cost_model(model: ModelSpec, hardware: HardwareSpec, tp: int = 1,
                    costs: str = "auto") -> tuple[CostModel, str]:
    """:func:`resolve_cost_source` as (cost model, note)."""
    source = resolve_cost_source(model, hardware, tp, costs)
    return source.cost_model, source.note
