"""What every importer shares: reading JSON objects line by line, checking the importer's
options, typed field access whose errors name file, line and field, the header of an imported
trace, and the conversion of survival counts into a histogram of accepted drafts."""
from __future__ import annotations

import os
import warnings
from typing import Iterable, Iterator

import numpy as np

from specsim.analytical import MAX_K
from specsim.errors import TraceError, quote
from specsim.traces.format import (MAX_INT, HistogramTrace, RequestTrace, json_lines,
                                   make_header, parse_record)


class TraceImportWarning(UserWarning):
    """Input that is usable but not exactly what specsim models (kept in the header too)."""


def json_objects(path: str) -> Iterator[tuple[int, dict]]:
    """The non-blank lines of a JSON Lines file, each of which must hold a JSON object."""
    for n, obj in json_lines(path):
        if not isinstance(obj, dict):
            raise TraceError(f"expected a JSON object per line, got {type(obj).__name__}",
                             path=path, line=n)
        yield n, obj


def check_sparsity(s, path: str, line: int | None = None) -> float | None:
    """The sparsity ratio ``s`` in (0, 1], or None (a drafter that is not sparse)."""
    if s is None:
        return None
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not (0.0 < s <= 1.0):
        raise TraceError(f"sparsity ratio must lie in (0, 1], got {quote(s)}", path=path, line=line,
                         field="s")
    return float(s)


def check_policy(policy, path: str, line: int | None = None) -> str:
    """A selection policy's name: any non-empty string."""
    if not isinstance(policy, str) or not policy.strip():
        raise TraceError(f"policy must be a non-empty string, got {quote(policy)}", path=path,
                         line=line, field="policy")
    return policy


def check_k(k, path: str) -> int | None:
    """The importer's ``k`` option (drafts per step): an integer in 1..MAX_K, or None."""
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K):
        raise TraceError(f"k must be an integer in 1..{MAX_K} (the longest draft specsim "
                         f"models), got {quote(k)}", path=path, field="k")
    return k


def validated(record: RequestTrace | HistogramTrace, path: str, line: int):
    """The record after the native format's own validation, so imported records are valid."""
    return parse_record(record.to_json(), path, line)


def warn(notes: list[str], message: str) -> None:
    """Issue a :class:`TraceImportWarning` and keep its text for the header."""
    notes.append(message)
    warnings.warn(message, TraceImportWarning, stacklevel=3)


def import_header(format_name: str, path: str, *, model: str | None, description: str,
                  context_known: bool, notes: list[str], **extra) -> dict:
    """The header of a trace imported from ``format_name``, with its warnings if any."""
    header = make_header(source=f"imported from {format_name}: {os.path.basename(path)}",
                         model=model, synthetic=False, description=description,
                         import_format=format_name, context_known=context_known, **extra)
    if notes:
        header["import_warnings"] = list(notes)
    return header


def single_model(values: Iterable) -> str | None:
    """The model name when the input names exactly one, else None."""
    distinct = {v for v in values if isinstance(v, str) and v}
    return distinct.pop() if len(distinct) == 1 else None


def histogram_from_survival(total: int, survival: list[int], slack: list[float]):
    """counts[m] = A_m - A_{m+1} with A_0 = total, A_i = survival[i-1], A_{k+1} = 0.

    ``survival[i-1]`` counts the steps that accepted at least i drafts; ``slack[i]`` is the
    rounding tolerance of A_i (0 for exact integers). Returns ``(counts, None)``, or
    ``(None, i)`` where i ≥ 1 is the first index whose A_i exceeds A_{i-1}.
    """
    a = [total, *survival, 0]
    tol = [*slack, 0.0]
    for i in range(1, len(a) - 1):
        if a[i] > a[i - 1] + tol[i] + tol[i - 1]:
            return None, i
    counts = np.array([max(a[m] - a[m + 1], 0) for m in range(len(a) - 1)], dtype=np.int64)
    return counts, None


