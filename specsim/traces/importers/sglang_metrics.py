"""Importer for a dump of SGLang's Prometheus ``/metrics`` endpoint (text exposition format).

Schema: SGLang 0.5.23 (PyPI wheel), ``sglang/srt/observability/metrics_collector.py``; the
same gauges exist as far back as ``python/sglang/srt/metrics/collector.py``. SGLang exports
its speculative decoding as averages, never as per-position counts:

* gauges of the scheduler (labels ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``,
  ``moe_ep_rank``, optionally ``dp_rank``, ``priority``), written at every decode log (each
  ``--decode-log-interval`` batches) with ``multiprocess_mode="mostrecent"``:

  - ``sglang:spec_accept_length``: (accepted drafts + bonus) / verify steps over the last log
    interval, i.e. E[m+1] of that interval; 0 when speculation is off;
  - ``sglang:spec_accept_rate``: accepted / proposed drafts of that interval (recorded only;
    older SGLang divided (accepted + bonus) by the verify tokens instead);
  - ``sglang:spec_num_steps``: the active ``--speculative-num-steps``, the longest chain of
    drafts a step can accept: specsim's k;
  - ``sglang:spec_num_draft_tokens``: the active ``--speculative-num-draft-tokens`` (tokens
    verified a step; above k + 1 under tree drafting, ``--speculative-eagle-topk`` > 1).

* counters of the tokenizer (labels ``model_name``, ``engine_type``, plus ``is_streaming`` on
  the token and request counters), added to when a request finishes:
  ``sglang:spec_verify_calls_total`` (verify steps), ``sglang:generation_tokens_total``
  (completion tokens) and ``sglang:num_requests_total``.

How ranks combine: the scheduler gauges of one scheduler are copies across its tensor-,
pipeline- and expert-parallel ranks (``tp_rank``, ``pp_rank``, ``moe_ep_rank``): their mean
is taken, and a warning says when they differ. Data-parallel ranks (``dp_rank``) run batches
of their own: each keeps its own record, never averaged (their intervals hold different step
counts). Counters sum over every label set of one ``model_name`` (``is_streaming``,
``priority``).

What becomes the trace: with the counters, one histogram record over the server's life, of
``spec_verify_calls_total`` steps with E[m+1] = (generation_tokens − num_requests) /
verify_calls (each request's first token comes from the prefill, not from a verify step);
without them, one record per scheduler from its ``spec_accept_length`` gauge, at a nominal
:data:`NOMINAL_STEPS` steps. A mean alone does not say how acceptance falls along the draft,
so the histogram assumes the same acceptance p at every position (geometric; p solves
``1 + p + … + p^k = E[m+1]``), and says so in an import warning. k is the importer's ``k``,
else ``sglang:spec_num_steps``.

The exposition is read as the vLLM importer reads it: OpenMetrics exemplars and timestamps are
ignored, ``# EOF`` ends the dump, CRLF line ends and a byte-order mark are taken.

Capture: ``curl -s http://<server>:30000/metrics > metrics.prom`` (server started with
``--enable-metrics``) after the workload has run.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from specsim.analytical import MAX_K
from specsim.errors import TraceError, quote
from specsim.traces.format import MAX_INT, HistogramTrace, Trace
from specsim.traces.importers.common import (check_k, check_policy, check_sparsity,
                                             geometric_counts, geometric_rate, import_header,
                                             single_model, validated, warn)
from specsim.traces.importers.vllm_metrics import label_text, metric_samples, unique_sample

NAME = "sglang-metrics"
SUMMARY = "Prometheus text from SGLang's /metrics"

#: the steps a record built from a gauge's mean alone is given (the dump does not count them)
NOMINAL_STEPS = 10000

_GAUGES = {"spec_accept_length": "length", "spec_accept_rate": "rate",
           "spec_num_steps": "steps", "spec_num_draft_tokens": "draft_tokens"}
_COUNTERS = {"spec_verify_calls": "verify", "generation_tokens": "generated",
             "num_requests": "requests"}
_COPY_LABELS = ("tp_rank", "pp_rank", "moe_ep_rank")
_LENGTH = "sglang:spec_accept_length"
_STEPS = "sglang:spec_num_steps"


def recognises_name(name: str) -> bool:
    """Whether a metric name is one of SGLang's (``sglang:`` or ``sglang_``)."""
    return name.startswith(("sglang:", "sglang_"))


