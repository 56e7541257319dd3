"""Probe: one draft step's time three ways in one process (GPU), for Quest and Vegas — the
calibration's (a chain of 4 in one graph, each call timed alone), chains back to back (one
event pair around 10 chains), and a forced decoding loop's own draft phase. Written to find
why a Quest draft step took ~12% less in validation runs than in the calibration.

    PYTHONPATH=. python3 scripts/draft_timing_probe.py [BATCH CONTEXT S]
"""
import sys

import numpy as np
import torch

from specsim.calibrate import _time
from specsim.engine import Engine, build_model
from specsim.specs import catalog_dir, load_model
from specsim.traces.format import RequestTrace
import json


def main():
    batch, context, s = (int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])) \
        if len(sys.argv) > 3 else (4, 32768, 0.1)
    spec = load_model("qwen3-8b")
    config = json.loads((catalog_dir() / spec.name / "config.json").read_text())
    model = build_model(config, weights="random", dtype=torch.bfloat16, device="cuda")
    model.fuse_projections()
    model.compile_layers()
    prompts = [[0] * context] * batch
    for policy in ("vegas", "quest"):
        for k_max in (15, 4):
            with torch.inference_mode():
                engine = Engine(model, batch=batch, max_len=context + 424, policy=policy, s=s,
                                k_max=k_max, beyond_max_position=True)
                engine.prefill(prompts, "random")
                rows = engine._prefill_rows
                zeros = torch.zeros(batch, dtype=torch.long, device="cuda")
                engine.refresh(rows, zeros, slice(0, rows))
                counts = engine.selection.counts
                saved = counts.clone() if counts is not None else None

                def undo():
                    if saved is not None:
                        counts.copy_(saved)
                alone = np.median(_time(torch, lambda: engine.draft_chain(4), 10, 3, undo)) / 4
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for _ in range(10):
                    engine.draft_chain(4)
                    undo()
                end.record()
                end.synchronize()
                back = start.elapsed_time(end) / 1e3 / 40
                n = 24
                forced = [RequestTrace(str(b), policy, s, context + np.arange(n) * 3,
                                       np.full(n, 4), np.full(n, 2)) for b in range(batch)]
                engine.generate(prompts, 1, k=4, forced=forced, prefill="random")
                gen = engine.generate(prompts, 1, k=4, forced=forced, prefill="random")
                loop = gen.timing["draft"] / (gen.iterations * 4)
                print(f"{policy:>6} k_max {k_max:>2}: alone {alone * 1e3:6.2f} ms  back-to-back "
                      f"{back * 1e3:6.2f} ms  in the loop {loop * 1e3:6.2f} ms per draft step",
                      flush=True)
                del engine
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
