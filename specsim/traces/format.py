"""specsim trace format v1: what a real system recorded, as JSON Lines.

Line 1 is the header, every other line one record::

    {"specsim_trace": 1, "model": "smollm2-135m", "source": "...", "synthetic": false,
     "description": "...", "created": "2026-11-29T12:00:00Z"}
    {"type": "request", "id": "r0", "policy": "vegas", "s": 0.05,
     "context": [4100, 4104, ...],      # context length at the start of each iteration
     "k": [8, 8, ...],                  # drafts per iteration
     "m": [3, 7, ...],                  # accepted drafts per iteration (0 ≤ m ≤ k)
     "entropy": [[...k floats], ...],   # optional: draft entropy (nats) per draft position
     "accept_prob": [[...k floats], ...],  # optional: min(1, p/q) per draft position
     "prompt_id": "p17"}                # optional: shared by runs of the same prompt
    {"type": "histogram", "id": "...", "policy": "unknown", "s": null, "k": 4,
     "counts": [n_m0, n_m1, ..., n_mk], "context": null}

A ``request`` record keeps every iteration of one request; a ``histogram`` record keeps only
how many iterations accepted m = 0..k drafts (what aggregate counters such as vLLM's allow).
``s`` is the sparsity ratio (selected KV / context), null when the drafter is not sparse.
Reading validates everything and raises :class:`~specsim.errors.TraceError` naming the file,
line and field; writing goes to a temporary file renamed into place (never half-written).

Reading takes a UTF-8 byte-order mark and CRLF line ends, and a gzip-compressed file
(``.jsonl.gz``, told by its magic bytes), decompressed as it is read and refused once it
expands beyond :func:`decompressed_limit`. JSON is parsed strictly (:func:`loads_strict`):
NaN and Infinity literals, duplicate keys, integers of more than 4300 digits and nesting
deeper than Python's recursion limit are refused with the line. A draft length above
:data:`~specsim.analytical.MAX_K` is refused.
"""
from __future__ import annotations

import gzip
import itertools
import json
import math
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from specsim.analytical import MAX_K
from specsim.atomic import atomic_writer
from specsim.errors import TraceError, quote

VERSION = 1
HEADER_KEY = "specsim_trace"
MAX_INT = 2**53  # counts and lengths beyond this are corrupt input
#: a gzip file may expand to this many times its compressed size (JSON Lines of numbers
#: compress about 3-10 times; a gzip bomb of zeros about 1000 times) ...
GZIP_MAX_RATIO = 100
#: ... but always to this many bytes, and never beyond GZIP_MAX_BYTES
GZIP_MIN_BYTES = 64 * 2**20
GZIP_MAX_BYTES = 8 * 2**30

#: Selection policies specsim models; other strings are kept but treated as opaque drafters.
KNOWN_POLICIES = ("vegas", "sparsespec", "streamingllm", "quest", "last-token", "full")


class RaggedRows:
    """Rows of different lengths (one per iteration, k_i numbers each) kept as one flat float
    array and the offsets where each row starts: 8 bytes a number and 8 a row, where a list of
    arrays costs about 100 more a row. Reads like a list of 1-D arrays: ``len``, iteration,
    ``rows[i]`` (a view)."""

    __slots__ = ("values", "offsets")

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        self.values, self.offsets = values, offsets

    @classmethod
    def of(cls, rows) -> "RaggedRows":
        """From any sequence of 1-D number sequences."""
        if isinstance(rows, RaggedRows):
            return rows
        arrays = [np.asarray(r, dtype=float).ravel() for r in rows]
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([a.size for a in arrays], out=offsets[1:])
        values = np.concatenate(arrays) if arrays else np.zeros(0)
        return cls(values.astype(float, copy=False), offsets)

    def __len__(self) -> int:
        return self.offsets.size - 1

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"row {i} of {n}")
        i %= n
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    def __iter__(self):
        values, offsets = self.values, self.offsets.tolist()
        for a, b in zip(offsets[:-1], offsets[1:]):
            yield values[a:b]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def padded(self, width: int, fill: float = np.nan) -> np.ndarray:
        """``[rows, width]``: row i in its first k_i columns, ``fill`` after."""
        lengths = self.lengths()
        out = np.full((len(self), width), fill)
        columns = np.arange(self.values.size) - np.repeat(self.offsets[:-1], lengths)
        out[np.repeat(np.arange(len(self)), lengths), columns] = self.values
        return out

    def rounded_lists(self, decimals: int) -> list[list[float]]:
        flat = np.round(self.values, decimals).tolist()
        offsets = self.offsets.tolist()
        return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


