"""Importer for a dump of vLLM's Prometheus ``/metrics`` endpoint (text exposition format).

vLLM V1 (``vllm/v1/spec_decode/metrics.py``, class ``SpecDecodingProm``) registers four
counters with the label names ``["model_name", "engine"]`` (``vllm/v1/metrics/loggers.py``);
the Prometheus client appends ``_total`` to counter samples and also writes ``_created``
samples (ignored here)::

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

Accepted tokens above drafted tokens (Σ per_pos or num_accepted_tokens > num_draft_tokens)
cannot happen and are refused. OpenMetrics text is read too: exemplars (``... 5 # {trace_id=
"x"} 1``) and timestamps after the value are ignored, and ``# EOF`` ends the exposition.

Capture: ``curl -s http://<server>:8000/metrics > metrics.prom`` after the workload has run.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from specsim.analytical import MAX_K
from specsim.errors import TraceError, quote
from specsim.traces.format import MAX_INT, HistogramTrace, Trace, text_lines
from specsim.traces.importers.common import (check_policy, check_sparsity,
                                             histogram_from_survival, import_header,
                                             single_model, validated, warn)

NAME = "vllm-metrics"
SUMMARY = "Prometheus text from vLLM's /metrics"

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NUMBER_RE = re.compile(r"^[+-]?(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$")
_SAMPLE_LINE_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?\s+[+-]?"
                             r"(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|Inf|NaN)(\s|$)",
                             re.IGNORECASE)
_COUNTERS = {"spec_decode_num_drafts": "drafts",
             "spec_decode_num_draft_tokens": "draft_tokens",
             "spec_decode_num_accepted_tokens": "accepted",
             "spec_decode_num_accepted_tokens_per_pos": "per_pos"}
_V0_ONLY = ("spec_decode_draft_acceptance_rate", "spec_decode_efficiency",
            "spec_decode_num_emitted_tokens")
_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def recognises_line(text: str) -> bool:
    """Whether a stripped, non-empty line reads as Prometheus exposition (sample, HELP, TYPE)."""
    return (text.startswith("# HELP ") or text.startswith("# TYPE ")
            or _SAMPLE_LINE_RE.match(text) is not None)


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


def _skip_blanks(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


def _label_value(text: str, i: int, name: str, path: str, n: int) -> tuple[str, int]:
    """The escaped string starting after ``="`` at ``i``; returns it and the index after it."""
    value = []
    while True:
        if i >= len(text):
            raise TraceError(f"label {quote(name)}: unterminated value", path=path, line=n)
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            value.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
            i += 2
        elif ch == '"':
            return "".join(value), i + 1
        else:
            value.append(ch)
            i += 1


def _parse_labels(text: str, start: int, path: str, n: int) -> tuple[list[tuple[str, str]], int]:
    """Parse ``{a="x",b="y"}`` from the ``{``; returns the labels and the index after ``}``."""
    labels: list[tuple[str, str]] = []
    i = start + 1
    while True:
        i = _skip_blanks(text, i)
        if i < len(text) and text[i] == "}":
            return labels, i + 1
        m = _LABEL_RE.match(text, i)
        if not m:
            raise TraceError(f"bad label set at column {i + 1}", path=path, line=n)
        name = m.group(0)
        i = m.end()
        if text[i:i + 2] != '="':
            raise TraceError(f"label {quote(name)}: expected =\"value\" at column {i + 1}", path=path,
                             line=n)
        value, i = _label_value(text, i + 2, name, path, n)
        if name in dict(labels):
            raise TraceError(f"label {quote(name)} given twice", path=path, line=n)
        labels.append((name, value))
        i = _skip_blanks(text, i)
        if i < len(text) and text[i] == ",":
            i += 1
        elif not (i < len(text) and text[i] == "}"):
            raise TraceError(f"bad label set at column {i + 1}: expected ',' or '}}'", path=path,
                             line=n)


def parse_sample(text: str, path: str, n: int):
    """One exposition line -> (name, labels, value, literal), or None for comments/blank lines."""
    stripped = text.strip()
    if not stripped or stripped.startswith("#"):
        return None
    m = _NAME_RE.match(stripped)
    if not m:
        raise TraceError(f"not a Prometheus sample line: {quote(stripped)}", path=path, line=n)
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
        raise TraceError(f"value {quote(literal)} is not a number", path=path, line=n,
                         field=name) from None
    return name, labels, value, literal


def metric_samples(path: str, classify):
    """The samples of a Prometheus text dump up to an OpenMetrics ``# EOF`` that ``classify``
    (name → kind, None: skipped) keeps: (line, name, labels, value, literal, kind)."""
    for n, text in text_lines(path):
        if text.strip() == "# EOF":
            break
        sample = parse_sample(text, path, n)
        if sample is None:
            continue
        kind = classify(sample[0])
        if kind is not None:
            yield (n, *sample, kind)


