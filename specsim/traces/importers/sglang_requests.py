"""Importer for SGLang's per-request speculative statistics, as JSON Lines (one response a line).

Schema: SGLang 0.5.23 (PyPI wheel), ``TokenizerManager._calculate_spec_decoding_metrics`` in
``sglang/srt/managers/tokenizer_manager.py``, which fills the ``meta_info`` of every
``/generate`` response (and the ``spec_tokens_details`` of OpenAI responses asked with
``return_spec_tokens_details``)::

    {"text": "...", "meta_info": {"id": "...", "prompt_tokens": 42, "completion_tokens": 128,
      "spec_verify_ct": 47,                        # verify steps
      "spec_accept_length": 2.72,                  # completion_tokens / spec_verify_ct
      "spec_accept_rate": 0.57,                    # correct / proposed drafts
      "spec_num_correct_drafts": 80,               # accepted drafts (no bonus)
      "spec_num_proposed_drafts": 141,             # verify_ct · (num_draft_tokens − 1)
      "spec_correct_drafts_histogram": [9, 12, 10, 16]}}   # index j: steps accepting j drafts

Earlier releases name the same quantities ``spec_accepted_drafts``/``spec_proposed_drafts``
and ``spec_accept_histogram`` (kept as aliases since); those are read too. The histogram ends
at the largest count seen, not at k, so k is the importer's ``k``, else ``num_steps`` of the
``server_info`` option (a saved ``/server_info``), else proposed / verify_ct (= k for chain
drafting; under tree drafting give k). The statistics are looked up in ``meta_info``,
``usage.spec_tokens_details``, ``spec_tokens_details`` and the line itself, in that order.

A line with a histogram becomes a histogram record; a line with only the mean becomes a
geometric histogram of its ``spec_verify_ct`` steps with E[m+1] = (completion_tokens − 1) /
spec_verify_ct (the first token comes from the prefill), with an import warning
(:mod:`~specsim.traces.importers.sglang_metrics` says what is assumed).

Capture: write each ``/generate`` response body (``"stream": false``) as one JSON line.
"""
from __future__ import annotations

import os

import numpy as np

from specsim.analytical import MAX_K
from specsim.errors import TraceError, quote
from specsim.traces.format import HistogramTrace, Trace
from specsim.traces.importers.common import (FieldReader, check_k, check_policy, check_sparsity,
                                             geometric_counts, import_header, json_objects,
                                             single_model, validated, warn)
from specsim.traces.importers.sglang_server_info import drafter_policy, read_drafter, tree_note

NAME = "sglang-requests"
SUMMARY = "SGLang /generate responses, JSON Lines"

_PLACES = (("meta_info",), ("usage", "spec_tokens_details"), ("spec_tokens_details",), ())
_MARKERS = ("spec_verify_ct", "spec_correct_drafts_histogram", "spec_accept_histogram")
_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")
_CORRECT = ("spec_num_correct_drafts", "spec_accepted_drafts")
_PROPOSED = ("spec_num_proposed_drafts", "spec_proposed_drafts")


def find_stats(obj: dict) -> tuple[str, dict] | None:
    """The object holding the statistics, with its dotted prefix, or None."""
    for place in _PLACES:
        node = obj
        for key in place:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and any(node.get(m) is not None for m in _MARKERS):
            return "".join(f"{key}." for key in place), node
    return None


def recognises(first: dict) -> bool:
    """Whether a file whose first JSON object is ``first`` holds SGLang responses."""
    return find_stats(first) is not None


