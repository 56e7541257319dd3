"""Cost models behind one interface (:class:`~specsim.costs.base.CostModel`)."""
from specsim.costs.base import Cost, CostModel, IterationCost
from specsim.costs.roofline import RooflineCostModel, decode_floor_s

__all__ = ["Cost", "CostModel", "IterationCost", "RooflineCostModel", "decode_floor_s"]


def shipped_calibration(model, hardware):
    """Path of the calibration shipped for (hardware, model), or None:
    ``models/calibrations/<hardware key>/<model name>.json``."""
    from specsim.specs import catalog_dir
    path = catalog_dir() / "calibrations" / hardware.key / f"{model.name}.json"
    return path if hardware.key and path.is_file() else None


def uncovered_policies(calibration) -> list[str]:
    """Sparse policies a calibration has no draft measurements for."""
    from specsim.policies import SELECTION_POLICIES
    measured = {m.op.split(":", 1)[1] for m in calibration.measurements
                if m.op.startswith("draft:")}
    return [p for p in SELECTION_POLICIES if p not in measured]


def make_cost_model(model, hardware, tp: int = 1, costs: str = "auto"):
    """The cost model a command uses, and a note saying which and why.

    ``costs``: ``auto`` (the shipped calibration for this hardware and model when there is one,
    tp = 1 and it covers every policy — else the roofline, so that policies are compared on one
    cost model), ``roofline``, ``calibrated`` (the shipped one, required), or a path to a
    calibration file.
    """
    import os

    from specsim.costs.calibrated import CalibratedCostModel, read_calibration
    from specsim.errors import SpecsimError

    if costs == "roofline":
        return RooflineCostModel(model, hardware, tp), "roofline cost model"
    if costs in ("auto", "calibrated"):
        path = shipped_calibration(model, hardware)
        if path is None or tp != 1:
            if costs == "calibrated":
                raise SpecsimError(f"no shipped calibration for {model.name} on "
                                   f"'{hardware.key}'" + (" at tp=1" if tp != 1 else "")
                                   + "; run `specsim calibrate --gpu` or use --costs roofline")
            why = "tensor parallelism" if path is not None else "no calibration shipped"
            return RooflineCostModel(model, hardware, tp), f"roofline cost model ({why})"
        missing = uncovered_policies(read_calibration(str(path)))
        if missing and costs == "auto":
            # mixing measured and roofline costs across policies would bias the comparison
            return RooflineCostModel(model, hardware, tp), (
                f"roofline cost model (the shipped calibration {path.name} does not cover "
                f"{', '.join(missing)}; pass --costs {path} to use it anyway)")
    elif os.path.exists(costs):
        path = costs
    else:
        raise SpecsimError(f"--costs must be auto, roofline, calibrated or a calibration file; "
                           f"'{costs}' is none of these")
    cm = CalibratedCostModel(read_calibration(str(path)), model, hardware, tp)
    note = f"calibrated cost model ({_shown(path)}; {engine_summary(cm.calibration)})"
    if cm.warnings:
        note += "; WARNING: " + "; ".join(cm.warnings)
    return cm, note


def engine_summary(calibration) -> str:
    """How the calibrated engine wrote its one new position, ranked its lists and cut keys
    into chunks (its ``provenance.engine``, ``engine_setting``)."""
    from specsim.costs.calibrated import engine_setting
    engine = calibration.provenance.get("engine", {})
    writes = "fused cache append" if engine_setting(engine, "fused_append") \
        else "torch cache writes"
    splits = {"sm": "chunks per multiprocessor", "waves": "whole-wave chunks"}.get(
        engine_setting(engine, "verify_splits"), engine_setting(engine, "verify_splits"))
    summed = ", summed Collect-2-Query" if engine_setting(engine, "c2q") == "sum" else ""
    return f"{writes}, {engine_setting(engine, 'ranking')} ranking, {splits}{summed}"


def _shown(path) -> str:
    """A shipped calibration's path as its name in the repository (reports get committed: an
    absolute path names one machine's checkout), any other path as given."""
    from specsim.shipped import display_name
    return display_name(path)
