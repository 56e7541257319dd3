"""The attention work of a prefill, as the engine computes it (no torch here: the cost models
and the engine share these rules).

A prompt without a window or sinks runs SDPA's causal kernel: new row i (of ``new`` after
``past`` cached positions) reads ``past + i`` keys. With a window or sinks the engine runs
:func:`specsim.engine.attention.prefill_attention`'s masked path over chunks of query rows,
each computing its whole rectangle of (rows × the keys any of them sees), about
:data:`PREFILL_CHUNK_ELEMENTS` elements a chunk; a window layer's chunk reads only its rows'
keys. :func:`attention_elements` counts the query-key products either way: the axis the
``prefill_attention`` operator is measured and priced on.
"""
from __future__ import annotations

import math

#: Mask elements (query rows × keys) of one chunk of a masked prefill.
PREFILL_CHUNK_ELEMENTS = 1 << 24


def masked_rows(length: int, window: int | None) -> int:
    """Query rows per chunk of a masked prefill of ``length`` rows."""
    if window:          # r rows read r + W − 1 keys (+ the sink): r·(r + W) elements
        rows = int((math.sqrt(window * window + 4 * PREFILL_CHUNK_ELEMENTS) - window) / 2)
    else:               # every row may read all keys
        rows = PREFILL_CHUNK_ELEMENTS // (length + 1)
    return max(1, min(length, rows))


def attention_elements(new: int, past: int = 0, window: int | None = None,
                       masked: bool = False, sinks: bool = False) -> float:
    """Query-key products of one sequence's prefill of ``new`` positions after ``past``
    cached ones, per query head: the causal kernel's (``masked`` False) or the masked path's
    chunk rectangles (a window or sinks; ``sinks``: the sink is one more key a row)."""
    new, past = int(new), int(past)
    if new <= 0:
        return 0.0
    if not masked:
        if window:
            # the row at position p (1-based) reads min(p, W) keys: rows past+1 .. W read p,
            # the rest W
            short = max(0, min(past + new, window) - past)
            return float((2 * past + short + 1) * short / 2 + (new - short) * window)
        return float(new * past + new * (new + 1) / 2)
    total = past + new
    rows = masked_rows(total, window)
    elements = 0.0
    for first in range(past, total, rows):
        last = min(total, first + rows)
        low = max(0, first - window + 1) if window else 0
        elements += (last - first) * (last - low + (1 if sinks else 0))
    return elements


def chunks(prompt_lengths, past=None):
    """(new, past) as int arrays of one entry per sequence: ``prompt_lengths`` ≥ 1 new
    positions each after ``past`` ≥ 0 cached ones (default none)."""
    import numpy as np

    new = np.atleast_1d(np.asarray(prompt_lengths, dtype=np.int64))
    if new.size == 0 or (new < 1).any():
        raise ValueError("prefill lengths must be ≥ 1")
    if past is None:
        return new, np.zeros_like(new)
    before = np.atleast_1d(np.asarray(past, dtype=np.int64))
    if before.shape != new.shape or (before < 0).any():
        raise ValueError("prefill: one cached length ≥ 0 per prompt chunk")
    return new, before
