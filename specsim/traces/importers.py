"""Importers: turn what real systems record into specsim traces (format v1).

Four input formats are recognised (:data:`FORMATS`); :func:`load_trace` detects which one a
file holds and dispatches:

``specsim``
    The native format (:mod:`specsim.traces.format`), read by
    :func:`~specsim.traces.format.read_trace`.

``vllm-metrics``
    A dump of vLLM's Prometheus ``/metrics`` endpoint (text exposition format). vLLM V1
    (``vllm/v1/spec_decode/metrics.py``, class ``SpecDecodingProm``) registers four counters
    with the label names ``["model_name", "engine"]`` (``vllm/v1/metrics/loggers.py``); the
    Prometheus client appends ``_total`` to counter samples and also writes ``_created`` samples
    (ignored here)::

        vllm:spec_decode_num_drafts_total{engine="0",model_name="m"}          # drafts (steps)
        vllm:spec_decode_num_draft_tokens_total{...}                          # drafted tokens
        vllm:spec_decode_num_accepted_tokens_total{...}                       # accepted drafts
        vllm:spec_decode_num_accepted_tokens_per_pos_total{...,position="i"}  # i = 0..k-1

    ``SpecDecodingStats.observe_draft`` adds 1 to ``per_pos[i]`` for every ``i <
    num_accepted_tokens`` of a draft, so ``per_pos[i] / num_drafts`` is the *survival*
    P(accepted ≥ i+1), not a conditional rate. With A_0 = num_drafts, A_i = per_pos[i-1] and
    A_{k+1} = 0, the histogram of accepted drafts is ``counts[m] = A_m - A_{m+1}``.
    ``num_draft_tokens`` can be below ``k * num_drafts`` (vLLM subtracts drafts invalidated by
    structured output, and some proposers draft fewer than k); that is reported as a warning,
    never silently ignored. One histogram record per label set other than ``position``.

``vllm-requests``
    JSON Lines, one request per line, holding vLLM's per-request spec-decode statistics.
    What vLLM exposes per request (fields accepted here, in the order they are looked up):

    * vLLM ≥ PR #48915 (``--per-request-spec-decode-metrics summary|detailed``), OpenAI response
      object ``metrics.speculative_decoding`` (offline: ``CompletionOutput.spec_decode_metrics``)::

          {"acceptance_histogram": [39, 1, 0, 3],   # index j: steps that accepted exactly j drafts
           "num_spec_steps": 43,                   # = sum of the histogram
           "num_accepted_draft_tokens": 10,        # excludes the bonus token
           "num_draft_tokens": 129,                # after structured-output invalidation
           "num_spec_tokens": 3,                   # configured k; histogram length is k+1
           "per_step_accepted": [...],             # detailed only: accepted drafts per step
           "per_step_drafted": [...]}              # detailed only: drafts proposed per step

      The prompt length comes from ``usage.prompt_tokens`` in that response.
    * vLLM V0 ``RequestOutput.metrics.spec_token_acceptance_counts``: a list of length k+1 where
      entry 0 is the number of steps and entry i the number of steps that accepted ≥ i drafts
      (survival counts, converted like the Prometheus counters).

    The statistics object is taken from the first of ``metrics.speculative_decoding``,
    ``speculative_decoding``, ``spec_decode_metrics``, ``metrics`` and the line itself that holds
    ``acceptance_histogram``, ``per_step_accepted`` or ``spec_token_acceptance_counts``.
    Accepted aliases: steps ``num_spec_steps``/``num_steps``/``num_drafts``; k
    ``num_spec_tokens``/``num_speculative_tokens``/``k``; accepted total
    ``num_accepted_draft_tokens``/``num_accepted_tokens``; prompt length
    ``prompt_len``/``num_prompt_tokens``/``prompt_tokens``/``usage.prompt_tokens``/
    ``len(prompt_token_ids)``; id ``id``/``request_id`` (else ``line<N>``); optional per-line
    ``policy`` and ``s`` override the importer's defaults.

    A line with ``per_step_accepted`` becomes a ``request`` record (k per step from
    ``per_step_drafted`` when given, else the configured k; steps that drafted nothing are
    dropped but still advance the context); a line with only a histogram becomes a
    ``histogram`` record. Context at the start of step j is ``prompt_len + 1 + Σ_{i<j}(m_i+1)``
    (the 1 is the token sampled by the prefill, before the first draft); without a prompt
    length ``prompt_len`` is taken as 0 and the header says ``"context_known": false``.

``specbench``
    Spec-Bench answer files (github.com/hemingkx/Spec-Bench, ``evaluation/eval.py`` and
    ``evaluation/inference_*.py``): one line per question with ``question_id``, ``model_id`` and
    ``choices: [{"index", "turns", "decoding_steps" | "idxs", "new_tokens", "wall_time",
    "accept_lengths"}]``. ``accept_lengths`` holds, per decoding step, the number of tokens the
    step appended to the sequence (``new_cur_len - cur_len`` in ``model/sps/decoding.py``,
    ``input_ids.shape[1] - cur_length`` in ``inference_eagle.py``), i.e. accepted drafts + the
    bonus token: m = accept_length - 1. Spec-Bench concatenates the steps of all turns of a choice
    into one list, so each (question, choice) becomes one ``request`` record with id
    ``"<question_id>:<index>"``, turns concatenated. The prompt length is not recorded:
    context = 1 + Σ previous accept_lengths, ``"context_known": false``. k (drafts per step) is
    not recorded either: pass ``k=``; otherwise the largest ``accept_length - 1`` in the file is
    used as a lower bound and the header says ``"k_inferred": true``.

Every importer validates its input and raises :class:`~specsim.errors.TraceError` naming the
file, the line and the field; every record it builds is re-validated by
:func:`~specsim.traces.format.parse_record`. Data problems that do not make the input wrong
(e.g. fewer drafted tokens than ``k * num_drafts``) are issued as :class:`TraceImportWarning`
and listed in the header under ``"import_warnings"``.
"""
from __future__ import annotations

