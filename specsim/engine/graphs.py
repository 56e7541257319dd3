"""CUDA graphs for the engine's hot steps (one draft step, one verify pass of q tokens).

A step is a function of static buffers only (input tokens, the KV cache and its ``lengths``,
the draft index lists, the collected-logits buffers), so it can be captured once and replayed
each iteration with a single launch. Warm-up runs (which also compile the Triton kernels and
make their plans) change state — they extend the cache lengths and append to the index lists —
so the caller passes ``snapshot()``, which saves that state and returns a function restoring
it. Capture itself records without executing. GPU only; never used on the CPU path.
"""
from __future__ import annotations

from typing import Callable

import torch


class CapturedStep:
    def __init__(self, step: Callable[[], torch.Tensor],
                 snapshot: Callable[[], Callable[[], None]], *, pool=None, warmup: int = 2):
        restore = snapshot()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                step()
                restore()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = step()
        restore()

    def __call__(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


__all__ = ["CapturedStep"]