class FieldReader:
    """Typed access to the fields of one JSON line; every error names file, line and field."""

    def __init__(self, path: str, line: int):
        self.path, self.line = path, line

    def fail(self, field: str | None, message: str):
        raise TraceError(message, path=self.path, line=self.line, field=field)

    def request_id(self, field: str | None, rid, seen: dict[str, int]) -> str:
        """A line's request id as text (``line<N>`` where it gives none), refused in one line
        where it is not a string or an integer or an earlier line had it (``seen``: first
        lines, updated)."""
        if rid is None:
            rid = f"line{self.line}"
        elif isinstance(rid, bool) or not isinstance(rid, (str, int)):
            self.fail(field, f"expected a string or integer id, got {quote(rid)}")
        rid = str(rid)
        if rid in seen:
            self.fail(field or "id", f"duplicate id {quote(rid)} (first on line {seen[rid]})")
        seen[rid] = self.line
        return rid

    def check_histogram_totals(self, field: str, hist: list[int], steps: int | None,
                               steps_field: str | None, accepted: int | None,
                               accepted_field: str | None) -> None:
        """A histogram (index m: steps that accepted m drafts) agrees with the line's own step
        and accepted-draft totals where it gives them."""
        if steps is not None and sum(hist) != steps:
            self.fail(field, f"sums to {sum(hist)} steps but {steps_field} = {steps}")
        implied = sum(m * h for m, h in enumerate(hist))
        if accepted is not None and implied != accepted:
            self.fail(field, f"implies {implied} accepted drafts but {accepted_field} = "
                             f"{accepted}")

    def int_value(self, value, field: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(field, f"expected an integer, got {quote(value)}")
        if value < minimum:
            self.fail(field, f"expected ≥ {minimum}, got {quote(value)}")
        if value > MAX_INT:
            self.fail(field, f"implausibly large ({quote(value)} > {MAX_INT})")
        return value

    def int_list(self, value, field: str, minimum: int = 0) -> list[int]:
        if not isinstance(value, list):
            self.fail(field, f"expected a list of integers, got {type(value).__name__}")
        return [self.int_value(v, f"{field}[{i}]", minimum) for i, v in enumerate(value)]

    def first(self, places: list[tuple[str, dict]], names: tuple[str, ...]):
        """The first present, non-null key among ``names`` in ``places`` (each a dotted prefix
        and an object): (dotted field, value), or (None, None)."""
        for prefix, obj in places:
            for name in names:
                if isinstance(obj, dict) and obj.get(name) is not None:
                    return prefix + name, obj[name]
        return None, None

    def first_int(self, places: list[tuple[str, dict]], names: tuple[str, ...],
                  minimum: int = 0) -> tuple[str | None, int | None]:
        """Like :meth:`first`, for an integer ≥ ``minimum``."""
        field, value = self.first(places, names)
        if value is not None:
            value = self.int_value(value, field, minimum)
        return field, value


def geometric_rate(length: float, k: int) -> float:
    """The per-position acceptance p under which a chain of k drafts emits ``length`` tokens a
    step on average: ``1 + p + … + p^k = length`` (the i.i.d. E[m+1]), for length in [1, k+1],
    by bisection (the left side grows with p)."""
    if length >= k + 1:
        return 1.0
    if length <= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if sum(mid ** i for i in range(k + 1)) < length:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def geometric_counts(length: float, k: int, steps: int) -> np.ndarray:
    """``steps`` iterations split over m = 0..k as a geometric chain with the mean ``length``
    (:func:`geometric_rate`): P(m = j) = p^j (1 − p) for j < k, P(m = k) = p^k; whole counts by
    largest remainder, so they sum to ``steps`` and their mean m + 1 is within 1/steps·k of
    ``length``."""
    p = geometric_rate(length, k)
    probs = np.array([p ** j * (1 - p) for j in range(k)] + [p ** k])
    exact = probs / probs.sum() * steps
    counts = np.floor(exact).astype(np.int64)
    short = steps - int(counts.sum())
    if short > 0:
        counts[np.argsort(counts - exact)[:short]] += 1
    return counts
