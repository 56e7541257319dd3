"""Which trace format a file holds, judged from its content (not its name).

The first non-empty line decides between JSON Lines and Prometheus text: a JSON object is a
native trace (a ``"specsim_trace"`` header), Spec-Bench answers (``choices[].accept_lengths``)
or vLLM per-request statistics, asked in that order; otherwise the first 20 non-empty lines
must be Prometheus exposition lines (samples, ``# HELP``, ``# TYPE``) or comments.
"""
from __future__ import annotations

import os

from specsim.errors import TraceError, quote
from specsim.traces.format import parse_json_line, text_lines
from specsim.traces.importers import native, specbench, vllm_metrics, vllm_requests

#: Formats :func:`~specsim.traces.importers.load_trace` understands, as its ``format`` takes them.
FORMATS = (native.NAME, vllm_metrics.NAME, vllm_requests.NAME, specbench.NAME)

#: The formats with what each holds, for error messages that cannot tell the format.
FORMAT_HELP = "known formats: " + ", ".join(
    f"'{module.NAME}' ({module.SUMMARY})"
    for module in (native, vllm_metrics, vllm_requests, specbench))

_JSON_FORMATS = (native, specbench, vllm_requests)
_LINES_READ = 20


def detect_format(path: str | os.PathLike) -> str:
    """Which of :data:`FORMATS` the file holds, judged from its first non-empty lines."""
    path = str(path)
    lines = []
    for n, text in text_lines(path):
        if text.strip():
            lines.append((n, text.strip()))
            if len(lines) == _LINES_READ:
                break
    if not lines:
        raise TraceError("empty file: cannot tell its format; " + FORMAT_HELP, path=path)
    n, first = lines[0]
    if first.startswith("{"):
        try:
            obj = parse_json_line(first, path, n)
        except TraceError as exc:
            raise TraceError(f"{exc.reason}; cannot tell the format; " + FORMAT_HELP, path=path,
                             line=n) from None
        if isinstance(obj, dict):
            for module in _JSON_FORMATS:
                if module.recognises(obj):
                    return module.NAME
        raise TraceError("unrecognised JSON: no \"specsim_trace\" header, no "
                         "choices[].accept_lengths, no per-request spec-decode statistics; "
                         + FORMAT_HELP, path=path, line=n)
    prometheus = 0
    for n, text in lines:
        if vllm_metrics.recognises_line(text):
            prometheus += 1
        elif not text.startswith("#"):
            raise TraceError(f"unrecognised content {quote(text)}; " + FORMAT_HELP, path=path,
                             line=n)
    if prometheus:
        return vllm_metrics.NAME
    raise TraceError("only comments: cannot tell the format; " + FORMAT_HELP, path=path,
                     line=lines[0][0])