import json
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from specsim.errors import TraceError
from specsim.traces.format import (HEADER_KEY, HistogramTrace, RequestTrace, Trace, make_header,
                                   parse_record, read_trace)

__all__ = ["FORMATS", "TraceImportWarning", "detect_format", "load_trace", "import_vllm_metrics",
           "import_vllm_requests", "import_specbench"]

#: Formats :func:`load_trace` understands, as accepted by its ``format`` argument.
FORMATS = ("specsim", "vllm-metrics", "vllm-requests", "specbench")

_FORMAT_HELP = ("known formats: 'specsim' (native JSON Lines with a \"specsim_trace\" header), "
                "'vllm-metrics' (Prometheus text from vLLM's /metrics), 'vllm-requests' "
                "(JSON Lines with per-request acceptance_histogram / per_step_accepted / "
                "spec_token_acceptance_counts), 'specbench' (Spec-Bench answers with "
                "choices[].accept_lengths)")


class TraceImportWarning(UserWarning):
    """Input that is usable but not exactly what specsim models (kept in the header too)."""


# --------------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------------


def _iter_lines(path: str) -> Iterator[tuple[int, str]]:
    if not os.path.exists(path):
        raise TraceError("no such file", path=path)
    if os.path.isdir(path):
        raise TraceError("is a directory, not a trace file", path=path)
    n = 0
    try:
        with open(path, encoding="utf-8") as fh:
            for n, raw in enumerate(fh, start=1):
                yield n, raw.rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise TraceError(f"not UTF-8 text ({exc.reason})", path=path, line=n + 1) from None


def _read_lines(path: str) -> list[tuple[int, str]]:
    return list(_iter_lines(path))


def _json_objects(path: str) -> Iterator[tuple[int, dict]]:
    for n, text in _read_lines(path):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"bad JSON: {exc.msg} (column {exc.colno})", path=path,
                             line=n) from None
        if not isinstance(obj, dict):
            raise TraceError(f"expected a JSON object per line, got {type(obj).__name__}",
                             path=path, line=n)
        yield n, obj


def _check_s(s, path: str) -> float | None:
    if s is None:
        return None
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not (0.0 < s <= 1.0):
        raise TraceError(f"sparsity ratio must lie in (0, 1], got {s!r}", path=path, field="s")
    return float(s)


def _check_policy(policy, path: str) -> str:
    if not isinstance(policy, str) or not policy.strip():
        raise TraceError(f"policy must be a non-empty string, got {policy!r}", path=path,
                         field="policy")
    return policy


def _validated(rec: RequestTrace | HistogramTrace, path: str, line: int | None):
    """Round-trip through the format's own validation so imported records are always valid."""
    return parse_record(rec.to_json(), path, line if line is not None else 0)


def _warn(bucket: list[str], message: str) -> None:
    bucket.append(message)
    warnings.warn(message, TraceImportWarning, stacklevel=3)


def _header(fmt: str, path: str, *, model: str | None, description: str, context_known: bool,
            notes: list[str], **extra) -> dict:
    header = make_header(source=f"imported from {fmt}: {os.path.basename(path)}", model=model,
                         synthetic=False, description=description, import_format=fmt,
                         context_known=context_known, **extra)
    if notes:
        header["import_warnings"] = list(notes)
    return header


def _unique(values) -> str | None:
    distinct = {v for v in values if isinstance(v, str) and v}
    return distinct.pop() if len(distinct) == 1 else None


def _survival_histogram(total: int, survival: list[int], slack: list[float]):
    """counts[m] = A_m - A_{m+1} with A_0 = total, A_i = survival[i-1], A_{k+1} = 0.

    ``slack[i]`` is the rounding tolerance of A_i (0 for exact integers). Returns ``(counts,
    None)`` or ``(None, i)`` where i ≥ 1 is the first index whose A_i exceeds A_{i-1}.
    """
    a = [total, *survival, 0]
    tol = [*slack, 0.0]
    for i in range(1, len(a) - 1):
        if a[i] > a[i - 1] + tol[i] + tol[i - 1]:
            return None, i
    counts = np.array([max(a[m] - a[m + 1], 0) for m in range(len(a) - 1)], dtype=np.int64)
    return counts, None


# --------------------------------------------------------------------------------------------
# vLLM Prometheus /metrics
# --------------------------------------------------------------------------------------------

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NUMBER_RE = re.compile(r"^[+-]?(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$")
_METRICS = {"spec_decode_num_drafts": "drafts",
            "spec_decode_num_draft_tokens": "draft_tokens",
            "spec_decode_num_accepted_tokens": "accepted",
            "spec_decode_num_accepted_tokens_per_pos": "per_pos"}