@dataclass
class RequestTrace:
    """All iterations of one request, as parallel arrays."""

    id: str
    policy: str
    s: float | None
    context: np.ndarray
    k: np.ndarray
    m: np.ndarray
    #: per iteration, one number per draft: a :class:`RaggedRows` as read (a list of arrays
    #: also serves)
    entropy: RaggedRows | list[np.ndarray] | None = None
    accept_prob: RaggedRows | list[np.ndarray] | None = None
    prompt_id: str | None = None   # the same prompt under other policies/s shares this id

    @property
    def iterations(self) -> int:
        return int(self.k.size)

    @property
    def tokens(self) -> int:
        """Tokens emitted: Σ (m + 1)."""
        return int(np.sum(self.m + 1))

    def to_json(self) -> dict:
        out = {"type": "request", "id": self.id, "policy": self.policy, "s": self.s,
               "context": self.context.tolist(), "k": self.k.tolist(), "m": self.m.tolist()}
        if self.entropy is not None:
            out["entropy"] = RaggedRows.of(self.entropy).rounded_lists(5)
        if self.accept_prob is not None:
            out["accept_prob"] = RaggedRows.of(self.accept_prob).rounded_lists(5)
        if self.prompt_id is not None:
            out["prompt_id"] = self.prompt_id
        return out


@dataclass
class HistogramTrace:
    """Aggregate: ``counts[m]`` iterations accepted m drafts out of k."""

    id: str
    policy: str
    s: float | None
    k: int
    counts: np.ndarray
    context: float | None = None

    @property
    def iterations(self) -> int:
        return int(self.counts.sum())

    def to_json(self) -> dict:
        return {"type": "histogram", "id": self.id, "policy": self.policy, "s": self.s,
                "k": self.k, "counts": self.counts.tolist(), "context": self.context}


@dataclass
class Trace:
    header: dict
    requests: list[RequestTrace] = field(default_factory=list)
    histograms: list[HistogramTrace] = field(default_factory=list)
    path: str | None = None

    @property
    def synthetic(self) -> bool:
        return bool(self.header.get("synthetic", False))

    def groups(self) -> dict[tuple[str, float | None], "Trace"]:
        """Split into one trace per (policy, s), in a stable order."""
        out: dict[tuple[str, float | None], Trace] = {}
        for rec in [*self.requests, *self.histograms]:
            key = (rec.policy, rec.s)
            sub = out.setdefault(key, Trace(self.header, path=self.path))
            (sub.requests if isinstance(rec, RequestTrace) else sub.histograms).append(rec)
        return dict(sorted(out.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None
                                                        else kv[0][1])))


def make_header(*, source: str, model: str | None = None, synthetic: bool = False,
                description: str = "", **extra) -> dict:
    import datetime as _dt
    created = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {HEADER_KEY: VERSION, "model": model, "source": source, "synthetic": synthetic,
            "description": description, "created": created, **extra}


# --------------------------------------------------------------------------------------------
# validation helpers: each raises TraceError(path, line, field)
# --------------------------------------------------------------------------------------------


