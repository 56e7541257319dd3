"""Trace-driven simulation: a SimPy serving engine (continuous batching, memory budget,
policies for k) and a vectorised fast path for single-sequence sweeps."""
from specsim.simulator.arrivals import Arrival, all_at_once, from_file, poisson
from specsim.simulator.engine import SimConfig, Simulation

__all__ = ["Arrival", "SimConfig", "Simulation", "all_at_once", "from_file", "poisson"]
