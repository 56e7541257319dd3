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


def import_native(path: str | os.PathLike, *, per_draft: bool = True, **options) -> Trace:
    """Read a native trace; it records policy, s and k itself, so it takes no options.
    ``per_draft``: as :func:`~specsim.traces.format.read_trace` takes it."""
    path = str(path)
    if options:
        raise TraceError(f"options {sorted(options)} only apply to imported formats, not to "
                         f"native specsim traces", path=path)
    return read_trace(path, per_draft=per_draft)
