"""Request arrivals for the serving simulator: all at once, Poisson, or from a file.

A file is CSV with the Azure LLM inference trace columns ``TIMESTAMP, ContextTokens,
GeneratedTokens`` (TIMESTAMP as seconds or as an ISO date-time; times are made relative to the
first request), or JSON Lines with ``time``/``prompt_tokens``/``output_tokens`` keys. Bad rows
raise :class:`~specsim.errors.TraceError` naming the file, line and column. A run of more
than :data:`MAX_REQUESTS` requests, or a request of more than :data:`MAX_REQUEST_TOKENS`
prompt or output tokens, is refused (it would run for hours, not fail).
"""
from __future__ import annotations

import csv
import datetime as dt
import math
from dataclasses import dataclass

import numpy as np

from specsim.errors import LimitError, SpecsimError, TraceError, quote
from specsim.traces.format import json_lines, text_lines

#: the most requests one simulation takes
MAX_REQUESTS = 1_000_000
#: the most prompt or output tokens one simulated request may have
MAX_REQUEST_TOKENS = 2**22


def _check_requests(n, prompt_tokens, output_tokens) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_REQUESTS:
        raise LimitError("requests", f"expected 1..{MAX_REQUESTS} requests, got {quote(n)}")
    for what, value in (("prompt tokens", prompt_tokens), ("output tokens", output_tokens)):
        arr = np.asarray(value)
        if arr.size and (arr.min() < 1 or arr.max() > MAX_REQUEST_TOKENS):
            raise LimitError(what, f"expected 1..{MAX_REQUEST_TOKENS} per request, got "
                                   f"{quote(int(arr.min() if arr.min() < 1 else arr.max()))}")
    return int(n)


@dataclass(frozen=True)
class Arrival:
    request_id: int
    time: float             # seconds since the start
    prompt_tokens: int
    output_tokens: int
    prompt_id: str | None = None   # the trace's prompt this request decodes (replay: its record)


def all_at_once(n: int, prompt_tokens, output_tokens, prompt_ids=None) -> list[Arrival]:
    """n requests at t = 0; prompt/output lengths are ints or arrays of n; ``prompt_ids``
    (n names, optional) says which recorded prompt each request is."""
    n = _check_requests(n, prompt_tokens, output_tokens)
    prompts = np.broadcast_to(np.asarray(prompt_tokens), (n,))
    outputs = np.broadcast_to(np.asarray(output_tokens), (n,))
    if prompt_ids is not None and len(prompt_ids) != n:
        raise SpecsimError(f"{len(prompt_ids)} prompt ids for {n} requests")
    return [Arrival(i, 0.0, int(prompts[i]), int(outputs[i]),
                    None if prompt_ids is None else str(prompt_ids[i])) for i in range(n)]


def poisson(n: int, rate: float, prompt_tokens, output_tokens, seed: int = 0) -> list[Arrival]:
    """n requests with exponential inter-arrival times of mean 1/rate seconds."""
    n = _check_requests(n, prompt_tokens, output_tokens)
    if not (rate > 0 and math.isfinite(rate)):
        raise SpecsimError(f"arrival rate must be a finite number > 0 requests/s, got "
                           f"{quote(rate)}")
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, size=n))
    prompts = np.broadcast_to(np.asarray(prompt_tokens), (n,))
    outputs = np.broadcast_to(np.asarray(output_tokens), (n,))
    return [Arrival(i, float(times[i]), int(prompts[i]), int(outputs[i])) for i in range(n)]


_TIME_KEYS = ("TIMESTAMP", "time", "timestamp", "arrival_time")
_PROMPT_KEYS = ("ContextTokens", "prompt_tokens", "prompt_len", "input_tokens")
_OUTPUT_KEYS = ("GeneratedTokens", "output_tokens", "output_len", "generated_tokens")


