"""Importer for SGLang's server information (``GET /server_info``, formerly
``/get_server_info``), one JSON document, and the drafter it describes.

Schema: SGLang 0.5.23 (PyPI wheel): ``sglang/srt/entrypoints/http_server.py`` ``server_info``
returns the resolved server arguments (``sglang/srt/arg_groups/field_order.py`` lists them)
with ``internal_states``, one object per data-parallel rank. What is read::

    {"model_path": "meta-llama/Llama-3.1-8B-Instruct", "served_model_name": "...",
     "speculative_algorithm": "EAGLE3",              # null: speculation off
     "speculative_draft_model_path": "...",
     "speculative_num_steps": 3,                     # the longest accepted chain: k
     "speculative_eagle_topk": 1,                    # > 1: tree drafting
     "speculative_num_draft_tokens": 4,              # tokens verified a step
     "internal_states": [{"avg_spec_accept_length": 2.71, ...}, ...]}

``avg_spec_accept_length`` is E[m+1] over the server's life on that rank (accepted drafts plus
the bonus token, over verify steps; ``scheduler_components/internal_state.py``). A mean alone
becomes a histogram record per rank under the geometric assumption of
:mod:`~specsim.traces.importers.sglang_metrics`, at a nominal step count, with an import
warning. :func:`read_drafter` gives the other SGLang importers the same k, drafter and model.

Capture: ``curl -s http://<server>:30000/server_info > server_info.json``.
"""
from __future__ import annotations

import json
import os

from specsim.analytical import MAX_K
from specsim.errors import TraceError, quote
from specsim.traces.format import (HistogramTrace, JSONRefusal, Trace, json_error_reason,
                                   loads_strict, text_lines)
from specsim.traces.importers.common import (check_k, check_policy, check_sparsity,
                                             geometric_counts, import_header, validated, warn)
from specsim.traces.importers.sglang_metrics import NOMINAL_STEPS, assumed_shape

NAME = "sglang-server-info"
SUMMARY = "JSON from SGLang's /server_info"

#: the largest server information document read (SGLang's is a few tens of KB)
MAX_BYTES = 16 * 2**20
_KEYS = ("speculative_algorithm", "speculative_num_steps")


def recognises(first: dict) -> bool:
    """Whether a JSON document ``first`` is SGLang server information."""
    return any(key in first for key in _KEYS) and "model_path" in first


def read_document(path: str) -> tuple[dict, int]:
    """The JSON object the whole file holds (pretty-printed or on one line) and the number of
    its first line; TraceError naming the line where it does not parse."""
    lines, size, start = [], 0, None
    for n, text in text_lines(path):
        size += len(text) + 1
        if size > MAX_BYTES:
            raise TraceError(f"larger than {MAX_BYTES} bytes: not a server information "
                             f"document", path=path, line=n)
        if start is None and text.strip():
            start = n
        lines.append(text)
    if start is None:
        raise TraceError("empty file", path=path, line=1)
    try:
        obj = loads_strict("\n".join(lines))
    except json.JSONDecodeError as exc:
        raise TraceError(json_error_reason(exc), path=path, line=exc.lineno) from None
    except (JSONRefusal, ValueError, RecursionError) as exc:
        raise TraceError(json_error_reason(exc), path=path, line=start) from None
    if not isinstance(obj, dict):
        raise TraceError(f"expected a JSON object, got {type(obj).__name__}", path=path,
                         line=start)
    return obj, start


def drafter_of(info: dict, path: str, line: int) -> dict:
    """The drafter the server information describes: ``algorithm``, ``draft_model``,
    ``num_steps`` (k), ``eagle_topk``, ``num_draft_tokens``, ``model``; missing ones None."""
    def text(key):
        value = info.get(key)
        if value is not None and not isinstance(value, str):
            raise TraceError(f"expected a string, got {quote(value)}", path=path, line=line,
                             field=key)
        return value

    def count(key, minimum):
        value = info.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not \
                minimum <= value <= 10**6:
            raise TraceError(f"expected an integer ≥ {minimum}, got {quote(value)}", path=path,
                             line=line, field=key)
        return value

    steps = count("speculative_num_steps", 1)
    if steps is not None and steps > MAX_K:
        raise TraceError(f"k = {steps} is above {MAX_K}, the longest draft specsim models",
                         path=path, line=line, field="speculative_num_steps")
    return {"algorithm": text("speculative_algorithm"),
            "draft_model": text("speculative_draft_model_path"), "num_steps": steps,
            "eagle_topk": count("speculative_eagle_topk", 0),
            "num_draft_tokens": count("speculative_num_draft_tokens", 1),
            "model": text("served_model_name") or text("model_path")}


