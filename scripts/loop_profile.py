"""Where a speculative iteration's time goes beyond its draft/verify/selection steps (the cost
model's loop overhead term): the engine's loop under torch.profiler on the GPU (on the CPU
a smoke run of a tiny model).

    PYTHONPATH=. python3 scripts/loop_profile.py [MODEL] [BATCH] [CONTEXT] [K] [POLICY] [OUT_DIR] \\
        [--phases-only] [--setting name=value]

(``--phases-only``: only the phase split, no profiler run.)

Random weights, forced acceptance (m = k // 2), the engine's settings (by default the model
fused and compiled, as the runs use it). Prints the per-iteration phase split (CUDA events),
the loop's own clock, the CUDA kernels by total time, and the host-side ops by self CPU time;
writes a Chrome trace to OUT_DIR when given (open it in chrome://tracing or Perfetto to see the
idle gaps between launches). On the CPU it runs a tiny model of the same family (a smoke test
of the script).
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import torch

from specsim.engine import Engine
from specsim.engine.model import timing_model
from specsim.settings import EngineSettings
from specsim.traces.format import RequestTrace


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("batch", nargs="?", type=int, default=32)
    parser.add_argument("context", nargs="?", type=int, default=4096)
    parser.add_argument("k", nargs="?", type=int, default=4)
    parser.add_argument("policy", nargs="?", default="vegas")
    parser.add_argument("out_dir", nargs="?", default=None,
                        help="where the Chrome trace goes (gzipped)")
    parser.add_argument("--phases-only", action="store_true",
                        help="only the phase split, no profiler run")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="engine setting (repeatable; specsim run --help lists them)")
    args = parser.parse_args(argv)
    name, batch, context, k, policy = args.model, args.batch, args.context, args.k, args.policy
    out_dir = args.out_dir
    cuda = torch.cuda.is_available()
    model = timing_model(name)
    n = 24
    prompts = [[0] * context] * batch
    engine = Engine(model, batch=batch, max_len=context + (k + 1) * (n + 2) + 8, policy=policy,
                    s=0.05, k_max=max(k, 1), beyond_max_position=True,
                    settings=EngineSettings.parse(args.setting))
    forced = [RequestTrace(str(b), policy, 0.05, context + np.arange(n) * (k // 2 + 1),
                           np.full(n, k), np.full(n, k // 2)) for b in range(batch)]

    def run():
        with torch.inference_mode():
            return engine.generate(prompts, n + 1, speculative=True, k=k, forced=forced,
                                   prefill="random")

    run()
    run()                                                    # warm: compiled and captured
    gen = run()
    it = gen.iterations
    loop = sum(s[0] for s in gen.steps) / len(gen.steps)
    split = {p: 1e3 * v / it for p, v in gen.timing.items() if p != "prefill"}
    print(f"{name} batch {batch} context {context} k {k} {policy}: loop clock "
          f"{1e3 * loop:.3f} ms/iteration; phases (ms/iteration) "
          + ", ".join(f"{p} {v:.3f}" for p, v in split.items())
          + f"; unpriced {1e3 * loop - sum(v for p, v in split.items() if p != 'other'):.3f}")
    if args.phases_only:
        return
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        run()
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=25))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    if out_dir:
        import gzip
        import shutil
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"loop-{name}-b{batch}-k{k}-{policy}.json")
        prof.export_chrome_trace(path)
        with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(path)


if __name__ == "__main__":
    main()
