"""Which trace format a file holds, judged from its content (not its name).

The first non-empty line decides between JSON and Prometheus text: a JSON object is a native
trace (a ``"specsim_trace"`` header), Spec-Bench answers (``choices[].accept_lengths``), vLLM
per-request statistics, SGLang responses (``meta_info.spec_verify_ct``), AIPerf records
(``metadata``, ``metrics``) or SGLang server information (``speculative_algorithm``), asked in
that order; a first line that is not a whole JSON object (``{`` of a pretty-printed document)
is read as one JSON document, which must be SGLang server information. Otherwise the first 20
non-empty lines must be Prometheus exposition lines (samples, ``# HELP``, ``# TYPE``) or
comments, and the first metric named ``sglang:...`` or ``vllm:...`` in the file tells SGLang's
dump from vLLM's (vLLM's when neither appears, for its own error).
"""
from __future__ import annotations

import os

from specsim.errors import TraceError, quote
from specsim.traces.format import parse_json_line, text_lines
from specsim.traces.importers import (aiperf, native, sglang_metrics, sglang_requests,
                                      sglang_server_info, specbench, vllm_metrics,
                                      vllm_requests)

_MODULES = (native, vllm_metrics, vllm_requests, specbench, sglang_metrics, sglang_requests,
            sglang_server_info, aiperf)
#: Formats :func:`~specsim.traces.importers.load_trace` understands, as its ``format`` takes them.
FORMATS = tuple(module.NAME for module in _MODULES)

#: The formats with what each holds, for error messages that cannot tell the format.
FORMAT_HELP = "known formats: " + ", ".join(
    f"'{module.NAME}' ({module.SUMMARY})" for module in _MODULES)

_JSON_FORMATS = (native, specbench, vllm_requests, sglang_requests, aiperf, sglang_server_info)
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
            whole = _whole_document(path)
            if whole is not None:
                return whole
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
        return _prometheus_engine(path)
    raise TraceError("only comments: cannot tell the format; " + FORMAT_HELP, path=path,
                     line=lines[0][0])


def _whole_document(path: str) -> str | None:
    """The format of a file that is one JSON document over many lines, or None."""
    try:
        obj, _ = sglang_server_info.read_document(path)
    except TraceError:
        return None
    return sglang_server_info.NAME if sglang_server_info.recognises(obj) else None


def _prometheus_engine(path: str) -> str:
    """sglang-metrics when the first metric of SGLang's or vLLM's in the dump is SGLang's."""
    for _, text in text_lines(path):
        stripped = text.strip()
        if stripped == "# EOF":
            break
        if stripped.startswith(("# HELP ", "# TYPE ")):
            stripped = stripped[len("# HELP "):]
        if sglang_metrics.recognises_name(stripped):
            return sglang_metrics.NAME
        if stripped.startswith(("vllm:", "vllm_")):
            break
    return vllm_metrics.NAME