def drafter_policy(drafter: dict) -> str:
    """The drafter as a trace's (opaque) policy string: ``ALGORITHM`` or
    ``ALGORITHM:draft-model``."""
    name = drafter.get("algorithm") or "unknown"
    return f"{name}:{drafter['draft_model']}" if drafter.get("draft_model") else name


def read_drafter(server_info: str | os.PathLike) -> dict:
    """The drafter (:func:`drafter_of`) of a saved ``/server_info`` document."""
    path = str(server_info)
    info, line = read_document(path)
    return drafter_of(info, path, line)


def tree_note(drafter: dict, k: int) -> str | None:
    """A warning when the server drafts a tree (specsim costs a chain of k drafts)."""
    topk, tokens = drafter.get("eagle_topk"), drafter.get("num_draft_tokens")
    if (topk or 1) > 1 or (tokens is not None and tokens > k + 1):
        return (f"tree drafting (speculative_eagle_topk = {topk}, speculative_num_draft_tokens"
                f" = {tokens}): specsim costs a chain of k = {k} drafts and a verify of k + 1 "
                f"tokens")
    return None


def import_sglang_server_info(path: str | os.PathLike, *, policy: str | None = None,
                              s: float | None = None, k: int | None = None) -> Trace:
    """One histogram record per data-parallel rank from ``avg_spec_accept_length``; k is the
    importer's ``k``, else ``speculative_num_steps``; the policy is the importer's ``policy``,
    else the drafter (:func:`drafter_policy`)."""
    path = str(path)
    s, k = check_sparsity(s, path), check_k(k, path)
    info, line = read_document(path)
    drafter = drafter_of(info, path, line)
    if drafter["algorithm"] is None:
        raise TraceError("speculative_algorithm is null: the server does not speculate",
                         path=path, line=line, field="speculative_algorithm")
    policy = check_policy(policy if policy is not None else drafter_policy(drafter), path)
    k_source = "the importer's k" if k is not None else "speculative_num_steps"
    k = k if k is not None else drafter["num_steps"]
    if k is None:
        raise TraceError("no speculative_num_steps: give the importer's k", path=path,
                         line=line, field="speculative_num_steps")
    states = info.get("internal_states")
    if not isinstance(states, list) or not states:
        raise TraceError(f"expected a non-empty list of per-rank states, got {quote(states)}",
                         path=path, line=line, field="internal_states")
    notes: list[str] = []
    if (tree := tree_note(drafter, k)) is not None:
        warn(notes, tree)
    records = []
    for rank, state in enumerate(states):
        where = f"internal_states[{rank}].avg_spec_accept_length"
        length = state.get("avg_spec_accept_length") if isinstance(state, dict) else None
        if length is None:
            warn(notes, f"{where} is missing (no verify step yet); skipped")
            continue
        if isinstance(length, bool) or not isinstance(length, (int, float)) or \
                not 1.0 - 1e-9 <= length <= k + 1 + 1e-9:
            raise TraceError(f"expected E[m+1] in 1..k+1 = 1..{k + 1}, got {quote(length)}",
                             path=path, line=line, field=where)
        length = min(max(float(length), 1.0), k + 1.0)
        warn(notes, f"rank {rank}: " + assumed_shape(length, k, k_source)
             + f"; the record is given a nominal {NOMINAL_STEPS} steps (the server does not "
               f"say how many), so bootstrap intervals do not show its sampling error")
        records.append(validated(HistogramTrace(f"dp{rank}", policy, s, k,
                                                geometric_counts(length, k, NOMINAL_STEPS)),
                                 path, line))
    if not records:
        raise TraceError("no rank has an avg_spec_accept_length", path=path, line=line,
                         field="internal_states")
    header = import_header(NAME, path, model=drafter["model"], context_known=False,
                           notes=notes, drafter=drafter,
                           description="SGLang /server_info lifetime mean accept length, as "
                                       "geometric histograms")
    return Trace(header, [], records, path=path)