class _Checker:
    def __init__(self, path: str | None, line: int):
        self.path, self.line = path, line

    def fail(self, field: str | None, message: str):
        raise TraceError(message, path=self.path, line=self.line, field=field)

    def get(self, obj: dict, key: str, kinds, *, optional=False, nullable=False):
        if key not in obj:
            if optional:
                return None
            self.fail(key, "missing")
        value = obj[key]
        if value is None:
            if nullable or optional:
                return None
            self.fail(key, "expected a value, got null")
        allowed = kinds if isinstance(kinds, tuple) else (kinds,)
        if isinstance(value, bool) and bool not in allowed:
            self.fail(key, f"expected {_kind_name(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            self.fail(key, f"expected {_kind_name(kinds)}, got {type(value).__name__} "
                           f"{quote(value, 24)}")
        return value

    def int_array(self, obj: dict, key: str, *, minimum: int, length: int | None = None,
                  maximum: int = MAX_INT):
        values = self.get(obj, key, list)
        if length is not None and len(values) != length:
            self.fail(key, f"has {len(values)} entries, expected {length} (one per iteration)")
        if set(map(type, values)) <= {int}:      # the common case, checked in bulk
            try:
                arr = np.array(values, dtype=np.int64)
            except OverflowError:
                arr = None
            if arr is not None and (arr.size == 0 or (arr.min() >= minimum
                                                      and arr.max() <= maximum)):
                return arr
        self._int_values(key, values, minimum, maximum)   # raises, naming the entry
        return np.asarray(values, dtype=np.int64)

    def _int_values(self, key: str, values: list, minimum: int, maximum: int):
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int):
                self.fail(f"{key}[{i}]", f"expected an integer, got {quote(v)}")
            if v < minimum:
                self.fail(f"{key}[{i}]", f"expected ≥ {minimum}, got {quote(v)}")
            if v > maximum:
                self.fail(f"{key}[{i}]", f"expected ≤ {maximum}, got {quote(v)}"
                          + (f" (the longest draft specsim models is k = {MAX_K})"
                             if maximum == MAX_K else ""))

    def sparsity(self, obj: dict):
        s = self.get(obj, "s", (int, float), nullable=True)
        if s is not None and not (0.0 < s <= 1.0 and math.isfinite(s)):
            self.fail("s", f"expected a sparsity ratio in (0, 1], got {quote(s)}")
        return None if s is None else float(s)

    def policy(self, obj: dict):
        policy = self.get(obj, "policy", str)
        if not policy.strip():
            self.fail("policy", "expected a policy name, got an empty string")
        return policy

    def per_draft(self, obj: dict, key: str, k: np.ndarray, lo: float, hi: float):
        rows = self.get(obj, key, list, optional=True)
        if rows is None:
            return None
        if len(rows) != k.size:
            self.fail(key, f"has {len(rows)} rows, expected {k.size} (one per iteration)")
        if set(map(type, rows)) <= {list}:          # the common case, checked in bulk
            lengths = np.fromiter(map(len, rows), np.int64, count=len(rows))
            if np.array_equal(lengths, k):
                flat = list(itertools.chain.from_iterable(rows))
                if set(map(type, flat)) <= {float, int}:
                    try:
                        values = np.array(flat, dtype=float)
                    except OverflowError:
                        values = None
                    if values is not None and np.all(np.isfinite(values)) \
                            and (values.size == 0 or (values.min() >= lo
                                                      and values.max() <= hi)):
                        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
                        np.cumsum(lengths, out=offsets[1:])
                        return RaggedRows(values, offsets)
        self._per_draft_rows(key, rows, k, lo, hi)   # raises, naming the row
        return RaggedRows.of(rows)

    def _per_draft_rows(self, key: str, rows: list, k: np.ndarray, lo: float, hi: float):
        for i, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != k[i]:
                self.fail(f"{key}[{i}]", f"expected a list of k={k[i]} numbers")
            for j, v in enumerate(row):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    self.fail(f"{key}[{i}][{j}]", f"expected a number, got {quote(v)}")
            arr = np.asarray(row, dtype=float)
            if not np.all(np.isfinite(arr)) or np.any(arr < lo) or np.any(arr > hi):
                self.fail(f"{key}[{i}]", f"values must lie in [{lo}, {hi}]")