class _Line(FieldReader):
    def __init__(self, path: str, line: int, prefix: str, stats: dict):
        super().__init__(path, line)
        self.prefix, self.stats = prefix, stats
        places = [(prefix, stats)]
        self.verify_field, self.verify = self.first_int(places, ("spec_verify_ct",))
        self.correct_field, self.correct = self.first_int(places, _CORRECT)
        self.proposed_field, self.proposed = self.first_int(places, _PROPOSED)
        self.completion_field, self.completion = self.first_int(places, ("completion_tokens",))

    def draft_length(self, k: int | None) -> int:
        """k: the importer's, else proposed drafts / verify steps."""
        if k is not None:
            return k
        if self.verify and self.proposed is not None and self.proposed % self.verify == 0 \
                and 1 <= self.proposed // self.verify <= MAX_K:
            return self.proposed // self.verify
        self.fail(self.proposed_field or self.prefix + "spec_num_proposed_drafts",
                  f"cannot tell k: expected proposed drafts a whole multiple (1..{MAX_K}) of "
                  f"spec_verify_ct = {quote(self.verify)}, got {quote(self.proposed)}; give "
                  f"the importer's k or server_info")

    def histogram(self, k: int) -> list[int] | None:
        field, value = self.first([(self.prefix, self.stats)], _HISTOGRAM)
        if value is None:
            return None
        hist = self.int_list(value, field)
        if not hist or sum(hist) == 0:
            return None
        if len(hist) > k + 1:
            self.fail(field, f"counts steps that accepted {len(hist) - 1} drafts, more than "
                             f"k = {k}")
        self.check_histogram_totals(field, hist, self.verify, self.verify_field, self.correct,
                                    self.correct_field)
        return hist + [0] * (k + 1 - len(hist))

    def mean_length(self, k: int) -> float:
        if self.completion is not None:
            if self.completion < 1:
                self.fail(self.completion_field, f"expected ≥ 1 with {self.verify} verify "
                                                 f"steps, got {self.completion}")
            length = (self.completion - 1) / self.verify
            where = self.completion_field
        else:
            where, length = self.first([(self.prefix, self.stats)], ("spec_accept_length",))
            if isinstance(length, bool) or not isinstance(length, (int, float)):
                self.fail(where or self.prefix + "spec_accept_length",
                          f"expected a number (or completion_tokens), got {quote(length)}")
        if not 1.0 - 1e-9 <= length <= k + 1 + 1e-9:
            self.fail(where, f"implies E[m+1] = {length:.4g} tokens a verify step, outside "
                             f"1..k+1 = 1..{k + 1}")
        return min(max(float(length), 1.0), k + 1.0)


def import_sglang_requests(path: str | os.PathLike, *, policy: str | None = None,
                           s: float | None = None, k: int | None = None,
                           server_info: str | os.PathLike | None = None) -> Trace:
    """Convert SGLang responses (JSON Lines) into one histogram record per request; see the
    module docstring for the fields. ``server_info``: a saved ``/server_info`` whose
    ``speculative_num_steps`` gives k, and whose drafter becomes the policy (unless ``policy``
    is given) and the header's ``drafter``."""
    path = str(path)
    s, k = check_sparsity(s, path), check_k(k, path)
    drafter = read_drafter(server_info) if server_info is not None else None
    if k is None and drafter is not None and drafter["num_steps"] is not None:
        k = drafter["num_steps"]
    if policy is None:
        policy = drafter_policy(drafter) if drafter is not None else "unknown"
    policy = check_policy(policy, path)
    notes: list[str] = []
    records: list[HistogramTrace] = []
    models, seen, mean_only = [], {}, False
    any_line = False
    for n, obj in json_objects(path):
        any_line = True
        found = find_stats(obj)
        if found is None:
            FieldReader(path, n).fail("meta_info.spec_verify_ct", "no speculative statistics "
                                      "(meta_info.spec_verify_ct, spec_correct_drafts_histogram)")
        prefix, stats = found
        line = _Line(path, n, prefix, stats)
        rid_field, rid = line.first([(prefix, stats), ("", obj)], ("id", "rid", "request_id"))
        rid = line.request_id(rid_field, rid, seen)
        if not line.verify:
            warn(notes, f"line {n} ({rid}): no verify step; skipped")
            continue
        models.append(obj.get("model") or stats.get("model"))
        line_k = line.draft_length(k)
        hist = line.histogram(line_k)
        if hist is None:
            length = line.mean_length(line_k)
            mean_only = True
            counts = geometric_counts(length, line_k, line.verify)
        else:
            counts = np.asarray(hist, dtype=np.int64)
        records.append(validated(HistogramTrace(rid, policy, s, line_k, counts), path, n))
    if not any_line:
        raise TraceError("empty file: no requests", path=path, line=1)
    if not records:
        raise TraceError("no request recorded a verify step", path=path)
    if mean_only:
        warn(notes, "some requests give only their mean accept length E[m+1]: their acceptance "
                    "is assumed geometric (the same p at every position)")
    extra = {}
    if drafter is not None:
        extra["drafter"] = drafter
        if (tree := tree_note(drafter, k)) is not None:
            warn(notes, tree)
    model = single_model(models) or (drafter or {}).get("model")
    header = import_header(NAME, path, model=model, context_known=False, notes=notes,
                           description="SGLang per-request speculative statistics", **extra)
    return Trace(header, [], records, path=path)
