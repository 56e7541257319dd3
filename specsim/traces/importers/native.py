"""The native specsim trace format (:mod:`specsim.traces.format`) as one of the importers'
formats: JSON Lines whose first line is a ``"specsim_trace"`` header."""
from __future__ import annotations

import os

from specsim.errors import TraceError
from specsim.traces.format import HEADER_KEY, Trace, read_trace

NAME = "specsim"
SUMMARY = "native JSON Lines with a \"specsim_trace\" header"


def recognises(first: dict) -> bool:
    """Whether a file whose first JSON object is ``first`` holds a native trace."""
    return HEADER_KEY in first


def import_native(path: str | os.PathLike, **options) -> Trace:
    """Read a native trace; it records policy, s and k itself, so it takes no options."""
    path = str(path)
    if options:
        raise TraceError(f"options {sorted(options)} only apply to imported formats, not to "
                         f"native specsim traces", path=path)
    return read_trace(path)
