"""Shipped data, installed as ``specsim.data.models``: read it through ``specsim.shipped``."""