def _kind(name: str) -> tuple[str, str] | None:
    """('gauge' | 'counter', quantity) of a sample name, or None for any other sample."""
    if not recognises_name(name) or name.endswith("_created"):
        return None
    base = name[len("sglang:"):]
    if base in _GAUGES:
        return "gauge", _GAUGES[base]
    if base.endswith("_total") and base[:-len("_total")] in _COUNTERS:
        return "counter", _COUNTERS[base[:-len("_total")]]
    return None


@dataclass
class _Value:
    value: float
    line: int
    field: str


@dataclass
class _Scheduler:
    """The gauges of one scheduler (a label set without the rank labels that copy it)."""

    labels: tuple[tuple[str, str], ...]
    first_line: int
    gauges: dict[str, list[_Value]] = field(default_factory=dict)

    def value(self, quantity: str, notes: list[str]) -> _Value | None:
        """The mean over the copies of ``quantity`` (a warning when they differ)."""
        copies = self.gauges.get(quantity)
        if not copies:
            return None
        values = [c.value for c in copies]
        mean = sum(values) / len(values)
        if max(values) - min(values) > 1e-6 * max(1.0, abs(mean)):
            warn(notes, f"{copies[0].field.split('{')[0]}{{{label_text(self.labels)}}}: the "
                        f"{len(values)} ranks of one scheduler disagree ({min(values):g} .. "
                        f"{max(values):g}); their mean {mean:g} is used")
        return _Value(mean, copies[0].line, copies[0].field)


def _read(path: str):
    """The schedulers' gauges in order of appearance, and the counters summed per model."""
    schedulers: dict[tuple, _Scheduler] = {}
    counters: dict[str, dict[str, _Value]] = {}
    seen: dict[tuple, int] = {}
    for n, name, labels, value, literal, kind in metric_samples(path, _kind):
        fieldname = unique_sample(seen, name, labels, path, n)
        if not math.isfinite(value) or value < 0 or value > MAX_INT:
            raise TraceError(f"expected a finite value in 0..{MAX_INT}, got {quote(literal)}",
                             path=path, line=n, field=fieldname)
        role, quantity = kind
        if role == "counter":
            model = dict(labels).get("model_name", "")
            total = counters.setdefault(model, {})
            before = total.get(quantity)
            total[quantity] = _Value((before.value if before else 0.0) + value,
                                     before.line if before else n, fieldname)
            continue
        rest = tuple(sorted((k, v) for k, v in labels if k not in _COPY_LABELS))
        group = schedulers.setdefault(rest, _Scheduler(rest, n))
        group.gauges.setdefault(quantity, []).append(_Value(value, n, fieldname))
    return sorted(schedulers.values(), key=lambda g: g.first_line), counters


def _whole(v: _Value, path: str, what: str, minimum: int) -> int:
    if abs(v.value - round(v.value)) > 1e-9 or round(v.value) < minimum:
        raise TraceError(f"expected a whole number ≥ {minimum} ({what}), got {v.value:g}",
                         path=path, line=v.line, field=v.field)
    return int(round(v.value))


def _draft_length(schedulers: list[_Scheduler], k: int | None, path: str,
                  notes: list[str]) -> tuple[int, str]:
    """k and where it came from: the importer's ``k``, else ``sglang:spec_num_steps``."""
    if k is not None:
        return k, "the importer's k"
    found = [(v, _whole(v, path, "the server's --speculative-num-steps", 1))
             for g in schedulers if (v := g.value("steps", notes)) is not None]
    if not found:
        raise TraceError(f"no {_STEPS} gauge (SGLang before 0.5.x exports none): give the "
                         f"importer's k (the server's --speculative-num-steps)", path=path,
                         field=_STEPS)
    values = sorted({s for _, s in found})
    if len(values) > 1:
        last = found[-1][0]
        raise TraceError(f"schedulers report different draft lengths {values}; import them "
                         f"one at a time or give the importer's k", path=path, line=last.line,
                         field=last.field)
    if values[0] > MAX_K:
        v = found[0][0]
        raise TraceError(f"k = {values[0]} is above {MAX_K}, the longest draft specsim "
                         f"models", path=path, line=v.line, field=v.field)
    return values[0], _STEPS


def _check_length(length: float, k: int, v: _Value, path: str) -> None:
    if not 1.0 - 1e-9 <= length <= k + 1 + 1e-9:
        raise TraceError(f"mean accept length E[m+1] = {length:.6g} is outside 1..k+1 = "
                         f"1..{k + 1}: is k (the server's --speculative-num-steps) right?",
                         path=path, line=v.line, field=v.field)


