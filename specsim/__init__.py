"""specsim: how fast sparse-attention self-speculative decoding runs on your model, GPU and
workload, and which draft length k and sparsity s to pick.

The CPU side (this package's top level) imports only numpy/scipy; torch and triton are imported
by ``specsim.kernels`` and ``specsim.engine`` alone, simpy and plotly by the simulator and
dashboards alone.
"""
__version__ = "0.1.0"