_V0_ONLY = ("spec_decode_draft_acceptance_rate", "spec_decode_efficiency",
            "spec_decode_num_emitted_tokens")


def _slack(literal: str) -> float:
    """How far a written counter value may be from the true count.

    Prometheus clients write counters at full (round-trip) precision, so plain decimals such as
    ``1400`` or ``1400.0`` are exact. Exponent notation may have been shortened by whoever made
    the dump (``1.234e+06``): allow half a unit in its last written digit.
    """
    m = _NUMBER_RE.match(literal)
    if not m or m.group(3) is None:
        return 0.0
    decimals = len(m.group(2) or "")
    return 0.5 * 10.0 ** (int(m.group(3)) - decimals)


def _parse_labels(text: str, start: int, path: str, n: int) -> tuple[list[tuple[str, str]], int]:
    """Parse ``{a="x",b="y"}`` from the ``{``; returns the labels and the index after ``}``."""
    labels: list[tuple[str, str]] = []
    i = start + 1
    while True:
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "}":
            return labels, i + 1
        m = _LABEL_RE.match(text, i)
        if not m:
            raise TraceError(f"bad label set at column {i + 1}", path=path, line=n)
        name = m.group(0)
        i = m.end()
        if text[i:i + 2] != '="':
            raise TraceError(f"label {name!r}: expected =\"value\" at column {i + 1}", path=path,
                             line=n)
        i += 2
        value = []
        while True:
            if i >= len(text):
                raise TraceError(f"label {name!r}: unterminated value", path=path, line=n)
            ch = text[i]
            if ch == "\\" and i + 1 < len(text):
                nxt = text[i + 1]
                value.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
                i += 2
            elif ch == '"':
                i += 1
                break
            else:
                value.append(ch)
                i += 1
        if name in dict(labels):
            raise TraceError(f"label {name!r} given twice", path=path, line=n)
        labels.append((name, "".join(value)))
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == ",":
            i += 1
        elif i < len(text) and text[i] == "}":
            continue
        else:
            raise TraceError(f"bad label set at column {i + 1}: expected ',' or '}}'", path=path,
                             line=n)


def _parse_sample(text: str, path: str, n: int):
    """One exposition line -> (name, labels, value, literal), or None for comments/blank lines."""
    stripped = text.strip()
    if not stripped or stripped.startswith("#"):
        return None
    m = _NAME_RE.match(stripped)
    if not m:
        raise TraceError(f"not a Prometheus sample line: {stripped[:60]!r}", path=path, line=n)
    name, i = m.group(0), m.end()
    labels: list[tuple[str, str]] = []
    if i < len(stripped) and stripped[i] == "{":
        labels, i = _parse_labels(stripped, i, path, n)
    rest = stripped[i:].split("#", 1)[0].split()  # drop an OpenMetrics exemplar
    if not rest:
        raise TraceError("sample has no value", path=path, line=n, field=name)
    literal = rest[0]
    try:
        value = float(literal)
    except ValueError:
        raise TraceError(f"value {literal!r} is not a number", path=path, line=n,
                         field=name) from None
    return name, labels, value, literal


def _metric_kind(name: str) -> str | None:
    """Map a sample name to 'drafts' | 'draft_tokens' | 'accepted' | 'per_pos' | 'v0' | None."""
    for prefix in ("vllm:", "vllm_"):
        if name.startswith(prefix):
            base = name[len(prefix):]
            break
    else:
        return None
    if base.endswith("_created"):
        return None
    if base.endswith("_total"):
        base = base[:-len("_total")]
    if base in _METRICS:
        return _METRICS[base]
    return "v0" if base in _V0_ONLY else None


@dataclass
class _Val:
    value: int
    slack: float
    line: int
    field: str


@dataclass
class _Group:
    labels: tuple[tuple[str, str], ...]
    first_line: int
    vals: dict[str, _Val] = field(default_factory=dict)
    per_pos: dict[int, _Val] = field(default_factory=dict)


def _label_text(labels) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels)