def _kind_name(kinds) -> str:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    names = {int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object", bool: "a boolean"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def check_header(obj, path: str | None, line: int = 1) -> dict:
    c = _Checker(path, line)
    if not isinstance(obj, dict) or HEADER_KEY not in obj:
        c.fail(HEADER_KEY, f"not a specsim trace: line 1 must be a header object with "
                           f"\"{HEADER_KEY}\": {VERSION}")
    version = obj[HEADER_KEY]
    if version != VERSION:
        c.fail(HEADER_KEY, f"unknown trace version {quote(version)}; this specsim reads version "
                           f"{VERSION}")
    c.get(obj, "source", str)
    c.get(obj, "synthetic", bool, optional=True)
    return obj


def parse_record(obj, path: str | None, line: int, *, per_draft: bool = True
                 ) -> RequestTrace | HistogramTrace:
    """One validated record; with ``per_draft`` False a request's ``entropy`` and
    ``accept_prob`` are checked but not kept (None), for readers that use only (context, k,
    m)."""
    c = _Checker(path, line)
    if not isinstance(obj, dict):
        c.fail(None, "a record must be a JSON object")
    kind = c.get(obj, "type", str)
    rid = str(c.get(obj, "id", (str, int)))
    policy, s = c.policy(obj), c.sparsity(obj)
    if kind == "request":
        k = c.int_array(obj, "k", minimum=1, maximum=MAX_K)
        if k.size == 0:
            c.fail("k", "a request needs at least one iteration")
        context = c.int_array(obj, "context", minimum=1, length=k.size)
        m = c.int_array(obj, "m", minimum=0, length=k.size)
        bad = np.flatnonzero(m > k)
        if bad.size:
            i = int(bad[0])
            c.fail(f"m[{i}]", f"accepted {m[i]} > drafted k={k[i]}")
        entropy = c.per_draft(obj, "entropy", k, 0.0, 1e3)
        accept_prob = c.per_draft(obj, "accept_prob", k, 0.0, 1.0)
        prompt_id = c.get(obj, "prompt_id", (str, int), optional=True)
        if not per_draft:
            entropy = accept_prob = None
        return RequestTrace(rid, policy, s, context, k, m, entropy, accept_prob,
                            None if prompt_id is None else str(prompt_id))
    if kind == "histogram":
        k = c.get(obj, "k", int)
        if k < 1:
            c.fail("k", f"expected ≥ 1, got {quote(k)}")
        if k > MAX_K:
            c.fail("k", f"expected ≤ {MAX_K}, got {quote(k)} (the longest draft specsim models "
                        f"is k = {MAX_K})")
        counts = c.int_array(obj, "counts", minimum=0, length=k + 1)
        if counts.sum() == 0:
            c.fail("counts", "histogram is empty (all counts 0)")
        context = c.get(obj, "context", (int, float), optional=True)
        if context is not None and not (math.isfinite(context) and context >= 1):
            c.fail("context", f"expected ≥ 1, got {quote(context)}")
        return HistogramTrace(rid, policy, s, int(k), counts,
                              None if context is None else float(context))
    c.fail("type", f"unknown record type {quote(kind)}; expected 'request' or 'histogram'")
    raise AssertionError  # unreachable


def decompressed_limit(compressed_bytes: int) -> int:
    """The most bytes a gzip file of ``compressed_bytes`` may expand to before it is refused:
    :data:`GZIP_MAX_RATIO` times its size, at least :data:`GZIP_MIN_BYTES`, at most
    :data:`GZIP_MAX_BYTES`."""
    return min(GZIP_MAX_BYTES, max(GZIP_MIN_BYTES, GZIP_MAX_RATIO * compressed_bytes))


def _gzip_lines(fh, path: str, limit: int) -> Iterator[bytes]:
    """The decompressed lines of a gzip stream, refused once they pass ``limit`` bytes."""
    stream = gzip.GzipFile(fileobj=fh, mode="rb")
    total, n = 0, 0
    while True:
        try:
            raw = stream.readline(limit - total + 1)
        except (OSError, EOFError, zlib.error) as exc:
            reason = "truncated" if isinstance(exc, EOFError) else "corrupt"
            raise TraceError(f"{reason} gzip data ({exc})", path=path, line=n + 1) from None
        if not raw:
            return
        total += len(raw)
        if total > limit:
            raise TraceError(f"gzip data expands beyond {limit} bytes ({GZIP_MAX_RATIO} times "
                             f"the file, at least {GZIP_MIN_BYTES}): refused as a "
                             f"decompression bomb", path=path, line=n + 1)
        n += 1
        yield raw


def text_lines(path: str) -> Iterator[tuple[int, str]]:
    """The lines of a text file as (1-based number, text without the line end).

    A UTF-8 byte-order mark is dropped, ``\\r\\n`` ends like ``\\n``; a gzip file is decompressed
    as it is read. Raises :class:`TraceError` naming the file (and the line, for bytes that
    are not UTF-8) when it is missing, a directory, unreadable or not text.
    """
    if not os.path.exists(path):
        raise TraceError("no such file", path=path)
    if os.path.isdir(path):
        raise TraceError("is a directory, not a trace file", path=path)
    try:
        fh = open(path, "rb")
        magic = fh.read(2)
        fh.seek(0)
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror}", path=path) from None
    with fh:
        if magic == b"\x1f\x8b":
            size = os.fstat(fh.fileno()).st_size
            raws = _gzip_lines(fh, path, decompressed_limit(size))
        else:
            raws = iter(fh)
        for n, raw_bytes in enumerate(raws, start=1):
            if n == 1 and raw_bytes.startswith(b"\xef\xbb\xbf"):
                raw_bytes = raw_bytes[3:]
            try:
                raw = raw_bytes.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = raw_bytes[exc.start:exc.start + 1].hex()
                raise TraceError(f"not UTF-8 text (byte {exc.start + 1} of the line: 0x{bad})",
                                 path=path, line=n) from None
            yield n, raw.rstrip("\r\n")