def _parse_time(value, path: str, line: int, column: str) -> float:
    """Seconds, or an ISO date-time (as seconds since the epoch)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TraceError(f"expected seconds or a date-time, got {quote(value)}", path=path,
                         line=line, field=column)
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not math.isfinite(seconds):
            raise TraceError(f"expected a finite number of seconds, got {quote(text)}", path=path,
                             line=line, field=column)
        return seconds
    try:
        text = text.replace("Z", "+00:00")
        if "." in text:  # Azure writes 7-digit fractions; Python takes at most 6
            head, frac = text.split(".", 1)
            digits = "".join(ch for ch in frac if ch.isdigit())
            rest = frac[len(digits):]
            text = f"{head}.{digits[:6]}{rest}"
        stamp = dt.datetime.fromisoformat(text)
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=dt.timezone.utc)
        return stamp.timestamp()
    except (ValueError, OverflowError):
        raise TraceError(f"not seconds nor a date-time: {quote(value)}", path=path, line=line,
                         field=column) from None


def _pick(row: dict, keys, path: str, line: int, what: str):
    """(column, value) of the first of ``keys`` the row fills."""
    for key in keys:
        if key in row and row[key] not in (None, ""):
            return key, row[key]
    raise TraceError(f"missing column for {what} (one of {', '.join(keys)})", path=path,
                     line=line, field=keys[0])


def _count(value, path: str, line: int, column: str) -> int:
    """A token count: a whole number ≥ 1 (written as an integer or a float)."""
    number = None
    if not isinstance(value, bool):
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            pass
    if number is None or not math.isfinite(number) or number != int(number) or number < 1 \
            or number > MAX_REQUEST_TOKENS:
        raise TraceError(f"expected a whole number of tokens in 1..{MAX_REQUEST_TOKENS}, got "
                         f"{quote(value)}", path=path, line=line, field=column)
    return int(number)


def _rows(path: str) -> list[tuple[int, dict]]:
    """(line number, row) of a JSON Lines file (first non-blank line an object) or a CSV file
    with a header row."""
    lines = list(text_lines(path))
    first = next((text for _, text in lines if text.strip()), "")
    if first.lstrip().startswith("{"):
        rows = []
        for n, obj in json_lines(path):
            if not isinstance(obj, dict):
                raise TraceError("expected a JSON object", path=path, line=n)
            rows.append((n, obj))
        return rows
    if not first:
        return []
    reader = csv.DictReader(text for _, text in lines)
    try:
        if not reader.fieldnames:
            raise TraceError("no header row", path=path, line=1)
        reader.fieldnames = [f.strip() for f in reader.fieldnames]
        return [(reader.line_num, row) for row in reader]
    except csv.Error as exc:
        raise TraceError(f"bad CSV: {exc}", path=path, line=reader.line_num) from None


def from_file(path: str, limit: int | None = None, time_scale: float = 1.0) -> list[Arrival]:
    """Arrivals from a CSV (Azure columns) or JSON Lines file; ``time_scale`` stretches
    (>1) or compresses (<1) the inter-arrival times."""
    path = str(path)
    rows = _rows(path)
    if not rows:
        raise TraceError("no requests in the file", path=path)
    if limit is not None:
        rows = rows[:limit]
    if len(rows) > MAX_REQUESTS:
        raise TraceError(f"{len(rows)} requests: more than {MAX_REQUESTS} per simulation",
                         path=path, line=rows[MAX_REQUESTS][0])
    arrivals, times = [], []
    for i, (n, row) in enumerate(rows):
        time_column, time_value = _pick(row, _TIME_KEYS, path, n, "arrival time")
        t = _parse_time(time_value, path, n, time_column)
        prompt_column, prompt_value = _pick(row, _PROMPT_KEYS, path, n, "prompt tokens")
        output_column, output_value = _pick(row, _OUTPUT_KEYS, path, n, "output tokens")
        times.append(t)
        arrivals.append((i, t, _count(prompt_value, path, n, prompt_column),
                         _count(output_value, path, n, output_column), n, time_column))
    t0 = min(times)
    out = []
    last = -math.inf
    for i, t, prompt, output, n, time_column in arrivals:
        rel = (t - t0) * time_scale
        if rel < last - 1e-9:
            raise TraceError("arrivals must be in time order", path=path, line=n,
                             field=time_column)
        last = rel
        out.append(Arrival(i, rel, prompt, output))
    return out
