"""Importer for Spec-Bench answer files (github.com/hemingkx/Spec-Bench).

``evaluation/eval.py`` and ``evaluation/inference_*.py`` write one line per question with
``question_id``, ``model_id`` and ``choices: [{"index", "turns", "decoding_steps" | "idxs",
"new_tokens", "wall_time", "accept_lengths"}]``. ``accept_lengths`` holds, per decoding step,
the number of tokens the step appended to the sequence (``new_cur_len - cur_len`` in
``model/sps/decoding.py``, ``input_ids.shape[1] - cur_length`` in ``inference_eagle.py``), i.e.
accepted drafts + the bonus token: m = accept_length - 1. Spec-Bench concatenates the steps of
all turns of a choice into one list, so each (question, choice) becomes one ``request`` record
with id ``"<question_id>:<index>"``, turns concatenated. The prompt length is not recorded:
context = 1 + Σ previous accept_lengths, ``"context_known": false``. k (drafts per step) is
not recorded either: pass ``k=``; otherwise the largest ``accept_length - 1`` in the file is
used as a lower bound and the header says ``"k_inferred": true``.

The method is not a field either: it is read from the file name or ``model_id``
(``vicuna-7b-v1.3-eagle-float16``: ``eagle``; also eagle2, eagle3, medusa, hydra, pld,
lookahead, sps) into the header's ``drafter``. The answers' own ``new_tokens`` and
``wall_time`` totals go into the header's ``measured`` (tokens per second as the run timed it);
which GPU ran it is not recorded.

Capture: the ``--answer-file`` a Spec-Bench ``evaluation/inference_*.py`` run writes.
"""
from __future__ import annotations

import math
import os

import numpy as np

from specsim.analytical import MAX_K
from specsim.errors import TraceError, quote
from specsim.traces.format import MAX_INT, RequestTrace, Trace
from specsim.traces.importers.common import (FieldReader, check_k, check_policy, check_sparsity,
                                             import_header, json_objects, single_model,
                                             validated, warn)

NAME = "specbench"
SUMMARY = "Spec-Bench answers with choices[].accept_lengths"


def recognises(first: dict) -> bool:
    """Whether a file whose first JSON object is ``first`` holds Spec-Bench answers."""
    choices = first.get("choices")
    return (isinstance(choices, list) and bool(choices) and isinstance(choices[0], dict)
            and "accept_lengths" in choices[0])


#: Spec-Bench method names, as its answer files are named (longest first: eagle3 before eagle).
METHODS = ("eagle3", "eagle2", "eagle", "medusa", "hydra", "pld", "lookahead", "sps")


def method_of(path: str, models: list) -> str | None:
    """The Spec-Bench method a file's name or its ``model_id`` names, or None."""
    import re

    for text in [os.path.basename(path), *[str(m) for m in models if m]]:
        words = re.split(r"[^a-z0-9]+", text.lower())
        for method in METHODS:
            if method in words:
                return method
    return None


def wall_totals(path: str) -> dict | None:
    """Σ ``new_tokens`` and Σ ``wall_time`` over every choice's turns of a Spec-Bench file,
    and their ratio in tokens per second; None where the file times nothing."""
    tokens = seconds = 0.0
    for n, obj in json_objects(str(path)):
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            new, wall = choice.get("new_tokens"), choice.get("wall_time")
            if isinstance(new, list) and isinstance(wall, list) and len(new) == len(wall):
                if all(isinstance(x, (int, float)) and not isinstance(x, bool)
                       and math.isfinite(x) and x >= 0 for x in new + wall):
                    tokens += float(sum(new))
                    seconds += float(sum(wall))
    if not (0 < tokens < MAX_INT and 0 < seconds < math.inf):
        return None         # nothing timed, or totals no run could have (1e308 seconds)
    return {"new_tokens": int(tokens), "wall_time_s": round(seconds, 6),
            "tokens_per_s": tokens / seconds}