def assumed_shape(length: float, k: int, k_source: str) -> str:
    """The import warning that says what a mean-only import assumes."""
    p = geometric_rate(length, k)
    return (f"only the mean accept length E[m+1] = {length:.4g} is known: acceptance is "
            f"assumed geometric, the same p = {p:.4f} at each of k = {k} positions (k from "
            f"{k_source}); the measured fall of acceptance along the draft is not recorded")


def import_sglang_metrics(path: str | os.PathLike, *, policy: str = "unknown",
                          s: float | None = None, k: int | None = None) -> Trace:
    """Convert an SGLang ``/metrics`` dump into histogram records (see the module docstring
    for which metrics are read, how ranks combine and what is assumed)."""
    path = str(path)
    policy, s, k = check_policy(policy, path), check_sparsity(s, path), check_k(k, path)
    schedulers, counters = _read(path)
    notes: list[str] = []
    with_length = [g for g in schedulers if g.gauges.get("length")]
    usable = {m: c for m, c in counters.items() if "verify" in c and "generated" in c}
    if not with_length and not usable:
        raise TraceError(f"no {_LENGTH} gauge and no sglang:spec_verify_calls_total with "
                         f"sglang:generation_tokens_total counters; is speculative decoding "
                         f"on and is this an SGLang /metrics dump (--enable-metrics)?",
                         path=path, field=_LENGTH)
    k, k_source = _draft_length(schedulers, k, path, notes)
    records: list[HistogramTrace] = []
    for model, c in usable.items():
        verify = _whole(c["verify"], path, "verify steps", 0)
        generated = _whole(c["generated"], path, "completion tokens", 0)
        if verify == 0:
            warn(notes, f"{c['verify'].field}: no verify step recorded; skipped")
            continue
        if "requests" in c:
            first_tokens = _whole(c["requests"], path, "requests", 0)
        else:
            first_tokens = 0
            warn(notes, "no sglang:num_requests_total counter: each request's first token "
                        "(from the prefill) is counted as if a verify step emitted it")
        length = (generated - first_tokens) / verify
        _check_length(length, k, c["verify"], path)
        length = min(max(length, 1.0), k + 1.0)
        warn(notes, assumed_shape(length, k, k_source))
        rid = f"model_name={model}:lifetime" if model else "lifetime"
        records.append(validated(HistogramTrace(rid, policy, s, k,
                                                geometric_counts(length, k, verify)),
                                 path, c["verify"].line))
    if not records:
        for group in with_length:
            v = group.value("length", notes)
            lab = label_text(group.labels)
            if v.value == 0:
                warn(notes, f"{_LENGTH}{{{lab}}} is 0 (no speculative step in the last log "
                            f"interval, or speculation off); skipped")
                continue
            _check_length(v.value, k, v, path)
            length = min(max(v.value, 1.0), k + 1.0)
            warn(notes, f"{{{lab}}}: " + assumed_shape(length, k, k_source)
                 + f"; the gauge is the mean of the last decode log interval only, and the "
                   f"record is given a nominal {NOMINAL_STEPS} steps (the dump does not count "
                   f"them), so bootstrap intervals do not show its sampling error")
            records.append(validated(HistogramTrace(lab or "all", policy, s, k,
                                                    geometric_counts(length, k, NOMINAL_STEPS)),
                                     path, v.line))
    if not records:
        raise TraceError("no scheduler recorded a speculative step", path=path, field=_LENGTH)
    models = [v for g in schedulers for k_, v in g.labels if k_ == "model_name"]
    speculative = {"num_steps": k, "k_source": k_source}
    draft_tokens = [v for g in schedulers if (v := g.value("draft_tokens", [])) is not None]
    if draft_tokens:
        speculative["num_draft_tokens"] = draft_tokens[0].value
        if draft_tokens[0].value > k + 1:
            warn(notes, f"sglang:spec_num_draft_tokens = {draft_tokens[0].value:g} > k + 1 = "
                        f"{k + 1}: tree drafting (--speculative-eagle-topk > 1); specsim costs "
                        f"a chain of k drafts")
    header = import_header(NAME, path, model=single_model(models + list(counters)),
                           context_known=False, notes=notes, speculative=speculative,
                           description="SGLang Prometheus speculative-decoding means, as "
                                       "geometric histograms")
    return Trace(header, [], records, path=path)
