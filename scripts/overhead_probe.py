"""The speculative loop's overhead two ways on the same runs (a GPU probe for issue #5/#8):

- ``wall``: the call's wall time minus its priced phases, over its iterations (the method of
  the calibrations shipped until 2026-11-29: includes the call's fixed costs);
- ``loop``: the loop's own per-iteration clock minus the priced phases (``_loop_overhead``
  now), which is what a validation run's steady window measures.

    PYTHONPATH=. python3 scripts/overhead_probe.py [MODEL] [BATCH] [CONTEXT] [OUT.json]

On the H200 a free-running SmolLM2 run at batch 32 (prompts 2K–6.5K) spent ~1.0 ms per
iteration outside its priced steps at k = 2 and ~1.4 ms at k = 8.
"""
from __future__ import annotations

import gc
import json
import os
import sys

import numpy as np
import torch

import specsim.calibrate as C
from specsim.engine import Engine
from specsim.engine.model import timing_model
from specsim.traces.format import RequestTrace


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    context = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
    out_path = sys.argv[4] if len(sys.argv) > 4 else None
    cuda = torch.cuda.is_available()
    model = timing_model(name)
    n = C.OVERHEAD_STEPS
    prompts = [[0] * context] * batch
    rows = []
    policies = os.environ.get("PROBE_POLICIES", "vegas,streamingllm,quest").split(",")
    ks = [int(k) for k in os.environ.get("PROBE_KS", "2,4,8,15").split(",")]
    if os.environ.get("PROBE_GC_OFF"):      # is the spread Python's garbage collector?
        gc.collect()
        gc.disable()
    for policy in policies:
        engine = Engine(model, batch=batch, max_len=context + 16 * (n + 2) + 8, policy=policy,
                        s=0.03, k_max=15, beyond_max_position=True)
        engine.prefill(prompts, "random")
        for k in ks:
            forced = [RequestTrace(str(b), policy, 0.03, context + np.arange(n) * (k // 2 + 1),
                                   np.full(n, k), np.full(n, k // 2)) for b in range(batch)]
            wall, loop = [], []
            for i in range(4):
                with torch.inference_mode():
                    gen = engine.generate(prompts, n + 1, speculative=True, k=k, forced=forced,
                                          prefill="random")
                t = gen.timing
                priced = sum(t.get(p, 0.0) for p in ("draft", "verify", "selection"))
                if i:
                    wall.append((gen.wall_seconds - t.get("prefill", 0.0) - priced)
                                / gen.iterations)
                    loop.append((sum(s[0] for s in gen.steps) - priced) / len(gen.steps))
            row = {"policy": policy, "k": k, "wall_ms": 1e3 * float(np.median(wall)),
                   "loop_ms": 1e3 * float(np.median(loop)),
                   "other_ms": 1e3 * t.get("other", 0.0) / gen.iterations}
            rows.append(row)
            print(f"{policy:12s} k={k:2d}  wall {row['wall_ms']:6.3f} ms  loop "
                  f"{row['loop_ms']:6.3f} ms  (other phase {row['other_ms']:.3f} ms)",
                  flush=True)
        del engine
        if cuda:
            torch.cuda.empty_cache()
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"model": name, "batch": batch, "context": context, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
