"""Simulator speed: the vectorised fast path (iterations/s, one core) and the SimPy path
(10,000 requests × 2,000 output tokens at batch 64), on this machine.

    python benchmarks/bench_simulator.py [--requests 10000] [--output-tokens 2000]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from specsim import analytical
from specsim.costs import RooflineCostModel
from specsim.simulator import SimConfig, Simulation, all_at_once
from specsim.simulator.acceptance_source import make_source
from specsim.simulator.fastpath import cost_grid, replay_single_sequence
from specsim.shipped import shipped_path
from specsim.specs import load_hardware, load_model
from specsim.traces import read_trace


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--output-tokens", type=int, default=2_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=2_000_000)
    args = parser.parse_args()
    model, hw = load_model("qwen3-8b"), load_hardware("h200")
    costs = RooflineCostModel(model, hw)

    survival = analytical.survival_from_conditional(np.full(12, 0.85))
    grid = cost_grid(costs, 32_768, 32_768 + 6 * args.iterations, 6, 0.05, "vegas")
    t0 = time.perf_counter()
    fast = replay_single_sequence(survival, 6, args.iterations, 32_768, costs, 0.05, "vegas",
                                  grid=grid)
    fast_s = time.perf_counter() - t0

    trace = read_trace(shipped_path("traces/synthetic-sparse-selfspec.jsonl"))
    group = trace.groups()[("vegas", 0.07)]
    prompts = np.resize([int(r.context[0]) for r in group.requests], args.requests)
    arrivals = all_at_once(args.requests, prompts, args.output_tokens)
    cfg = SimConfig("vegas", 0.07, k=4, max_batch=args.batch)
    t0 = time.perf_counter()
    result = Simulation(arrivals, costs, model, make_source("replay", group, 4), cfg,
                        hw.memory_bytes).run()
    simpy_s = time.perf_counter() - t0
    s = result.summary

    print(f"machine: {os.cpu_count()} cores")
    print(f"{'path':<10} {'work':<46} {'wall s':>8} {'rate':>22}")
    print(f"{'fast':<10} {f'{args.iterations:,} iterations, one sequence, k=6':<46} "
          f"{fast_s:>8.2f} {f'{args.iterations / fast_s / 1e6:.2f} M iterations/s':>22}")
    work = f"{args.requests:,} requests × {args.output_tokens:,} tokens, batch {args.batch}"
    rate = f"{s['iterations'] / simpy_s:,.0f} steps/s"
    print(f"{'simpy':<10} {work:<46} {simpy_s:>8.2f} {rate:>22}")
    print(f"simpy run: {s['iterations']:,} batch iterations, {s['sequence_iterations']:,} "
          f"sequence-iterations, {s['throughput_tokens_per_s']:.0f} simulated tokens/s; "
          f"fast path speedup {fast['speedup']:.3f}×")


if __name__ == "__main__":
    main()
