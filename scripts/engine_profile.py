"""Where does a decode step's time go? torch.profiler over a few plain steps and speculative
iterations of the engine at real scale (random weights), kernel table sorted by GPU time.

    python scripts/engine_profile.py --model qwen3-8b --batch 4 --context 32768 --out prof.txt \\
        [--policies vegas,quest,sparsespec] [--s 0.05] [--k 4] [--setting cuda_graphs=false] \\
        [--plain-only]

The engine runs with the default settings (``specsim.settings``: CUDA graphs, fused
projections, compiled layers) changed by ``--setting name=value``.
"""
from __future__ import annotations

import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile

from specsim.engine import Engine, build_model
from specsim.settings import EngineSettings
from specsim.shipped import catalog_file


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--out", default="engine-profile.txt")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="engine setting (repeatable; specsim run --help lists them)")
    parser.add_argument("--policies", default="vegas",
                        help="policies whose speculative iterations are profiled after the "
                             "plain steps (comma-separated)")
    parser.add_argument("--s", type=float, default=0.05, help="the policies' sparsity")
    parser.add_argument("--k", type=int, default=4, help="the policies' draft length")
    parser.add_argument("--plain-only", action="store_true",
                        help="profile the plain steps alone")
    args = parser.parse_args()
    settings = EngineSettings.parse(args.setting)
    config = json.loads(catalog_file(f"{args.model}/config.json").read_text())
    model = build_model(config, weights="random", dtype=torch.bfloat16, device="cuda")
    prompts = [[0] * args.context] * args.batch
    report = []
    runs = [("plain", dict(policy="full", k_max=1))]
    if not args.plain_only:
        runs += [(f"{policy} s={args.s} k={args.k}", dict(policy=policy, s=args.s, k_max=args.k))
                 for policy in args.policies.split(",")]
    for label, kw in runs:
        engine = Engine(model, batch=args.batch, max_len=args.context + 200,
                        settings=settings, beyond_max_position=True, **kw)
        speculative = label != "plain"
        engine.generate(prompts, 8, speculative=speculative, prefill="random")   # warm-up
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            gen = engine.generate(prompts, 32, speculative=speculative, prefill="random")
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
        # busy GPU time per iteration against the wall time: a gap means launch/host time,
        # none means the kernels themselves are what sits above the roofline floor
        kernel_us = sum(e.time_range.elapsed_us() for e in prof.events()
                        if e.device_type == torch.autograd.DeviceType.CUDA)
        head = (f"== {label}: {gen.iterations} iterations, {gen.tokens_per_second:.0f} tokens/s, "
                f"{1e3 * gen.decode_seconds / gen.iterations:.3f} ms per iteration wall, "
                f"kernels {kernel_us / 1e3 / gen.iterations:.3f} ms per iteration; "
                f"timing {gen.timing}")
        print(head)
        print(table[:6000])
        report += [head, table]
        del engine
    with open(args.out, "w") as fh:
        fh.write("\n".join(report))


if __name__ == "__main__":
    main()
