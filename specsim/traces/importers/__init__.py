"""Importers: turn what real systems record into specsim traces (format v1).

One module per input format, each with its ``NAME`` (as :data:`FORMATS` lists it), what its
content looks like, and its importer:

* :mod:`~specsim.traces.importers.native` ``specsim``: the native format
  (:mod:`specsim.traces.format`).
* :mod:`~specsim.traces.importers.vllm_metrics` ``vllm-metrics``: a dump of vLLM's Prometheus
  ``/metrics`` endpoint; one histogram record per label set.
* :mod:`~specsim.traces.importers.vllm_requests` ``vllm-requests``: vLLM's per-request
  spec-decode statistics as JSON Lines; request or histogram records.
* :mod:`~specsim.traces.importers.specbench` ``specbench``: Spec-Bench answer files; one
  request record per (question, choice).
* :mod:`~specsim.traces.importers.sglang_metrics` ``sglang-metrics``: a dump of SGLang's
  ``/metrics``; mean accept lengths as geometric histogram records.
* :mod:`~specsim.traces.importers.sglang_requests` ``sglang-requests``: SGLang ``/generate``
  responses as JSON Lines; one histogram record per request.
* :mod:`~specsim.traces.importers.sglang_server_info` ``sglang-server-info``: SGLang's
  ``/server_info`` document; the drafter and k, and a geometric histogram per rank.
* :mod:`~specsim.traces.importers.aiperf` ``aiperf``: NVIDIA AIPerf ``profile_export.jsonl``
  records with ``spec_decode_acceptance``; request or histogram records.

:func:`load_trace` detects the format (:mod:`~specsim.traces.importers.detect`) and
dispatches. Every importer validates its input and raises :class:`~specsim.errors.TraceError`
naming the file, the line and the field; every record it builds is re-validated by
:func:`~specsim.traces.format.parse_record`. Data problems that do not make the input wrong
(e.g. fewer drafted tokens than ``k * num_drafts``) are issued as :class:`TraceImportWarning`
and listed in the header under ``"import_warnings"``.

A path that is not a regular file (``-`` for standard input, a pipe, ``/dev/stdin``) is read
once into a temporary file, so that detecting the format and importing see the same bytes;
errors still name the path given.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import stat
import sys
import tempfile

from specsim.errors import TraceError, quote
from specsim.traces.format import GZIP_MAX_BYTES, Trace
from specsim.traces.importers import (aiperf, native, sglang_metrics, sglang_requests,
                                      sglang_server_info, specbench, vllm_metrics,
                                      vllm_requests)
from specsim.traces.importers.common import TraceImportWarning
from specsim.traces.importers.detect import FORMAT_HELP, FORMATS, detect_format
from specsim.traces.importers.specbench import import_specbench
from specsim.traces.importers.vllm_metrics import import_vllm_metrics
from specsim.traces.importers.vllm_requests import import_vllm_requests

__all__ = ["FORMATS", "TraceImportWarning", "detect_format", "load_trace", "import_vllm_metrics",
           "import_vllm_requests", "import_specbench", "readable_copy"]

_IMPORTERS = {native.NAME: native.import_native, vllm_metrics.NAME: import_vllm_metrics,
              vllm_requests.NAME: import_vllm_requests, specbench.NAME: import_specbench,
              sglang_metrics.NAME: sglang_metrics.import_sglang_metrics,
              sglang_requests.NAME: sglang_requests.import_sglang_requests,
              sglang_server_info.NAME: sglang_server_info.import_sglang_server_info,
              aiperf.NAME: aiperf.import_aiperf}


def load_trace(path: str | os.PathLike, format: str | None = None, *, per_draft: bool = True,
               **options) -> Trace:
    """Read any supported trace: ``format`` is one of :data:`FORMATS` or None to detect it.

    ``options`` go to the importer (``policy``, ``s``; ``k`` for all but the native and vLLM
    metrics formats; ``server_info`` for sglang-requests);
    a native trace takes none. ``per_draft`` False keeps no per-draft fields (``entropy``,
    ``accept_prob``; they are still validated): a reader of (context, k, m) alone, such as
    ``predict``, then holds a few numpy arrays per request and nothing per draft.
    """
    path = str(path)
    with readable_copy(path) as readable:
        try:
            trace = _load(readable, format, options, per_draft)
            if readable != path:
                shown = "standard input" if path == "-" else os.path.basename(path)
                source = str(trace.header.get("source", ""))
                if "import_format" in trace.header and source.endswith(": input"):
                    trace.header["source"] = source[:-len("input")] + shown
                trace.path = path
            return trace
        except TraceError as exc:
            if readable == path:
                raise
            raise TraceError(exc.reason, path=path, line=exc.line, field=exc.field) from None


@contextlib.contextmanager
def readable_copy(path: str, limit: int = GZIP_MAX_BYTES):
    """``path`` itself when it is a regular file (or missing: the importer says so), else a
    temporary copy of what it holds (``-``: standard input; a pipe, a device), at most
    ``limit`` bytes, removed on exit: a file that can be read more than once."""
    if path != "-":
        try:
            mode = os.stat(path).st_mode
        except OSError:
            yield path
            return
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            yield path
            return
    with tempfile.TemporaryDirectory(prefix="specsim-input-") as folder:
        copy = os.path.join(folder, "input")
        try:
            source = sys.stdin.buffer if path == "-" else open(path, "rb")
        except OSError as exc:
            raise TraceError(f"cannot read: {exc.strerror}", path=path) from None
        with open(copy, "wb") as out:
            shutil.copyfileobj(_capped(source, path, limit), out)
        if path != "-":
            source.close()
        yield copy


def _capped(source, path: str, limit: int):
    """A reader of ``source`` that refuses more than ``limit`` bytes."""
    class Reader:
        total = 0

        def read(self, size=-1):
            chunk = source.read(1 << 20 if size is None or size < 0 else size)
            Reader.total += len(chunk)
            if Reader.total > limit:
                raise TraceError(f"input larger than {limit} bytes", path=path)
            return chunk
    return Reader()


def _load(path: str, format: str | None, options: dict, per_draft: bool = True) -> Trace:
    name = detect_format(path) if format is None else format
    if name not in _IMPORTERS:
        raise TraceError(f"unknown trace format {quote(name)}; " + FORMAT_HELP, path=path)
    importer = _IMPORTERS[name]
    if name != native.NAME:
        known = [p for p in inspect.signature(importer).parameters if p != "path"]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TraceError(f"options {unknown} do not apply to {name} traces (it takes "
                             f"{', '.join(known)})", path=path)
    if name == native.NAME:
        return importer(path, per_draft=per_draft, **options)
    trace = importer(path, **options)
    if not per_draft:
        for r in trace.requests:
            r.entropy = r.accept_prob = None
    return trace
