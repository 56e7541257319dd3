"""Per-phase wall time of a decoding run: draft, verify, selection, other (and prefill).

On a CUDA device each phase is bracketed by CUDA events recorded on the current stream, so
timing adds no host synchronisation to the loop; the events are read once, in ``totals``.
Elsewhere phases are timed with ``time.perf_counter`` (CPU work is synchronous).
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

PHASES = ("prefill", "draft", "verify", "selection", "other")


class PhaseTimer:
    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"
        self._events: dict[str, list] = defaultdict(list)
        self._seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    @contextmanager
    def phase(self, name: str):
        self.counts[name] += 1
        if self.cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            yield
            end.record()
            self._events[name].append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._seconds[name] += time.perf_counter() - t0

    def totals(self) -> dict[str, float]:
        """Seconds per phase (synchronises the device once on CUDA)."""
        out = dict(self._seconds)
        if self.cuda and self._events:
            torch.cuda.synchronize()
            for name, pairs in self._events.items():
                out[name] = out.get(name, 0.0) + sum(s.elapsed_time(e) for s, e in pairs) / 1e3
        return {name: out.get(name, 0.0) for name in (*PHASES, *sorted(set(out) - set(PHASES)))}


__all__ = ["PHASES", "PhaseTimer"]
