"""Cost models behind one interface (:class:`~specsim.costs.base.CostModel`)."""
from specsim.costs.base import Cost, CostModel, IterationCost
from specsim.costs.roofline import RooflineCostModel, decode_floor_s

__all__ = ["Cost", "CostModel", "IterationCost", "RooflineCostModel", "decode_floor_s"]
