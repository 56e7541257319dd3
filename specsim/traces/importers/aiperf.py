"""Importer for NVIDIA AIPerf's per-request export, ``profile_export.jsonl`` (one record a line).

Schema: aiperf 0.13.0 (PyPI wheel): ``MetricRecordInfo`` in
``aiperf/common/models/record_models.py`` and ``SpecDecodeAcceptanceRecord`` in
``aiperf/common/models/spec_decode_models.py``::

    {"metadata": {"session_num": 0, "x_request_id": "...", "request_start_ns": ..., ...},
     "metrics": {"input_sequence_length": {"value": 550, "unit": "tokens"}, ...,
                 "spec_decode_acceptance_length": {"value": 2.6, "unit": ""}, ...},
     "spec_decode_acceptance": {"engine": "vllm",
        "mean_acceptance_length": 2.6,           # 1 + accepted / steps
        "draft_acceptance_rate": 0.53,
        "acceptance_histogram": {"0": 4, "1": 3, "3": 6},   # sparse: j -> steps accepting j
        "num_accepted_draft_tokens": 21, "num_draft_tokens": 39, "num_spec_steps": 13,
        "num_spec_tokens": 3,                    # k, or null for variable-length drafting
        "completion_tokens": 35,
        "per_step_accepted": [...] | null, "per_step_drafted": [...] | null},
     "error": null}

``spec_decode_acceptance`` is written at ``--export-level records`` and only where AIPerf's
engine adapter read per-request acceptance from the response (0.13.0 has a vLLM adapter
only); latencies and token counts alone say nothing of acceptance, so a file without it is
refused. Records with an ``error`` or without ``spec_decode_acceptance`` are skipped with a
warning. The statistics are checked and converted as the vLLM per-request importer converts
vLLM's own (:mod:`~specsim.traces.importers.vllm_requests`): ``per_step_accepted`` gives a
request record, the histogram alone a histogram record; the prompt length is the
``input_sequence_length`` metric.

Capture: ``aiperf profile ... --export-level records`` writes ``profile_export.jsonl`` in the
artifact folder.
"""
from __future__ import annotations

import os

from specsim.errors import TraceError, quote
from specsim.traces.format import HistogramTrace, RequestTrace, Trace
from specsim.traces.importers.common import (FieldReader, check_k, check_policy, check_sparsity,
                                             import_header, json_objects, warn)
from specsim.traces.importers.vllm_requests import RequestLine

NAME = "aiperf"
SUMMARY = "AIPerf profile_export.jsonl"

_STATS = "spec_decode_acceptance"
_MAX_J = 10**6


def recognises(first: dict) -> bool:
    """Whether a file whose first JSON object is ``first`` holds AIPerf records."""
    return isinstance(first.get("metadata"), dict) and isinstance(first.get("metrics"), dict) \
        and "session_num" in first["metadata"]


class _AIPerfLine(RequestLine):
    """One AIPerf record: the prompt length is its ``input_sequence_length`` metric."""

    def prompt_length(self) -> int | None:
        metric = self.obj["metrics"].get("input_sequence_length")
        if not isinstance(metric, dict) or metric.get("value") is None:
            return None
        return self.int_value(metric["value"], "metrics.input_sequence_length.value")


def _dense(stats: dict, reader: FieldReader) -> dict:
    """The statistics with the sparse ``acceptance_histogram`` as a list over j = 0..k."""
    field = f"{_STATS}.acceptance_histogram"
    sparse = stats.get("acceptance_histogram")
    if sparse is None:
        return stats
    if not isinstance(sparse, dict):
        reader.fail(field, f"expected an object from accepted count j to steps, got "
                           f"{type(sparse).__name__}")
    hist: dict[int, int] = {}
    for key, count in sparse.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()
                and int(key) <= _MAX_J):
            reader.fail(field, f"expected keys 0..{_MAX_J}, got {quote(key)}")
        hist[int(key)] = reader.int_value(count, f"{field}.{key}")
    k = stats.get("num_spec_tokens")
    width = max(hist, default=0) + 1
    if isinstance(k, int) and not isinstance(k, bool) and width <= k + 1 <= _MAX_J:
        width = k + 1
    out = dict(stats)
    out["acceptance_histogram"] = [hist.get(j, 0) for j in range(max(width, 2))]
    return out


def import_aiperf(path: str | os.PathLike, *, policy: str = "unknown", s: float | None = None,
                  k: int | None = None) -> Trace:
    """Convert AIPerf per-request records into request or histogram records; ``k`` is a
    fallback for records with ``per_step_accepted`` and neither ``num_spec_tokens`` nor
    ``per_step_drafted``."""
    path = str(path)
    policy, s, k = check_policy(policy, path), check_sparsity(s, path), check_k(k, path)
    notes: list[str] = []
    requests: list[RequestTrace] = []
    histograms: list[HistogramTrace] = []
    seen: dict[str, int] = {}
    lines = without = 0
    all_context_known = True
    for n, obj in json_objects(path):
        lines += 1
        reader = FieldReader(path, n)
        if not recognises(obj):
            reader.fail("metadata", "expected an AIPerf record (metadata.session_num, metrics)")
        meta = obj["metadata"]
        rid = meta.get("x_request_id") or meta.get("session_num")
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            reader.fail("metadata.session_num", f"expected an id, got {quote(rid)}")
        rid = str(rid)
        if rid in seen:
            reader.fail("metadata.x_request_id", f"duplicate id {quote(rid)} (first on line "
                                                 f"{seen[rid]})")
        seen[rid] = n
        if obj.get("error") is not None:
            warn(notes, f"line {n} ({rid}): the request failed; skipped")
            continue
        stats = obj.get(_STATS)
        if stats is None:
            without += 1
            continue
        if not isinstance(stats, dict):
            reader.fail(_STATS, f"expected an object, got {type(stats).__name__}")
        line = _AIPerfLine(path, n, obj, f"{_STATS}.", _dense(stats, reader), rid)
        hist = line.histogram()
        if line.stats.get("per_step_accepted") is not None:
            rec, prompt_known = line.steps_record(hist, k, notes, policy, s)
            all_context_known = all_context_known and prompt_known
            if rec is not None:
                requests.append(rec)
        elif hist is None:
            line.fail(f"{_STATS}.acceptance_histogram", "missing (and no per_step_accepted)")
        elif (rec := line.histogram_record(hist, notes, policy, s)) is not None:
            histograms.append(rec)
    if not lines:
        raise TraceError("empty file: no records", path=path, line=1)
    if without:
        warn(notes, f"{without} record(s) without {_STATS} skipped")
    if not requests and not histograms:
        raise TraceError(f"no record has {_STATS}: AIPerf writes it at --export-level records "
                         f"when its engine adapter reads per-request acceptance (0.13.0: vLLM "
                         f"with per-request spec-decode metrics); latencies and token counts "
                         f"do not measure acceptance", path=path, field=_STATS)
    header = import_header(NAME, path, model=None, notes=notes,
                           context_known=bool(requests) and all_context_known,
                           description="AIPerf per-request spec-decode acceptance")
    return Trace(header, requests, histograms, path=path)
