"""Traces: what real systems recorded (format v1), importers, and acceptance estimates."""
from specsim.traces.format import (HistogramTrace, RequestTrace, Trace, make_header, read_trace,
                                   write_trace)

__all__ = ["HistogramTrace", "RequestTrace", "Trace", "make_header", "read_trace", "write_trace"]