def _answers(path: str, notes: list[str]) -> tuple[list[tuple[int, str, list[int], str]], list]:
    """(line, request id, accept_lengths, field) of every choice that took a step, and the
    ``model_id`` of every line."""
    rows: list[tuple[int, str, list[int], str]] = []
    seen: dict[str, int] = {}
    models = []
    any_line = False
    for n, obj in json_objects(path):
        any_line = True
        reader = FieldReader(path, n)
        if "question_id" not in obj:
            reader.fail("question_id", "missing")
        qid = obj["question_id"]
        if isinstance(qid, bool) or not isinstance(qid, (str, int)):
            reader.fail("question_id", f"expected a string or integer, got {quote(qid)}")
        models.append(obj.get("model_id"))
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            reader.fail("choices", "expected a non-empty list of choices")
        for ci, choice in enumerate(choices):
            if not isinstance(choice, dict):
                reader.fail(f"choices[{ci}]", "expected an object")
            af = f"choices[{ci}].accept_lengths"
            if "accept_lengths" not in choice:
                reader.fail(af, "missing")
            lengths = reader.int_list(choice["accept_lengths"], af, minimum=1)
            index = choice.get("index", ci)
            if isinstance(index, bool) or not isinstance(index, int):
                reader.fail(f"choices[{ci}].index", f"expected an integer, got {quote(index)}")
            rid = f"{qid}:{index}"
            if rid in seen:
                reader.fail(f"choices[{ci}].index" if "index" in choice else "question_id",
                            f"duplicate question/choice {quote(rid)} (first on line {seen[rid]})")
            seen[rid] = n
            if not lengths:
                warn(notes, f"line {n} ({rid}): no decoding steps recorded; skipped")
                continue
            rows.append((n, rid, lengths, af))
    if not any_line:
        raise TraceError("empty file: no answers", path=path, line=1)
    if not rows:
        raise TraceError("no answer recorded any decoding step", path=path)
    return rows, models


def import_specbench(path: str | os.PathLike, *, k: int | None = None, policy: str = "unknown",
                     s: float | None = None) -> Trace:
    """Convert a Spec-Bench answer file into one request record per (question, choice).

    ``accept_lengths[j]`` is the number of tokens step j emitted (accepted drafts + 1), so
    m = accept_length - 1; turns are concatenated (Spec-Bench already concatenates them).
    With ``k`` given, every m must be ≤ k; without it, k = max(accept_lengths) - 1 over the whole
    file (a lower bound, flagged ``"k_inferred": true`` in the header).
    """
    path = str(path)
    policy, s = check_policy(policy, path), check_sparsity(s, path)
    k = check_k(k, path)
    notes: list[str] = []
    rows, models = _answers(path, notes)
    k_inferred = k is None
    if k_inferred:
        k = max(1, max(max(lengths) for _, _, lengths, _ in rows) - 1)
        if k > MAX_K:
            n, _, lengths, af = next(row for row in rows if max(row[2]) - 1 == k)
            j = lengths.index(k + 1)
            raise TraceError(f"step emitted {lengths[j]} tokens = {k} accepted drafts + 1, more "
                             f"than k = {MAX_K} (the longest draft specsim models) allows",
                             path=path, line=n, field=f"{af}[{j}]")
        warn(notes, f"k not given: using k = max(accept_lengths) - 1 = {k}, a lower bound on the "
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
        requests.append(validated(rec, path, n))
    extra = {"k_inferred": True, "k_lower_bound": k} if k_inferred else {"k_inferred": False}
    method = method_of(path, models)
    if method:
        extra["drafter"] = method
    measured = wall_totals(path)
    if measured:
        extra["measured"] = measured
    header = import_header(NAME, path, model=single_model(models), context_known=False,
                           notes=notes, description="Spec-Bench answers: accept_lengths = "
                           "accepted drafts + 1 per step; turns concatenated per (question, "
                           "choice)", **extra)
    return Trace(header, requests, [], path=path)
