"""Probe (GPU): why a run's verify phase and the calibration's verify differ (issue #5).

In the H200 validation runs (Qwen3-8B, batch 4, 32K, forced acceptance) Vegas' verify phase
took 11.43 ms at q = 3 where the calibration's shared verify — timed on Vegas' engine, which
collects the same two rows — says 10.93; StreamingLLM's, which collects nothing, took 10.85.
SmolLM2 (batch 32) showed +0.3 ms the same way. Per policy, this times one verify pass three
ways on one engine:

- ``alone``: as the calibration does (``calibrate._time``: each pass timed by itself, the
  host waiting for it, the cache rolled back after);
- ``after draft``: as a run issues it — right behind a draft chain of k steps, no host wait
  between them, CUDA events around the verify only;
- ``in run``: the verify phase of a forced-acceptance generate (CUDA-event phase split);

and prints one line per policy. A gap between ``alone`` and ``after draft`` says the
calibration should time the verify where runs issue it; none, and the difference lives in
the run's phase accounting.

    PYTHONPATH=. python3 scripts/verify_phase_probe.py [MODEL] [BATCH] [CONTEXT] [K] [POLICIES]

(defaults: qwen3-8b 4 32768 2 vegas,streamingllm,sparsespec). On the CPU it runs a tiny
model of the same family with wall-clock timing (a smoke test of the script).
"""
from __future__ import annotations

import sys
import time

import numpy as np
import torch

from specsim.calibrate import _time as calibration_time
from specsim.engine import Engine
from specsim.engine.model import timing_model
from specsim.traces.format import RequestTrace

CUDA = torch.cuda.is_available()
REPEATS, WARMUP = 20, 3


def _seconds(fn, repeats: int, after=None) -> list[float]:
    if CUDA:
        return calibration_time(torch, fn, repeats, WARMUP, after)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        if after:
            after()
    return out


def after_draft(engine: Engine, k: int, q: int, repeats: int) -> list[float]:
    """Verify passes issued right behind a draft chain, as the run issues them: the host does
    not wait between them; events around each verify only. After each pair the cache and the
    lists (each draft step appended its position) are put back."""
    counts = engine.selection.counts
    saved = None if counts is None else counts.clone()

    def undo():
        engine.cache.rollback(q)
        if saved is not None:
            counts.copy_(saved)
    if not CUDA:
        out = []
        for _ in range(repeats):
            engine.draft_chain(k)
            t0 = time.perf_counter()
            engine.verify(q)
            out.append(time.perf_counter() - t0)
            undo()
        return out
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(repeats + WARMUP)]
    for start, end in pairs:
        engine.draft_chain(k)
        start.record()
        engine.verify(q)
        end.record()
        undo()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in pairs[WARMUP:]]


def main():
    args = sys.argv[1:]
    name = args[0] if args else "qwen3-8b"
    batch = int(args[1]) if len(args) > 1 else 4
    context = int(args[2]) if len(args) > 2 else 32768
    k = int(args[3]) if len(args) > 3 else 2
    policies = (args[4] if len(args) > 4 else "vegas,streamingllm,sparsespec").split(",")
    if not CUDA:
        batch, context = min(batch, 2), min(context, 256)
    model = timing_model(name)
    q, n = k + 1, 16
    prompts = [[0] * context] * batch
    print(f"{name} batch {batch} context {context} k {k} (q {q}); verify ms, median "
          f"[p10, p90]:")
    for policy in policies:
        engine = Engine(model, batch=batch, max_len=context + (k + 1) * (n + 2) + 8,
                        policy=policy, s=0.05, k_max=k, beyond_max_position=True)
        forced = [RequestTrace(str(b), policy, 0.05, context + np.arange(n) * (k // 2 + 1),
                               np.full(n, k), np.full(n, k // 2)) for b in range(batch)]
        with torch.inference_mode():
            for _ in range(2):                          # compiled, captured, then measured
                gen = engine.generate(prompts, n + 1, k=k, forced=forced, prefill="random")
            in_run = 1e3 * gen.timing["verify"] / gen.iterations
            alone = _seconds(lambda: engine.verify(q), REPEATS,
                             lambda: engine.cache.rollback(q))
            chained = after_draft(engine, k, q, REPEATS)

        def fmt(xs):
            ms = 1e3 * np.asarray(xs)
            return f"{np.median(ms):7.3f} [{np.percentile(ms, 10):.3f}, " \
                   f"{np.percentile(ms, 90):.3f}]"
        print(f"  {policy:>12}: alone {fmt(alone)} | after draft {fmt(chained)} | "
              f"in run {in_run:7.3f}", flush=True)
        del engine
        if CUDA:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