def import_vllm_metrics(path: str | os.PathLike, *, policy: str = "unknown",
                        s: float | None = None) -> Trace:
    """Convert a vLLM ``/metrics`` dump into one histogram record per label set.

    Validates, per label set: every spec-decode counter is a whole, finite, non-negative number;
    positions are 0..k-1 without gaps; survivals never increase (A_1 ≤ num_drafts,
    A_{i+1} ≤ A_i); Σ per_pos = num_accepted_tokens when that counter is present;
    num_draft_tokens ≤ k·num_drafts
    (below is a warning: variable-length or invalidated drafts). Comparisons allow half a unit in
    the last written digit of values in exponent notation (``1.234e+06`` may be off
    by 500); plain decimals are taken as exact.
    """
    path = str(path)
    policy, s = _check_policy(policy, path), _check_s(s, path)
    groups: dict[tuple, _Group] = {}
    seen: dict[tuple, int] = {}
    saw_v0 = False
    for n, text in _read_lines(path):
        sample = _parse_sample(text, path, n)
        if sample is None:
            continue
        name, labels, value, literal = sample
        kind = _metric_kind(name)
        if kind is None:
            continue
        if kind == "v0":
            saw_v0 = True
            continue
        fieldname = f"{name}{{{_label_text(labels)}}}"
        key = (name, tuple(sorted(labels)))
        if key in seen:
            raise TraceError(f"duplicate sample (first on line {seen[key]})", path=path, line=n,
                             field=fieldname)
        seen[key] = n
        if not math.isfinite(value) or value < 0:
            raise TraceError(f"counter value must be finite and ≥ 0, got {literal}", path=path,
                             line=n, field=fieldname)
        if abs(value - round(value)) > 1e-9 * max(1.0, abs(value)):
            raise TraceError(f"counter value {literal} is not a whole number (a rate or an "
                             f"average, not a raw counter?)", path=path, line=n, field=fieldname)
        val = _Val(int(round(value)), _slack(literal), n, fieldname)
        rest = tuple(sorted((k, v) for k, v in labels if k != "position"))
        group = groups.setdefault(rest, _Group(rest, n))
        if kind == "per_pos":
            pos_text = dict(labels).get("position")
            if pos_text is None or not pos_text.isdigit():
                raise TraceError(f"needs a label position=\"<0..k-1>\", got {pos_text!r}",
                                 path=path, line=n, field=fieldname)
            slot, slot_key = group.per_pos, int(pos_text)
        else:
            slot, slot_key = group.vals, kind
        if slot_key in slot:  # e.g. both ..._total and the bare name for one label set
            raise TraceError(f"same counter given twice for this label set (first on line "
                             f"{slot[slot_key].line})", path=path, line=n, field=fieldname)
        slot[slot_key] = val

    if not any(g.per_pos for g in groups.values()):
        hint = (" (this looks like vLLM V0, whose counters have no per-position breakdown)"
                if saw_v0 else "")
        raise TraceError("no vllm:spec_decode_num_accepted_tokens_per_pos counters found; "
                         "is speculative decoding enabled and is this a vLLM /metrics dump?"
                         + hint, path=path, field="vllm:spec_decode_num_accepted_tokens_per_pos")

    notes: list[str] = []
    records: list[HistogramTrace] = []
    for group in sorted(groups.values(), key=lambda g: g.first_line):
        lab = _label_text(group.labels)
        if not group.per_pos:
            raise TraceError(f"label set {{{lab}}} has no per-position counters",
                             path=path, line=group.first_line,
                             field=f"vllm:spec_decode_num_accepted_tokens_per_pos{{{lab}}}")
        drafts = group.vals.get("drafts")
        if drafts is None:
            raise TraceError(f"label set {{{lab}}} has no drafts counter", path=path,
                             line=group.first_line,
                             field=f"vllm:spec_decode_num_drafts_total{{{lab}}}")
        k = max(group.per_pos) + 1
        missing = [p for p in range(k) if p not in group.per_pos]
        if missing:
            last = group.per_pos[k - 1]
            raise TraceError(f"positions must be 0..{k - 1} without gaps; missing {missing}",
                             path=path, line=last.line, field=last.field)
        per_pos = [group.per_pos[p] for p in range(k)]
        if drafts.value == 0:
            if any(v.value for v in per_pos):
                raise TraceError("no drafts but accepted tokens per position > 0", path=path,
                                 line=drafts.line, field=drafts.field)
            _warn(notes, f"label set {{{lab}}}: no drafts recorded (idle engine); skipped")
            continue
        counts, bad = _survival_histogram(drafts.value, [v.value for v in per_pos],
                                          [drafts.slack] + [v.slack for v in per_pos])
        if bad is not None:
            prev = drafts if bad == 1 else per_pos[bad - 2]
            cur = per_pos[bad - 1]
            what = ("num_drafts" if bad == 1 else f"position {bad - 2}")
            raise TraceError(f"accepted at position {bad - 1} ({cur.value}) exceeds {what} "
                             f"({prev.value}, line {prev.line}): per-position counts are "
                             f"survivals P(accepted ≥ i+1)·num_drafts and cannot increase",
                             path=path, line=cur.line, field=cur.field)
        accepted = group.vals.get("accepted")
        if accepted is not None:
            total = sum(v.value for v in per_pos)
            tol = accepted.slack + sum(v.slack for v in per_pos) + 1e-9
            if abs(total - accepted.value) > tol:
                raise TraceError(f"sum of per-position accepted counts is {total}, but "
                                 f"num_accepted_tokens is {accepted.value}", path=path,
                                 line=accepted.line, field=accepted.field)
        else:
            _warn(notes, f"label set {{{lab}}}: no num_accepted_tokens counter; sum check skipped")
        draft_tokens = group.vals.get("draft_tokens")
        if draft_tokens is not None:
            expect = k * drafts.value
            tol = draft_tokens.slack + k * drafts.slack + 1e-9
            if draft_tokens.value > expect + tol:
                raise TraceError(f"num_draft_tokens {draft_tokens.value} exceeds k·num_drafts = "
                                 f"{k}·{drafts.value} = {expect}", path=path,
                                 line=draft_tokens.line, field=draft_tokens.field)
            if draft_tokens.value < expect - tol:
                _warn(notes, f"label set {{{lab}}}: num_draft_tokens {draft_tokens.value} < "
                             f"k·num_drafts = {expect}: some drafts were shorter than k={k} "
                             f"(variable-length drafting or invalidated drafts); the histogram "
                             f"treats every draft as k long")
        else:
            _warn(notes, f"label set {{{lab}}}: no num_draft_tokens counter; cannot check that "
                         f"every draft was k={k} long")
        rid = ",".join(f"{k_}={v}" for k_, v in group.labels) or "all"
        rec = HistogramTrace(rid, policy, s, k, counts, None)
        records.append(_validated(rec, path, drafts.line))
    if not records:
        raise TraceError("no label set recorded any drafts", path=path)
    model = _unique(v for g in groups.values() for k_, v in g.labels if k_ == "model_name")
    header = _header("vllm-metrics", path, model=model, context_known=False, notes=notes,
                     description="vLLM Prometheus spec-decode counters; one histogram per "
                                 "label set (survivals converted to counts of accepted m)")
    return Trace(header, [], records, path=path)