class JSONRefusal(ValueError):
    """Valid-looking JSON that specsim refuses (a NaN literal, a duplicate key)."""

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(message)


def _refuse_constant(name: str):
    raise JSONRefusal(f"{name} is not a number (JSON has no NaN or Infinity)")


def _unique_keys(pairs) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise JSONRefusal(f"duplicate key {quote(key)}", field=key)
        out[key] = value
    return out


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONRefusal(f"number {quote(text)} overflows a float")
    return value


def loads_strict(text: str, *, check_floats: bool = False):
    """``json.loads`` refusing NaN/Infinity literals and duplicate keys (and, with
    ``check_floats``, numbers that overflow a float) with :class:`JSONRefusal`; other
    problems raise what ``json.loads`` raises (``JSONDecodeError``, ``ValueError`` for an
    integer of more than 4300 digits, ``RecursionError``)."""
    return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys,
                      **({"parse_float": _finite_float} if check_floats else {}))


def json_error_reason(exc: BaseException) -> str:
    """One line saying why :func:`loads_strict` refused a text."""
    if isinstance(exc, json.JSONDecodeError):
        return f"bad JSON: {exc.msg} (column {exc.colno})"
    if isinstance(exc, JSONRefusal):
        return f"bad JSON: {exc}"
    if isinstance(exc, RecursionError):
        return "bad JSON: nested too deeply"
    if "integer string conversion" in str(exc):
        return "bad JSON: an integer of more than 4300 digits"
    return f"bad JSON: {quote(str(exc), 60)}"


def parse_json_line(text: str, path: str, line: int) -> object:
    """One line of JSON; malformed, duplicate-keyed, too deeply nested or oversized input is a
    TraceError."""
    try:
        return loads_strict(text)
    except (ValueError, RecursionError) as exc:   # JSONDecodeError and JSONRefusal included
        raise TraceError(json_error_reason(exc), path=path, line=line,
                         field=getattr(exc, "field", None) or constant_key(text)) from None


_CONSTANT_KEY = re.compile(r'"([^"\\]{1,60})"\s*:\s*\[?\s*-?(?:NaN|Infinity)\b')


def constant_key(text: str) -> str | None:
    """The key whose value (or first list entry) is a NaN or Infinity literal, if any."""
    m = _CONSTANT_KEY.search(text[:1_000_000])
    return m.group(1) if m else None


def json_lines(path: str) -> Iterator[tuple[int, object]]:
    """The non-blank lines of a JSON Lines file as (line number, parsed value)."""
    for n, text in text_lines(path):
        if text.strip():
            yield n, parse_json_line(text, path, n)


def read_trace(path: str | os.PathLike, *, per_draft: bool = True) -> Trace:
    """Read and validate a specsim v1 trace, one line at a time: what is kept per request is
    its numpy arrays. ``per_draft`` False checks the per-draft fields (``entropy``,
    ``accept_prob``) but keeps none of them: what ``predict``, which reads only (context, k,
    m), needs."""
    path = str(path)
    lines = json_lines(path)
    first = next(lines, None)
    if first is None:
        raise TraceError("empty file: expected a header line", path=path, line=1)
    header = check_header(first[1], path, first[0])
    trace = Trace(header, path=path)
    seen: dict[str, int] = {}
    for n, obj in lines:
        rec = parse_record(obj, path, n, per_draft=per_draft)
        del obj
        if rec.id in seen:
            raise TraceError(f"duplicate id {quote(rec.id)} (first on line {seen[rec.id]})",
                             path=path, line=n, field="id")
        seen[rec.id] = n
        (trace.requests if isinstance(rec, RequestTrace) else trace.histograms).append(rec)
    if not trace.requests and not trace.histograms:
        raise TraceError("trace has a header but no records", path=path, line=1)
    return trace


def write_trace(path: str | os.PathLike, header: dict,
                records: Iterable[RequestTrace | HistogramTrace]) -> int:
    """Write atomically (temporary file + rename). Returns the number of records."""
    path = Path(path)
    check_header(header, str(path))
    n = 0
    with atomic_writer(path) as fh:
        fh.write(json.dumps(header) + "\n")
        for rec in records:
            obj = rec.to_json()
            parse_record(obj, str(path), n + 2)  # never write what read_trace rejects
            fh.write(json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n")
            n += 1
    return n