def unique_sample(seen: dict, name: str, labels, path: str, n: int) -> str:
    """The sample's field text (``name{labels}``), refused in one line where the same name and
    label set came earlier (``seen``: first lines, updated)."""
    fieldname = f"{name}{{{label_text(labels)}}}"
    key = (name, tuple(sorted(labels)))
    if key in seen:
        raise TraceError(f"duplicate sample (first on line {seen[key]})", path=path, line=n,
                         field=fieldname)
    seen[key] = n
    return fieldname


def _counter_kind(name: str) -> str | None:
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
    if base in _COUNTERS:
        return _COUNTERS[base]
    return "v0" if base in _V0_ONLY else None


@dataclass
class _Counter:
    value: int
    slack: float
    line: int
    field: str


@dataclass
class _LabelSet:
    """The spec-decode counters of one label set (all labels but ``position``)."""

    labels: tuple[tuple[str, str], ...]
    first_line: int
    counters: dict[str, _Counter] = field(default_factory=dict)
    per_pos: dict[int, _Counter] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return label_text(self.labels)


def label_text(labels) -> str:
    """Labels as the exposition format writes them (escaped, so the text stays on one line)."""
    def escaped(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return ",".join(f'{k}="{escaped(v)}"' for k, v in labels)


def _read_counters(path: str) -> tuple[list[_LabelSet], bool]:
    """The spec-decode counters of the dump grouped by label set, in the order they first
    appear, and whether V0-only counters were seen."""
    groups: dict[tuple, _LabelSet] = {}
    seen: dict[tuple, int] = {}
    saw_v0 = False
    for n, name, labels, value, literal, kind in metric_samples(path, _counter_kind):
        if kind == "v0":
            saw_v0 = True
            continue
        fieldname = unique_sample(seen, name, labels, path, n)
        if not math.isfinite(value) or value < 0:
            raise TraceError(f"counter value must be finite and ≥ 0, got {quote(literal)}", path=path,
                             line=n, field=fieldname)
        if value > MAX_INT:
            raise TraceError(f"counter value {quote(literal)} is implausibly large (> {MAX_INT})",
                             path=path, line=n, field=fieldname)
        if abs(value - round(value)) > 1e-9 * max(1.0, abs(value)):
            raise TraceError(f"counter value {quote(literal)} is not a whole number (a rate or an "
                             f"average, not a raw counter?)", path=path, line=n, field=fieldname)
        counter = _Counter(int(round(value)), _slack(literal), n, fieldname)
        rest = tuple(sorted((k, v) for k, v in labels if k != "position"))
        group = groups.setdefault(rest, _LabelSet(rest, n))
        if kind == "per_pos":
            position = dict(labels).get("position")
            if position is None or not re.fullmatch(r"[0-9]{1,9}", position):
                raise TraceError(f"needs a label position=\"<0..k-1>\", got {quote(position)}",
                                 path=path, line=n, field=fieldname)
            slot, slot_key = group.per_pos, int(position)
        else:
            slot, slot_key = group.counters, kind
        if slot_key in slot:  # e.g. both ..._total and the bare name for one label set
            raise TraceError(f"same counter given twice for this label set (first on line "
                             f"{slot[slot_key].line})", path=path, line=n, field=fieldname)
        slot[slot_key] = counter
    return sorted(groups.values(), key=lambda g: g.first_line), saw_v0


def _histogram(group: _LabelSet, path: str, notes: list[str], policy: str,
               s: float | None) -> HistogramTrace | None:
    """The histogram record of one label set after every consistency check; None (with a
    warning) for a label set that recorded no drafts."""
    lab = group.text
    if not group.per_pos:
        raise TraceError(f"label set {{{lab}}} has no per-position counters", path=path,
                         line=group.first_line, field=f"{_PER_POSITION}{{{lab}}}")
    drafts = group.counters.get("drafts")
    if drafts is None:
        raise TraceError(f"label set {{{lab}}} has no drafts counter", path=path,
                         line=group.first_line,
                         field=f"vllm:spec_decode_num_drafts_total{{{lab}}}")
    positions = sorted(group.per_pos)
    k = positions[-1] + 1
    if k > MAX_K:
        last = group.per_pos[positions[-1]]
        raise TraceError(f"position {positions[-1]} means k = {k} drafts, above {MAX_K} (the "
                         f"longest draft specsim models)", path=path, line=last.line,
                         field=last.field)
    if len(positions) != k:
        gap = next(i for i, p in enumerate(positions) if p != i)
        more = k - len(positions) - 1
        last = group.per_pos[k - 1]
        raise TraceError(f"positions must be 0..{k - 1} without gaps; missing position {gap}"
                         + (f" and {more} more" if more else ""), path=path, line=last.line,
                         field=last.field)
    per_pos = [group.per_pos[p] for p in range(k)]
    if drafts.value == 0:
        if any(v.value for v in per_pos):
            raise TraceError("no drafts but accepted tokens per position > 0", path=path,
                             line=drafts.line, field=drafts.field)
        warn(notes, f"label set {{{lab}}}: no drafts recorded (idle engine); skipped")
        return None
    counts, bad = histogram_from_survival(drafts.value, [v.value for v in per_pos],
                                          [drafts.slack] + [v.slack for v in per_pos])
    if bad is not None:
        prev = drafts if bad == 1 else per_pos[bad - 2]
        cur = per_pos[bad - 1]
        what = "num_drafts" if bad == 1 else f"position {bad - 2}"
        raise TraceError(f"accepted at position {bad - 1} ({cur.value}) exceeds {what} "
                         f"({prev.value}, line {prev.line}): per-position counts are "
                         f"survivals P(accepted ≥ i+1)·num_drafts and cannot increase",
                         path=path, line=cur.line, field=cur.field)
    accepted = group.counters.get("accepted")
    if accepted is not None:
        total = sum(v.value for v in per_pos)
        tol = accepted.slack + sum(v.slack for v in per_pos) + 1e-9
        if abs(total - accepted.value) > tol:
            raise TraceError(f"sum of per-position accepted counts is {total}, but "
                             f"num_accepted_tokens is {accepted.value}", path=path,
                             line=accepted.line, field=accepted.field)
    else:
        warn(notes, f"label set {{{lab}}}: no num_accepted_tokens counter; sum check skipped")
    draft_tokens = group.counters.get("draft_tokens")
    if draft_tokens is not None:
        total = sum(v.value for v in per_pos)
        tol = draft_tokens.slack + sum(v.slack for v in per_pos) + 1e-9
        if total > draft_tokens.value + tol:
            where = accepted if accepted is not None else per_pos[0]
            raise TraceError(f"accepted tokens ({total}) exceed drafted tokens "
                             f"(num_draft_tokens {draft_tokens.value}, line "
                             f"{draft_tokens.line}): a draft cannot accept more than it "
                             f"proposed", path=path, line=where.line, field=where.field)
        expect = k * drafts.value
        tol = draft_tokens.slack + k * drafts.slack + 1e-9
        if draft_tokens.value > expect + tol:
            raise TraceError(f"num_draft_tokens {draft_tokens.value} exceeds k·num_drafts = "
                             f"{k}·{drafts.value} = {expect}", path=path,
                             line=draft_tokens.line, field=draft_tokens.field)
        if draft_tokens.value < expect - tol:
            warn(notes, f"label set {{{lab}}}: num_draft_tokens {draft_tokens.value} < "
                        f"k·num_drafts = {expect}: some drafts were shorter than k={k} "
                        f"(variable-length drafting or invalidated drafts); the histogram "
                        f"treats every draft as k long")
    else:
        warn(notes, f"label set {{{lab}}}: no num_draft_tokens counter; cannot check that "
                    f"every draft was k={k} long")
    rid = ",".join(f"{k_}={v}" for k_, v in group.labels) or "all"
    return validated(HistogramTrace(rid, policy, s, k, counts, None), path, drafts.line)


def import_vllm_metrics(path: str | os.PathLike, *, policy: str = "unknown",
                        s: float | None = None) -> Trace:
    """Convert a vLLM ``/metrics`` dump into one histogram record per label set.

    Validates, per label set: every spec-decode counter is a whole, finite, non-negative number;
    positions are 0..k-1 without gaps; survivals never increase (A_1 ≤ num_drafts,
    A_{i+1} ≤ A_i); Σ per_pos = num_accepted_tokens when that counter is present;
    num_draft_tokens ≤ k·num_drafts (below is a warning: variable-length or invalidated
    drafts). Comparisons allow half a unit in the last written digit of values in exponent
    notation (``1.234e+06`` may be off by 500); plain decimals are taken as exact.
    """
    path = str(path)
    policy, s = check_policy(policy, path), check_sparsity(s, path)
    groups, saw_v0 = _read_counters(path)
    if not any(g.per_pos for g in groups):
        hint = (" (this looks like vLLM V0, whose counters have no per-position breakdown)"
                if saw_v0 else "")
        raise TraceError(f"no {_PER_POSITION} counters found; is speculative decoding enabled "
                         f"and is this a vLLM /metrics dump?" + hint, path=path,
                         field=_PER_POSITION)
    notes: list[str] = []
    records = [r for g in groups if (r := _histogram(g, path, notes, policy, s)) is not None]
    if not records:
        raise TraceError("no label set recorded any drafts", path=path)
    model = single_model(v for g in groups for k_, v in g.labels if k_ == "model_name")
    header = import_header(NAME, path, model=model, context_known=False, notes=notes,
                           description="vLLM Prometheus spec-decode counters; one histogram "
                                       "per label set (survivals converted to counts of "
                                       "accepted m)")
    return Trace(header, [], records, path=path)
