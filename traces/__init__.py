"""Shipped data, installed as ``specsim.data.traces``: read it through ``specsim.shipped``."""
