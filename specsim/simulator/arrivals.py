"""Request arrivals for the serving simulator: all at once, Poisson, or from a file.

A file is CSV with the Azure LLM inference trace columns ``TIMESTAMP, ContextTokens,
GeneratedTokens`` (TIMESTAMP as seconds or as an ISO date-time; times are made relative to the
first request), or JSON Lines with ``time``/``prompt_tokens``/``output_tokens`` keys. Bad rows
raise :class:`~specsim.errors.SpecsimError` naming the file, line and column.
"""
from __future__ import annotations

import csv
import datetime as dt
import json
import math
from dataclasses import dataclass

import numpy as np

from specsim.errors import SpecsimError


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
    prompts = np.broadcast_to(np.asarray(prompt_tokens), (n,))
    outputs = np.broadcast_to(np.asarray(output_tokens), (n,))
    if prompt_ids is not None and len(prompt_ids) != n:
        raise SpecsimError(f"{len(prompt_ids)} prompt ids for {n} requests")
    return [Arrival(i, 0.0, int(prompts[i]), int(outputs[i]),
                    None if prompt_ids is None else str(prompt_ids[i])) for i in range(n)]


def poisson(n: int, rate: float, prompt_tokens, output_tokens, seed: int = 0) -> list[Arrival]:
    """n requests with exponential inter-arrival times of mean 1/rate seconds."""
    if rate <= 0:
        raise SpecsimError(f"arrival rate must be > 0 requests/s, got {rate}")
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, size=n))
    prompts = np.broadcast_to(np.asarray(prompt_tokens), (n,))
    outputs = np.broadcast_to(np.asarray(output_tokens), (n,))
    return [Arrival(i, float(times[i]), int(prompts[i]), int(outputs[i])) for i in range(n)]


_TIME_KEYS = ("TIMESTAMP", "time", "timestamp", "arrival_time")
_PROMPT_KEYS = ("ContextTokens", "prompt_tokens", "prompt_len", "input_tokens")
_OUTPUT_KEYS = ("GeneratedTokens", "output_tokens", "output_len", "generated_tokens")


def _parse_time(value: str, path: str, line: int) -> float:
    value = str(value).strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        text = value.replace("Z", "+00:00")
        if "." in text:  # Azure writes 7-digit fractions; Python takes at most 6
            head, frac = text.split(".", 1)
            digits = "".join(ch for ch in frac if ch.isdigit())
            rest = frac[len(digits):]
            text = f"{head}.{digits[:6]}{rest}"
        stamp = dt.datetime.fromisoformat(text)
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=dt.timezone.utc)
        return stamp.timestamp()
    except ValueError:
        raise SpecsimError(f"{path}:{line}: column TIMESTAMP: not seconds nor a date-time: "
                           f"'{value}'") from None


def _pick(row: dict, keys, path, line, what) -> str:
    for key in keys:
        if key in row and row[key] not in (None, ""):
            return row[key]
    raise SpecsimError(f"{path}:{line}: missing column for {what} (one of {', '.join(keys)})")


def _positive_int(value, path, line, column, allow_zero=False) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecsimError(f"{path}:{line}: column {column}: not a number: '{value}'") from None
    if not math.isfinite(number) or number != int(number) or number < (0 if allow_zero else 1):
        raise SpecsimError(f"{path}:{line}: column {column}: expected an integer ≥ "
                           f"{0 if allow_zero else 1}, got '{value}'")
    return int(number)


def from_file(path: str, limit: int | None = None, time_scale: float = 1.0) -> list[Arrival]:
    """Arrivals from a CSV (Azure columns) or JSON Lines file; ``time_scale`` stretches
    (>1) or compresses (<1) the inter-arrival times."""
    rows: list[tuple[int, dict]] = []
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            head = fh.read(1)
            fh.seek(0)
            if head in ("{", ""):
                for n, raw in enumerate(fh, start=1):
                    if raw.strip():
                        try:
                            obj = json.loads(raw)
                        except json.JSONDecodeError as exc:
                            raise SpecsimError(f"{path}:{n}: bad JSON: {exc.msg}") from None
                        if not isinstance(obj, dict):
                            raise SpecsimError(f"{path}:{n}: expected a JSON object")
                        rows.append((n, obj))
            else:
                reader = csv.DictReader(fh)
                if not reader.fieldnames:
                    raise SpecsimError(f"{path}:1: no header row")
                reader.fieldnames = [f.strip() for f in reader.fieldnames]
                for n, row in enumerate(reader, start=2):
                    rows.append((n, row))
    except FileNotFoundError:
        raise SpecsimError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise SpecsimError(f"{path}: not UTF-8 text") from None
    if not rows:
        raise SpecsimError(f"{path}: no requests in the file")
    if limit is not None:
        rows = rows[:limit]
    arrivals, times = [], []
    for i, (n, row) in enumerate(rows):
        t = _parse_time(_pick(row, _TIME_KEYS, path, n, "arrival time"), path, n)
        prompt = _positive_int(_pick(row, _PROMPT_KEYS, path, n, "prompt tokens"), path, n,
                               "ContextTokens")
        output = _positive_int(_pick(row, _OUTPUT_KEYS, path, n, "output tokens"), path, n,
                               "GeneratedTokens")
        times.append(t)
        arrivals.append((i, t, prompt, output, n))
    t0 = min(times)
    out = []
    last = -math.inf
    for i, t, prompt, output, n in arrivals:
        rel = (t - t0) * time_scale
        if rel < last - 1e-9:
            raise SpecsimError(f"{path}:{n}: column TIMESTAMP: arrivals must be in time order")
        last = rel
        out.append(Arrival(i, rel, prompt, output))
    return out
