"""`specsim calibrate --gpu`: time the engine's own steps on this GPU at a grid of shapes.

GPU side (torch, the engine and its kernels; no simpy/plotly). With random weights of the
model's real shapes and the KV cache filled with random numbers (no prefill), for every batch
size and context length that fits in memory it times, as the engine runs them (CUDA graphs,
Triton kernels):

- ``plain``: one plain decoding step (q = 1, full attention, no collection);
- ``verify``: one verify pass of q tokens (with the Vegas Collect-2-Query rows, as in a run);
- ``draft:<policy>``: one sparse draft step at sparsity s, after a real selection;
- ``selection:<policy>``: one refresh of every layer's index lists after a verify (Quest's
  page scoring runs inside each of its draft steps, so it is part of ``draft:quest``).

Each point: warm-up calls, then ``repeats`` calls timed one by one with CUDA events (the cache
length is rolled back after each, so every call sees the same context). The ceilings (copy
bandwidth, bf16 matrix rate) are measured in the same run, and the provenance recorded.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from specsim.costs.calibrated import Calibration, Measurement, collect_provenance
from specsim.specs import ModelSpec, catalog_dir


@dataclass
class CalibrationGrid:
    batches: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    contexts: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384,
                                                         32768, 65536, 131072])
    qs: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 12, 16])
    sparsities: list[float] = field(default_factory=lambda: [0.03, 0.05, 0.1])
    policies: list[str] = field(default_factory=lambda: ["vegas", "sparsespec",
                                                         "streamingllm", "quest"])
    repeats: int = 20
    warmup: int = 3
    memory_fraction: float = 0.85
    time_budget_s: float | None = None   # stop starting new shapes after this long


def kernel_config_hash() -> str:
    """Hash of the kernels' source: a calibration is tied to the kernels it timed."""
    from pathlib import Path
    import specsim.kernels as K
    digest = hashlib.sha256()
    for path in sorted(Path(K.__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _ceilings(torch) -> dict:
    a = torch.empty(2**30, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    copy = _time(torch, lambda: b.copy_(a), 10, 3)
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm = _time(torch, lambda: x @ x, 10, 3)
    del a, b, x
    return {"copy_bandwidth_Bps": 2 * 2**31 / float(np.median(copy)),
            "bf16_matmul_flops": 2 * 8192**3 / float(np.median(mm))}


def _time(torch, fn, repeats: int, warmup: int, after=None) -> list[float]:
    """Seconds of ``fn`` per call, each call timed alone with CUDA events."""
    for _ in range(warmup):
        fn()
        if after:
            after()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
        if after:
            after()
    return out


def measure(spec: ModelSpec, grid: CalibrationGrid, config: dict | None = None,
            progress: bool = True) -> Calibration:
    import torch

    from specsim.engine import Engine, build_model

    if config is None:
        config = json.loads((catalog_dir() / spec.name / "config.json").read_text())
    model = build_model(config, weights="random", dtype=torch.bfloat16, device="cuda")
    free = torch.cuda.mem_get_info()[0]
    ceilings = _ceilings(torch)
    rows: list[Measurement] = []
    shapes = [(b, c) for b in grid.batches for c in grid.contexts
              if b * (c + 64) * spec.kv_bytes_per_token < grid.memory_fraction * free]
    skipped = len(grid.batches) * len(grid.contexts) - len(shapes)
    started = time.perf_counter()
    for n, (batch, context) in enumerate(shapes):
        if grid.time_budget_s and time.perf_counter() - started > grid.time_budget_s:
            print(f"time budget reached: {len(shapes) - n} shapes left unmeasured",
                  file=sys.stderr)
            break
        if progress:
            done = time.perf_counter() - started
            eta = done / n * (len(shapes) - n) if n else float("nan")
            print(f"[{n + 1}/{len(shapes)}] batch {batch}, context {context} "
                  f"(elapsed {done:.0f} s, ETA {eta:.0f} s)", file=sys.stderr, flush=True)
        rows += _measure_shape(torch, Engine, model, grid, batch, context)
        torch.cuda.empty_cache()
    prov = collect_provenance(spec, kernel_config_hash())
    prov["grid"] = {"batches": grid.batches, "contexts": grid.contexts, "qs": grid.qs,
                    "sparsities": grid.sparsities, "policies": grid.policies,
                    "repeats": grid.repeats, "shapes_skipped_for_memory": skipped}
    return Calibration(prov, ceilings, rows)


def _measure_shape(torch, Engine, model, grid: CalibrationGrid, batch: int, context: int
                   ) -> list[Measurement]:
    prompts = [[0] * context] * batch
    q_max = max(grid.qs)
    out: list[Measurement] = []

    def record(op, seconds, q=1, s=None):
        out.append(Measurement(op, batch, context, q, s, [t * 1e3 for t in seconds]))

    with torch.inference_mode():
        plain = Engine(model, batch=batch, max_len=context + q_max + 8, policy="full",
                       k_max=1, beyond_max_position=True)
        plain.prefill(prompts, "random")
        record("plain", _time(torch, lambda: plain.verify(1, collect=False), grid.repeats,
                              grid.warmup, lambda: plain.cache.rollback(1)))
        del plain
        for policy in grid.policies:
            for s in grid.sparsities:
                engine = Engine(model, batch=batch, max_len=context + q_max + 8,
                                policy=policy, s=s, k_max=q_max - 1, beyond_max_position=True)
                engine.prefill(prompts, "random")
                rows = engine._prefill_rows
                zeros = torch.zeros(batch, dtype=torch.long, device=engine.device)

                def refresh():
                    engine.selection.refresh(engine.cache.lengths, rows, zeros, slice(0, rows))

                refresh()
                counts = engine.selection.counts
                saved = counts.clone() if counts is not None else None

                def undo_draft():   # the draft appended its position to every list
                    engine.cache.rollback(1)
                    if saved is not None:
                        counts.copy_(saved)

                if policy == grid.policies[0] and s == grid.sparsities[0]:
                    for q in grid.qs:
                        record("verify", _time(torch, lambda: engine.verify(q), grid.repeats,
                                               grid.warmup, lambda: engine.cache.rollback(q)),
                               q=q)
                    refresh()
                record(f"draft:{policy}", _time(torch, engine.draft, grid.repeats, grid.warmup,
                                                undo_draft), s=s)
                if policy != "streamingllm":
                    record(f"selection:{policy}", _time(torch, refresh, max(5, grid.repeats // 2),
                                                        1), s=s)
                del engine
    return out
