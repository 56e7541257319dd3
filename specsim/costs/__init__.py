"""Cost models behind one interface (:class:`~specsim.costs.base.CostModel`), and the one
resolver that picks which a command prices with.

- :mod:`~specsim.costs.base`: the interface, :class:`Cost`, :class:`IterationCost`;
- :mod:`~specsim.costs.roofline`: bytes and FLOPs over the hardware's ceilings;
- :mod:`~specsim.costs.calibration_file`: the measured tables' file format and validation;
- :mod:`~specsim.costs.provenance`: what a file's provenance says to its user;
- :mod:`~specsim.costs.merging`: combining two files' rows without mixing two engines;
- :mod:`~specsim.costs.fitting`: monotone fits and measured grids;
- :mod:`~specsim.costs.calibrated`: the calibrated cost model;
- :mod:`~specsim.costs.held_out`: a calibration's held-out check;
- :mod:`~specsim.costs.operator_file`: a GPU's operator tables (the file format);
- :mod:`~specsim.costs.operators`: any model's steps composed from those operators;
- :mod:`~specsim.costs.composition`: the composed steps against a model's own calibration;
- :mod:`~specsim.costs.source`: the cost source resolver.

The names below are the package's public API, importable from ``specsim.costs``.
"""
from specsim.costs.base import Cost, CostModel, IterationCost
from specsim.costs.roofline import RooflineCostModel, decode_floor_s
from specsim.costs.source import CostSource, make_cost_model, resolve_cost_source

__all__ = ["Cost", "CostModel", "CostSource", "IterationCost", "RooflineCostModel",
           "decode_floor_s", "make_cost_model", "resolve_cost_source"]
