"""The attention work of a prefill, as the engine computes it (no torch here: the cost models
and the engine share these rules).

:func:`specsim.engine.attention.prefill_attention` runs one of three paths (:func:`path`):

- ``causal``: SDPA's causal kernel; new row i (of ``new`` after ``past`` cached positions)
  reads ``past + i`` keys;
- ``sinks`` (a full layer with attention sinks, or a window layer whose window is no shorter
  than the prompt): the same causal kernel, returning its log-sum-exp, and one element-wise
  pass folding the sink into every output row (:func:`sink_fold_bytes`): the causal kernel's
  products, priced as that kernel plus the pass;
- ``window`` (a sliding-window layer whose window is shorter than the prompt, with or without
  sinks): the rows in chunks of :func:`window_rows` R, all chunks in one batched SDPA call
  (blocks of them for a long prompt) with one shared mask; each chunk reads its R + W − 1 keys
  (+ the sink), so it computes R · (R + W − 1 + sink) products, the last chunk padded to R
  rows.

:func:`attention_elements` counts the query-key products of each path: the axis the
``prefill_attention`` operator is measured and priced on, on the kernels of
:data:`OPERATOR_PATHS`.
"""
from __future__ import annotations

import math

#: The prefill attention paths (:func:`path`).
PATHS = ("causal", "sinks", "window")
#: The kernels the ``prefill_attention`` operator times: the sink path runs the causal one.
OPERATOR_PATHS = ("causal", "window")


def operator_path(kind: str) -> str:
    """The ``prefill_attention`` kernel a path runs on (:data:`OPERATOR_PATHS`)."""
    return "window" if kind == "window" else "causal"


def sink_fold_bytes(tokens: float, heads: int, head_dim: int, dtype_bytes: int) -> float:
    """Bytes of the sink path's fold over ``tokens`` rows of one layer: each head's output
    row read and written, its fp32 log-sum-exp read."""
    return float(tokens) * heads * (2 * head_dim * dtype_bytes + 4)


def path(window: int | None, sinks: bool, length: int | None = None) -> str:
    """The path a layer's prefill attention runs (module doc) for a prompt of ``length``
    positions in all (a window no shorter than the prompt hides nothing: causal)."""
    return "window" if windowed(window, length) else "sinks" if sinks else "causal"


def windowed(window: int | None, length: int | None) -> bool:
    """Whether a window of ``window`` hides any key from a prompt of ``length`` positions."""
    return bool(window) and (length is None or int(length) > int(window))


def window_rows(window: int) -> int:
    """Query rows per chunk of a window layer's prefill: the window itself (each chunk then
    computes about twice its rows' W keys), at least 16."""
    return max(16, int(window))


def attention_elements(new: int, past: int = 0, window: int | None = None,
                       sinks: bool = False) -> float:
    """Query-key products of one sequence's prefill of ``new`` positions after ``past``
    cached ones, per query head, as :func:`path`'s kernel computes them (module doc; ``sinks``
    adds a key to each window chunk only)."""
    new, past = int(new), int(past)
    if new <= 0:
        return 0.0
    if windowed(window, past + new):
        rows = window_rows(window)
        return float(math.ceil(new / rows) * rows * (rows + window - 1 + (1 if sinks else 0)))
    return ideal_elements(new, past)                # the causal kernel: each row's own keys


def ideal_elements(new: int, past: int = 0, window: int | None = None) -> float:
    """The fewest query-key products of one sequence's prefill, per query head: row p
    (1-based) reads min(p, W) keys (all p without a window). What a roofline prices."""
    new, past = int(new), int(past)
    if new <= 0:
        return 0.0
    if window:
        # rows past+1 .. W read p keys, the rest W
        short = max(0, min(past + new, window) - past)
        return float((2 * past + short + 1) * short / 2 + (new - short) * window)
    return float(new * past + new * (new + 1) / 2)


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