# --------------------------------------------------------------------------------------------
# vLLM per-request JSON Lines
# --------------------------------------------------------------------------------------------

_STAT_KEYS = ("acceptance_histogram", "per_step_accepted", "spec_token_acceptance_counts")
_STAT_PLACES = (("metrics", "speculative_decoding"), ("speculative_decoding",),
                ("spec_decode_metrics",), ("metrics",), ())


def _find_stats(obj: dict) -> tuple[str, dict | None] | None:
    """Locate the statistics object: (dotted prefix, dict); (prefix, None) if explicitly null."""
    for place in _STAT_PLACES:
        prefix = ".".join(place) + "." if place else ""
        if place:
            parent: Any = obj
            for key in place[:-1]:
                parent = parent.get(key) if isinstance(parent, dict) else None
            if not isinstance(parent, dict) or place[-1] not in parent:
                continue
            node = parent[place[-1]]
            if node is None and place[-1] in ("speculative_decoding", "spec_decode_metrics"):
                return prefix, None
        else:
            node = obj
        if isinstance(node, dict) and any(node.get(k) is not None for k in _STAT_KEYS):
            return prefix, node
    return None


class _Line:
    """Typed access to one JSON object with errors naming file, line and (dotted) field."""

    def __init__(self, path: str, line: int):
        self.path, self.line = path, line

    def fail(self, fieldname: str | None, message: str):
        raise TraceError(message, path=self.path, line=self.line, field=fieldname)

    def int_value(self, value, fieldname: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(fieldname, f"expected an integer, got {value!r}")
        if value < minimum:
            self.fail(fieldname, f"must be ≥ {minimum}, got {value}")
        return value

    def int_list(self, value, fieldname: str, minimum: int = 0) -> list[int]:
        if not isinstance(value, list):
            self.fail(fieldname, f"expected a list of integers, got {type(value).__name__}")
        return [self.int_value(v, f"{fieldname}[{i}]", minimum) for i, v in enumerate(value)]

    def first(self, objs: list[tuple[str, dict]], names: tuple[str, ...]):
        """First present, non-null key among ``names`` in ``objs``: (dotted field, value)."""
        for prefix, obj in objs:
            for name in names:
                if isinstance(obj, dict) and obj.get(name) is not None:
                    return prefix + name, obj[name]
        return None, None


def import_vllm_requests(path: str | os.PathLike, *, policy: str = "unknown",
                         s: float | None = None, k: int | None = None) -> Trace:
    """Convert per-request vLLM spec-decode statistics (JSON Lines) into a trace.

    See the module docstring for the field names (``acceptance_histogram``,
    ``per_step_accepted`` [+ ``per_step_drafted``], ``spec_token_acceptance_counts``) and where
    they are looked up. ``k`` is a fallback for lines with ``per_step_accepted`` that carry
    neither ``num_spec_tokens`` nor ``per_step_drafted``. Raises :class:`TraceError` (file, line,
    field) when a histogram's sum disagrees with a given step count, accepted > k, totals
    disagree, or a field has the wrong type.
    """
    path = str(path)
    policy, s = _check_policy(policy, path), _check_s(s, path)
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise TraceError(f"k must be an integer ≥ 1, got {k!r}", path=path, field="k")
    notes: list[str] = []
    requests: list[RequestTrace] = []
    histograms: list[HistogramTrace] = []
    seen: dict[str, int] = {}
    all_context_known = True
    models = []
    any_line = False
    for n, obj in _json_objects(path):
        any_line = True
        c = _Line(path, n)
        found = _find_stats(obj)
        if found is None:
            c.fail("acceptance_histogram", "no per-request spec-decode statistics: expected one "
                   "of " + ", ".join(_STAT_KEYS) + " at the top level or under "
                   "metrics.speculative_decoding / speculative_decoding / spec_decode_metrics / "
                   "metrics")
        prefix, stats = found
        rid_field, rid = c.first([("", obj)], ("id", "request_id"))
        if rid is None:
            rid = f"line{n}"
        elif isinstance(rid, bool) or not isinstance(rid, (str, int)):
            c.fail(rid_field, f"expected a string or integer id, got {rid!r}")
        rid = str(rid)
        if rid in seen:
            c.fail(rid_field or "id", f"duplicate id {rid!r} (first on line {seen[rid]})")
        seen[rid] = n
        if stats is None:
            _warn(notes, f"line {n} ({rid}): {prefix.rstrip('.')} is null (speculative decoding "
                         f"off, or n > 1); skipped")
            continue
        models.append(obj.get("model"))
        rec_policy = policy
        if obj.get("policy") is not None:
            rec_policy = obj["policy"]
            if not isinstance(rec_policy, str) or not rec_policy.strip():
                c.fail("policy", f"must be a non-empty string, got {rec_policy!r}")
        rec_s = s
        if obj.get("s") is not None:
            rec_s = obj["s"]
            if isinstance(rec_s, bool) or not isinstance(rec_s, (int, float)) \
                    or not (0.0 < rec_s <= 1.0):
                c.fail("s", f"sparsity ratio must lie in (0, 1], got {rec_s!r}")
            rec_s = float(rec_s)
        places = [(prefix, stats), ("", obj)] if prefix else [("", obj)]
        k_field, k_given = c.first(places, ("num_spec_tokens", "num_speculative_tokens", "k"))
        if k_given is not None:
            k_given = c.int_value(k_given, k_field, minimum=1)
        steps_field, steps_given = c.first(places, ("num_spec_steps", "num_steps", "num_drafts"))
        if steps_given is not None:
            steps_given = c.int_value(steps_given, steps_field)
        acc_field, acc_given = c.first(places, ("num_accepted_draft_tokens",
                                                "num_accepted_tokens"))
        if acc_given is not None:
            acc_given = c.int_value(acc_given, acc_field)
        dt_field, dt_given = c.first(places, ("num_draft_tokens",))
        if dt_given is not None:
            dt_given = c.int_value(dt_given, dt_field)

        hist = None
        if stats.get("acceptance_histogram") is not None:
            hf = prefix + "acceptance_histogram"
            hist = c.int_list(stats["acceptance_histogram"], hf)
            if len(hist) < 2:
                c.fail(hf, f"needs k+1 ≥ 2 entries (index m: steps that accepted m drafts), got "
                           f"{len(hist)}")
            if k_given is not None and len(hist) != k_given + 1:
                c.fail(hf, f"has {len(hist)} entries but {k_field} = {k_given} (expected k+1)")
            if steps_given is not None and sum(hist) != steps_given:
                c.fail(hf, f"sums to {sum(hist)} steps but {steps_field} = {steps_given}")
            if acc_given is not None and sum(m * h for m, h in enumerate(hist)) != acc_given:
                c.fail(hf, f"implies {sum(m * h for m, h in enumerate(hist))} accepted drafts but "
                           f"{acc_field} = {acc_given}")

        if stats.get("per_step_accepted") is not None:
            af = prefix + "per_step_accepted"
            accepted = c.int_list(stats["per_step_accepted"], af)
            drafted = None
            k_limit = k_given if k_given is not None else (len(hist) - 1 if hist else None)
            if stats.get("per_step_drafted") is not None:
                df = prefix + "per_step_drafted"
                drafted = c.int_list(stats["per_step_drafted"], df)
                if len(drafted) != len(accepted):
                    c.fail(df, f"has {len(drafted)} entries but per_step_accepted has "
                               f"{len(accepted)} (one per step)")
                for i, (a, d) in enumerate(zip(accepted, drafted)):
                    if a > d:
                        c.fail(f"{af}[{i}]", f"accepted {a} > drafted {d} at step {i}")
                    if k_limit is not None and d > k_limit:
                        c.fail(f"{df}[{i}]", f"drafted {d} > k = {k_limit}")
                if dt_given is not None and sum(drafted) != dt_given:
                    c.fail(df, f"sums to {sum(drafted)} but {dt_field} = {dt_given}")
                ks = drafted
            else:
                kk = k_given if k_given is not None else (len(hist) - 1 if hist else k)
                if kk is None:
                    c.fail("num_spec_tokens", "per_step_accepted needs k: give num_spec_tokens / "
                           "num_speculative_tokens / k on the line, per_step_drafted, or the "
                           "importer's k argument")
                for i, a in enumerate(accepted):
                    if a > kk:
                        c.fail(f"{af}[{i}]", f"accepted {a} > k = {kk}")
                ks = [kk] * len(accepted)
                if dt_given is not None and dt_given != kk * len(accepted):
                    if dt_given > kk * len(accepted):
                        c.fail(dt_field, f"{dt_given} drafted tokens exceed k·steps = "
                                         f"{kk}·{len(accepted)}")
                    _warn(notes, f"line {n} ({rid}): {dt_field} {dt_given} < k·steps = "
                                 f"{kk * len(accepted)}; per-step draft lengths unknown, k={kk} "
                                 f"assumed for every step")
            if steps_given is not None and len(accepted) != steps_given:
                c.fail(af, f"has {len(accepted)} steps but {steps_field} = {steps_given}")
            if acc_given is not None and sum(accepted) != acc_given:
                c.fail(af, f"sums to {sum(accepted)} but {acc_field} = {acc_given}")
            if hist is not None:
                mine = [accepted.count(m) for m in range(len(hist))]
                if mine != hist or any(a >= len(hist) for a in accepted):
                    c.fail(prefix + "acceptance_histogram", f"disagrees with per_step_accepted "
                           f"(which gives {mine})")
            p_field, prompt = c.first([("", obj), ("usage.", obj.get("usage") or {})],
                                      ("prompt_len", "num_prompt_tokens", "prompt_tokens"))
            if prompt is None and isinstance(obj.get("prompt_token_ids"), list):
                prompt = len(obj["prompt_token_ids"])
            elif prompt is not None:
                prompt = c.int_value(prompt, p_field)
            if prompt is None:
                all_context_known = False
            ctx, context, kept_k, kept_m = (prompt or 0) + 1, [], [], []
            for a, d in zip(accepted, ks):
                if d > 0:
                    context.append(ctx)
                    kept_k.append(d)
                    kept_m.append(a)
                ctx += a + 1
            dropped = len(accepted) - len(kept_k)
            if dropped:
                _warn(notes, f"line {n} ({rid}): {dropped} step(s) drafted nothing; dropped")
            if not kept_k:
                _warn(notes, f"line {n} ({rid}): no step drafted anything; skipped")
                continue
            rec = RequestTrace(rid, rec_policy, rec_s, np.asarray(context, dtype=np.int64),
                               np.asarray(kept_k, dtype=np.int64),
                               np.asarray(kept_m, dtype=np.int64))
            requests.append(_validated(rec, path, n))
            continue

        if hist is None:  # V0: spec_token_acceptance_counts (survival counts)
            sf = prefix + "spec_token_acceptance_counts"
            surv = c.int_list(stats["spec_token_acceptance_counts"], sf)
            if len(surv) < 2 or surv[0] == 0:
                _warn(notes, f"line {n} ({rid}): {sf} = {surv} records no speculative step; "
                             f"skipped")
                continue
            if k_given is not None and len(surv) != k_given + 1:
                c.fail(sf, f"has {len(surv)} entries but {k_field} = {k_given} (expected k+1)")
            counts, bad = _survival_histogram(surv[0], surv[1:], [0.0] * len(surv))
            if bad is not None:
                c.fail(f"{sf}[{bad}]", f"{surv[bad]} > {surv[bad - 1]} at index {bad - 1}: entry "
                       f"i counts steps that accepted ≥ i drafts and cannot increase")
            if steps_given is not None and surv[0] != steps_given:
                c.fail(sf, f"entry 0 is {surv[0]} steps but {steps_field} = {steps_given}")
            if acc_given is not None and sum(surv[1:]) != acc_given:
                c.fail(sf, f"implies {sum(surv[1:])} accepted drafts but {acc_field} = "
                           f"{acc_given}")
            hist = counts.tolist()
        if sum(hist) == 0:
            _warn(notes, f"line {n} ({rid}): histogram is all zero (no speculative step); "
                         f"skipped")
            continue
        kk = len(hist) - 1
        if dt_given is not None:
            steps = sum(hist)
            if dt_given > kk * steps:
                c.fail(dt_field, f"{dt_given} drafted tokens exceed k·steps = {kk}·{steps}")
            if dt_given < kk * steps:
                _warn(notes, f"line {n} ({rid}): {dt_field} {dt_given} < k·steps = {kk * steps}: "
                             f"some drafts were shorter than k={kk}")
        rec = HistogramTrace(rid, rec_policy, rec_s, kk, np.asarray(hist, dtype=np.int64), None)
        histograms.append(_validated(rec, path, n))

    if not any_line:
        raise TraceError("empty file: no requests", path=path, line=1)
    if not requests and not histograms:
        raise TraceError("no request recorded any speculative step", path=path)
    header = _header("vllm-requests", path, model=_unique(models), notes=notes,
                     context_known=bool(requests) and all_context_known,
                     description="vLLM per-request spec-decode statistics")
    return Trace(header, requests, histograms, path=path)


# --------------------------------------------------------------------------------------------
# Spec-Bench
# --------------------------------------------------------------------------------------------


def import_specbench(path: str | os.PathLike, *, k: int | None = None, policy: str = "unknown",
                     s: float | None = None) -> Trace:
    """Convert a Spec-Bench answer file into one request record per (question, choice).

    ``accept_lengths[j]`` is the number of tokens step j emitted (accepted drafts + 1), so
    m = accept_length - 1; turns are concatenated (Spec-Bench already concatenates them).
    With ``k`` given, every m must be ≤ k; without it, k = max(accept_lengths) - 1 over the whole
    file (a lower bound, flagged ``"k_inferred": true`` in the header).
    """
    path = str(path)
    policy, s = _check_policy(policy, path), _check_s(s, path)
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise TraceError(f"k must be an integer ≥ 1, got {k!r}", path=path, field="k")
    notes: list[str] = []
    rows: list[tuple[int, str, list[int], str]] = []  # line, id, accept_lengths, field
    seen: dict[str, int] = {}
    models = []
    any_line = False
    for n, obj in _json_objects(path):
        any_line = True
        c = _Line(path, n)
        if "question_id" not in obj:
            c.fail("question_id", "missing")
        qid = obj["question_id"]
        if isinstance(qid, bool) or not isinstance(qid, (str, int)):
            c.fail("question_id", f"expected a string or integer, got {qid!r}")
        models.append(obj.get("model_id"))
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            c.fail("choices", "expected a non-empty list of choices")
        for ci, choice in enumerate(choices):
            if not isinstance(choice, dict):
                c.fail(f"choices[{ci}]", "expected an object")
            af = f"choices[{ci}].accept_lengths"
            if "accept_lengths" not in choice:
                c.fail(af, "missing")
            lengths = c.int_list(choice["accept_lengths"], af, minimum=1)
            index = choice.get("index", ci)
            if isinstance(index, bool) or not isinstance(index, int):
                c.fail(f"choices[{ci}].index", f"expected an integer, got {index!r}")
            rid = f"{qid}:{index}"
            if rid in seen:
                c.fail(f"choices[{ci}].index" if "index" in choice else "question_id",
                       f"duplicate question/choice {rid!r} (first on line {seen[rid]})")
            seen[rid] = n
            if not lengths:
                _warn(notes, f"line {n} ({rid}): no decoding steps recorded; skipped")
                continue
            rows.append((n, rid, lengths, af))
    if not any_line:
        raise TraceError("empty file: no answers", path=path, line=1)
    if not rows:
        raise TraceError("no answer recorded any decoding step", path=path)
    k_inferred = k is None
    if k_inferred:
        k = max(1, max(max(lengths) for _, _, lengths, _ in rows) - 1)
        _warn(notes, f"k not given: using k = max(accept_lengths) - 1 = {k}, a lower bound on the "
                     f"drafts per step")
    requests = []
    for n, rid, lengths, af in rows:
        m = np.asarray(lengths, dtype=np.int64) - 1
        over = np.flatnonzero(m > k)
        if over.size:
            j = int(over[0])
            raise TraceError(f"step emitted {lengths[j]} tokens = {m[j]} accepted drafts + 1, "
                             f"more than k = {k} allows", path=path, line=n, field=f"{af}[{j}]")
        context = 1 + np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        rec = RequestTrace(rid, policy, s, context, np.full(m.size, k, dtype=np.int64), m)
        requests.append(_validated(rec, path, n))
    extra = {"k_inferred": True, "k_lower_bound": k} if k_inferred else {"k_inferred": False}
    header = _header("specbench", path, model=_unique(models), context_known=False, notes=notes,
                     description="Spec-Bench answers: accept_lengths = accepted drafts + 1 per "
                                 "step; turns concatenated per (question, choice)", **extra)
    return Trace(header, requests, [], path=path)


# --------------------------------------------------------------------------------------------
# detection and dispatch
# --------------------------------------------------------------------------------------------

_PROM_SAMPLE_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?\s+[+-]?"
                             r"(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|Inf|NaN)(\s|$)",
                             re.IGNORECASE)


