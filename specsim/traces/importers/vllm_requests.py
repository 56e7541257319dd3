"""Importer for vLLM's per-request spec-decode statistics, as JSON Lines (one request a line).

What vLLM exposes per request (fields accepted here, in the order they are looked up):

* vLLM with per-request spec-decode metrics (vllm-project/vllm pull request 48915, server flag
  ``--per-request-spec-decode-metrics summary|detailed``): the OpenAI response object's
  ``metrics.speculative_decoding`` (offline: ``CompletionOutput.spec_decode_metrics``)::

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
dropped but still advance the context); a line with only a histogram becomes a ``histogram``
record. Context at the start of step j is ``prompt_len + 1 + Σ_{i<j}(m_i+1)`` (the 1 is the
token sampled by the prefill, before the first draft); without a prompt length ``prompt_len``
is taken as 0 and the header says ``"context_known": false``.

Capture: write each response of the OpenAI-compatible server (or each offline
``RequestOutput``) as one JSON line.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from specsim.analytical import MAX_K
from specsim.errors import TraceError, quote
from specsim.traces.format import HistogramTrace, RequestTrace, Trace
from specsim.traces.importers.common import (FieldReader, check_k, check_policy, check_sparsity,
                                             histogram_from_survival, import_header,
                                             json_objects, single_model, validated, warn)

NAME = "vllm-requests"
SUMMARY = ("JSON Lines with per-request acceptance_histogram / per_step_accepted / "
           "spec_token_acceptance_counts")

_STAT_KEYS = ("acceptance_histogram", "per_step_accepted", "spec_token_acceptance_counts")
_STAT_PLACES = (("metrics", "speculative_decoding"), ("speculative_decoding",),
                ("spec_decode_metrics",), ("metrics",), ())
_NULLABLE_PLACES = ("speculative_decoding", "spec_decode_metrics")
_K_NAMES = ("num_spec_tokens", "num_speculative_tokens", "k")
_STEPS_NAMES = ("num_spec_steps", "num_steps", "num_drafts")
_ACCEPTED_NAMES = ("num_accepted_draft_tokens", "num_accepted_tokens")
_PROMPT_NAMES = ("prompt_len", "num_prompt_tokens", "prompt_tokens")


def find_stats(obj: dict) -> tuple[str, dict | None] | None:
    """Locate the statistics object: (dotted prefix, dict); (prefix, None) if explicitly null;
    None if the line holds none."""
    for place in _STAT_PLACES:
        prefix = ".".join(place) + "." if place else ""
        if place:
            parent: Any = obj
            for key in place[:-1]:
                parent = parent.get(key) if isinstance(parent, dict) else None
            if not isinstance(parent, dict) or place[-1] not in parent:
                continue
            node = parent[place[-1]]
            if node is None and place[-1] in _NULLABLE_PLACES:
                return prefix, None
        else:
            node = obj
        if isinstance(node, dict) and any(node.get(k) is not None for k in _STAT_KEYS):
            return prefix, node
    return None


def recognises(first: dict) -> bool:
    """Whether a file whose first JSON object is ``first`` holds per-request statistics."""
    return find_stats(first) is not None


class RequestLine(FieldReader):
    """One line's statistics and the totals it states beside them."""

    def __init__(self, path: str, line: int, obj: dict, prefix: str, stats: dict, rid: str):
        super().__init__(path, line)
        self.obj, self.prefix, self.stats, self.rid = obj, prefix, stats, rid
        places = [(prefix, stats), ("", obj)] if prefix else [("", obj)]
        self.k_field, self.k = self.first_int(places, _K_NAMES, minimum=1)
        if self.k is not None and self.k > MAX_K:
            self.fail(self.k_field, f"expected ≤ {MAX_K} (the longest draft specsim models), "
                                    f"got {quote(self.k)}")
        self.steps_field, self.steps = self.first_int(places, _STEPS_NAMES)
        self.accepted_field, self.accepted = self.first_int(places, _ACCEPTED_NAMES)
        self.drafted_field, self.drafted = self.first_int(places, ("num_draft_tokens",))

    def note(self, notes: list[str], message: str) -> None:
        warn(notes, f"line {self.line} ({self.rid}): {message}")

    def check_width(self, values: list[int], field: str) -> None:
        """A list indexed by m = 0..k has at most MAX_K + 1 entries."""
        if len(values) > MAX_K + 1:
            self.fail(field, f"has {len(values)} entries: k = {len(values) - 1} is above "
                             f"{MAX_K}, the longest draft specsim models")

    def histogram(self) -> list[int] | None:
        """``acceptance_histogram``, checked against the totals the line states."""
        if self.stats.get("acceptance_histogram") is None:
            return None
        hf = self.prefix + "acceptance_histogram"
        hist = self.int_list(self.stats["acceptance_histogram"], hf)
        self.check_width(hist, hf)
        if len(hist) < 2:
            self.fail(hf, f"needs k+1 ≥ 2 entries (index m: steps that accepted m drafts), got "
                          f"{len(hist)}")
        if self.k is not None and len(hist) != self.k + 1:
            self.fail(hf, f"has {len(hist)} entries but {self.k_field} = {self.k} (expected k+1)")
        self.check_histogram_totals(hf, hist, self.steps, self.steps_field, self.accepted,
                                    self.accepted_field)
        return hist

    def histogram_from_survival(self, notes: list[str]) -> list[int] | None:
        """V0's ``spec_token_acceptance_counts`` (survival counts) as a histogram; None (with a
        warning) when it records no speculative step."""
        sf = self.prefix + "spec_token_acceptance_counts"
        surv = self.int_list(self.stats["spec_token_acceptance_counts"], sf)
        self.check_width(surv, sf)
        if len(surv) < 2 or surv[0] == 0:
            self.note(notes, f"{sf} = {quote(surv)} records no speculative step; skipped")
            return None
        if self.k is not None and len(surv) != self.k + 1:
            self.fail(sf, f"has {len(surv)} entries but {self.k_field} = {self.k} (expected k+1)")
        counts, bad = histogram_from_survival(surv[0], surv[1:], [0.0] * len(surv))
        if bad is not None:
            self.fail(f"{sf}[{bad}]", f"{surv[bad]} > {surv[bad - 1]} at index {bad - 1}: entry "
                      f"i counts steps that accepted ≥ i drafts and cannot increase")
        if self.steps is not None and surv[0] != self.steps:
            self.fail(sf, f"entry 0 is {surv[0]} steps but {self.steps_field} = {self.steps}")
        if self.accepted is not None and sum(surv[1:]) != self.accepted:
            self.fail(sf, f"implies {sum(surv[1:])} accepted drafts but {self.accepted_field} = "
                          f"{self.accepted}")
        return counts.tolist()

    def draft_lengths(self, accepted: list[int], hist: list[int] | None, k_fallback: int | None,
                      notes: list[str]) -> list[int]:
        """Drafts proposed at each step: ``per_step_drafted``, else the configured k."""
        af = self.prefix + "per_step_accepted"
        k_limit = self.k if self.k is not None else (len(hist) - 1 if hist else None)
        if self.stats.get("per_step_drafted") is not None:
            df = self.prefix + "per_step_drafted"
            drafted = self.int_list(self.stats["per_step_drafted"], df)
            if len(drafted) != len(accepted):
                self.fail(df, f"has {len(drafted)} entries but per_step_accepted has "
                              f"{len(accepted)} (one per step)")
            for i, (a, d) in enumerate(zip(accepted, drafted)):
                if a > d:
                    self.fail(f"{af}[{i}]", f"accepted {a} > drafted {d} at step {i}")
                if k_limit is not None and d > k_limit:
                    self.fail(f"{df}[{i}]", f"drafted {d} > k = {k_limit}")
            if self.drafted is not None and sum(drafted) != self.drafted:
                self.fail(df, f"sums to {sum(drafted)} but {self.drafted_field} = "
                              f"{self.drafted}")
            return drafted
        k = k_limit if k_limit is not None else k_fallback
        if k is None:
            self.fail("num_spec_tokens", "per_step_accepted needs k: give num_spec_tokens / "
                      "num_speculative_tokens / k on the line, per_step_drafted, or the "
                      "importer's k argument")
        for i, a in enumerate(accepted):
            if a > k:
                self.fail(f"{af}[{i}]", f"accepted {a} > k = {k}")
        steps = len(accepted)
        if self.drafted is not None and self.drafted != k * steps:
            if self.drafted > k * steps:
                self.fail(self.drafted_field, f"{self.drafted} drafted tokens exceed k·steps = "
                                              f"{k}·{steps}")
            self.note(notes, f"{self.drafted_field} {self.drafted} < k·steps = {k * steps}; "
                             f"per-step draft lengths unknown, k={k} assumed for every step")
        return [k] * steps

    def prompt_length(self) -> int | None:
        field, prompt = self.first([("", self.obj), ("usage.", self.obj.get("usage") or {})],
                                   _PROMPT_NAMES)
        if prompt is None and isinstance(self.obj.get("prompt_token_ids"), list):
            return len(self.obj["prompt_token_ids"])
        return None if prompt is None else self.int_value(prompt, field)

    def steps_record(self, hist: list[int] | None, k_fallback: int | None, notes: list[str],
                     policy: str, s: float | None) -> tuple[RequestTrace | None, bool]:
        """The request record of ``per_step_accepted`` (None, with a warning, when no step
        drafted anything) and whether the prompt length is known."""
        af = self.prefix + "per_step_accepted"
        accepted = self.int_list(self.stats["per_step_accepted"], af)
        drafted = self.draft_lengths(accepted, hist, k_fallback, notes)
        if self.steps is not None and len(accepted) != self.steps:
            self.fail(af, f"has {len(accepted)} steps but {self.steps_field} = {self.steps}")
        if self.accepted is not None and sum(accepted) != self.accepted:
            self.fail(af, f"sums to {sum(accepted)} but {self.accepted_field} = {self.accepted}")
        if hist is not None:
            mine = [accepted.count(m) for m in range(len(hist))]
            if mine != hist or any(a >= len(hist) for a in accepted):
                self.fail(self.prefix + "acceptance_histogram", f"disagrees with "
                          f"per_step_accepted (which gives {quote(mine)})")
        prompt = self.prompt_length()
        ctx, context, kept_k, kept_m = (prompt or 0) + 1, [], [], []
        for a, d in zip(accepted, drafted):
            if d > 0:
                context.append(ctx)
                kept_k.append(d)
                kept_m.append(a)
            ctx += a + 1
        dropped = len(accepted) - len(kept_k)
        if dropped:
            self.note(notes, f"{dropped} step(s) drafted nothing; dropped")
        if not kept_k:
            self.note(notes, "no step drafted anything; skipped")
            return None, prompt is not None
        rec = RequestTrace(self.rid, policy, s, np.asarray(context, dtype=np.int64),
                           np.asarray(kept_k, dtype=np.int64), np.asarray(kept_m, dtype=np.int64))
        return validated(rec, self.path, self.line), prompt is not None

    def histogram_record(self, hist: list[int], notes: list[str], policy: str,
                         s: float | None) -> HistogramTrace | None:
        """The histogram record (None, with a warning, for an all-zero histogram)."""
        if sum(hist) == 0:
            self.note(notes, "histogram is all zero (no speculative step); skipped")
            return None
        k, steps = len(hist) - 1, sum(hist)
        if self.drafted is not None:
            if self.drafted > k * steps:
                self.fail(self.drafted_field, f"{self.drafted} drafted tokens exceed k·steps = "
                                              f"{k}·{steps}")
            if self.drafted < k * steps:
                self.note(notes, f"{self.drafted_field} {self.drafted} < k·steps = {k * steps}: "
                                 f"some drafts were shorter than k={k}")
        rec = HistogramTrace(self.rid, policy, s, k, np.asarray(hist, dtype=np.int64), None)
        return validated(rec, self.path, self.line)


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
    policy, s = check_policy(policy, path), check_sparsity(s, path)
    k = check_k(k, path)
    notes: list[str] = []
    requests: list[RequestTrace] = []
    histograms: list[HistogramTrace] = []
    seen: dict[str, int] = {}
    all_context_known = True
    models = []
    any_line = False
    for n, obj in json_objects(path):
        any_line = True
        reader = FieldReader(path, n)
        found = find_stats(obj)
        if found is None:
            reader.fail("acceptance_histogram", "no per-request spec-decode statistics: expected "
                        "one of " + ", ".join(_STAT_KEYS) + " at the top level or under "
                        "metrics.speculative_decoding / speculative_decoding / "
                        "spec_decode_metrics / metrics")
        prefix, stats = found
        rid_field, rid = reader.first([("", obj)], ("id", "request_id"))
        rid = reader.request_id(rid_field, rid, seen)
        if stats is None:
            warn(notes, f"line {n} ({rid}): {prefix.rstrip('.')} is null (speculative decoding "
                        f"off, or n > 1); skipped")
            continue
        models.append(obj.get("model"))
        line_policy = policy if obj.get("policy") is None else check_policy(obj["policy"], path, n)
        line_s = s if obj.get("s") is None else check_sparsity(obj["s"], path, n)
        line = RequestLine(path, n, obj, prefix, stats, rid)
        hist = line.histogram()
        if stats.get("per_step_accepted") is not None:
            rec, prompt_known = line.steps_record(hist, k, notes, line_policy, line_s)
            all_context_known = all_context_known and prompt_known
            if rec is not None:
                requests.append(rec)
            continue
        if hist is None:
            hist = line.histogram_from_survival(notes)
            if hist is None:
                continue
        rec = line.histogram_record(hist, notes, line_policy, line_s)
        if rec is not None:
            histograms.append(rec)

    if not any_line:
        raise TraceError("empty file: no requests", path=path, line=1)
    if not requests and not histograms:
        raise TraceError("no request recorded any speculative step", path=path)
    header = import_header(NAME, path, model=single_model(models), notes=notes,
                           context_known=bool(requests) and all_context_known,
                           description="vLLM per-request spec-decode statistics")
    return Trace(header, requests, histograms, path=path)
