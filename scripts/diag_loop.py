"""Why is a plain decoding loop's wall time per step ~2x the CUDA-event time of one graphed
step? Times the same step several ways (wall with sync, events, back-to-back replays, the
generate loop, torch.profiler kernel time)."""
import sys
import time

import torch

from specsim.engine import Engine, build_model
import json
from specsim.specs import catalog_dir

name, batch, context = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
config = json.loads((catalog_dir() / name / "config.json").read_text())
model = build_model(config, weights="random", dtype=torch.bfloat16, device="cuda")
model.fuse_projections()
model.compile_layers()
prompts = [[0] * context] * batch
e = Engine(model, batch=batch, max_len=context + 600, policy="full", k_max=1,
           beyond_max_position=True)
with torch.inference_mode():
    e.prefill(prompts, "random")
    step = lambda: e.verify(1, collect=False)
    for _ in range(3):
        step(); e.cache.rollback(1)
    torch.cuda.synchronize()
    n = 20
    t = time.perf_counter()
    for _ in range(n):
        step(); e.cache.rollback(1); torch.cuda.synchronize()
    print(f"wall+sync per step {(time.perf_counter() - t) / n * 1e3:.3f} ms")
    t = time.perf_counter()
    for _ in range(n):
        step(); e.cache.rollback(1)
    torch.cuda.synchronize()
    print(f"back-to-back per step {(time.perf_counter() - t) / n * 1e3:.3f} ms")
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        step(); e.cache.rollback(1)
    b.record(); b.synchronize()
    print(f"events over {n} per step {a.elapsed_time(b) / n:.3f} ms")
    for _ in range(2):
        g = e.generate(prompts, n + 1, speculative=False, prefill="random")
        print(f"generate: wall {g.wall_seconds * 1e3:.1f} ms, timing "
              + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in g.timing.items())
              + f" ms, {g.iterations} steps -> {(g.wall_seconds - g.timing['prefill']) / g.iterations * 1e3:.3f} ms/step")
    t = time.perf_counter()
    e.prefill(prompts, "random"); torch.cuda.synchronize()
    print(f"random prefill wall {(time.perf_counter() - t) * 1e3:.1f} ms")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        e.generate(prompts, 9, speculative=False, prefill="random")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14))