def detect_format(path: str | os.PathLike) -> str:
    """Which of :data:`FORMATS` the file holds, judged from its first non-empty lines."""
    path = str(path)
    lines = []
    for n, text in _iter_lines(path):
        if text.strip():
            lines.append((n, text))
            if len(lines) == 20:
                break
    if not lines:
        raise TraceError("empty file: cannot tell its format; " + _FORMAT_HELP, path=path)
    n, first = lines[0]
    if first.lstrip().startswith("{"):
        try:
            obj = json.loads(first)
        except json.JSONDecodeError as exc:
            raise TraceError(f"bad JSON: {exc.msg} (column {exc.colno}); cannot tell the format; "
                             + _FORMAT_HELP, path=path, line=n) from None
        if isinstance(obj, dict):
            if HEADER_KEY in obj:
                return "specsim"
            choices = obj.get("choices")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
                    and "accept_lengths" in choices[0]:
                return "specbench"
            if _find_stats(obj) is not None:
                return "vllm-requests"
        raise TraceError("unrecognised JSON: no \"specsim_trace\" header, no "
                         "choices[].accept_lengths, no per-request spec-decode statistics; "
                         + _FORMAT_HELP, path=path, line=n)
    prom = 0
    for n, text in lines:
        t = text.strip()
        if t.startswith("# HELP ") or t.startswith("# TYPE ") or _PROM_SAMPLE_RE.match(t):
            prom += 1
        elif not t.startswith("#"):
            raise TraceError(f"unrecognised content {t[:60]!r}; " + _FORMAT_HELP, path=path,
                             line=n)
    if prom:
        return "vllm-metrics"
    raise TraceError("only comments: cannot tell the format; " + _FORMAT_HELP, path=path,
                     line=lines[0][0])


_IMPORTERS = {"vllm-metrics": import_vllm_metrics, "vllm-requests": import_vllm_requests,
              "specbench": import_specbench}


def load_trace(path: str | os.PathLike, format: str | None = None, **opts) -> Trace:
    """Read any supported trace: ``format`` is one of :data:`FORMATS` or None to detect it.

    ``opts`` go to the importer (``policy``, ``s``, and ``k`` for vllm-requests/specbench).
    """
    path = str(path)
    fmt = detect_format(path) if format is None else format
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; " + _FORMAT_HELP, path=path)
    if fmt == "specsim":
        if opts:
            raise TraceError(f"options {sorted(opts)} only apply to imported formats, not to "
                             f"native specsim traces", path=path)
        return read_trace(path)
    return _IMPORTERS[fmt](path, **opts)
