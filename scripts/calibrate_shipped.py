"""Measure the calibrations shipped in models/calibrations/<hardware>/ (run on that GPU).

Equivalent to `specsim calibrate --gpu` per model with each model's shipped grid, without
needing the CLI installed:

    PYTHONPATH=. python scripts/calibrate_shipped.py --hardware h200 --out-dir models/calibrations/h200 \\
        --models qwen3-8b,smollm2-135m --budget-s 230,150 [--setting name=value]

Put a partial run (``--only``) into a shipped file with ``specsim calibrate --merge NEW OLD
--replace FAMILIES --out FILE --note WHY``.
"""
from __future__ import annotations

import argparse
import os
import time

from specsim.calibrate import CalibrationGrid, measure
from specsim.settings import EngineSettings
from specsim.specs import load_model

GRIDS = {
    # dense where costs bend (small batches), out to long contexts where they fit
    "large": dict(batches=[1, 4, 16], contexts=[4096, 16384, 32768, 65536, 131072],
                  qs=[1, 2, 3, 4, 6, 8, 12, 16]),
    "small": dict(batches=[1, 8, 32, 64], contexts=[1024, 2048, 4096, 8192],
                  qs=[1, 2, 3, 4, 6, 8, 12, 16]),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", default="h200")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--models", default="qwen3-8b,smollm2-135m")
    parser.add_argument("--policies", default="vegas,sparsespec,streamingllm,quest,last-token")
    parser.add_argument("--sparsities", default="0.03,0.1",
                        help="draft costs between them are interpolated by selected bytes")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--only", default=None,
                        help="comma-separated op families to measure (plain, verify, draft, "
                             "selection, overhead, prefill), e.g. 'overhead,prefill' after a "
                             "change to the loop's host code; put them into a file with "
                             "specsim calibrate --merge NEW OLD --replace FAMILIES")
    parser.add_argument("--budget-s", default="200",
                        help="seconds per model: one for all, or one per model (comma-separated)")
    parser.add_argument("--contexts", default=None,
                        help="comma-separated contexts instead of the model's grid (e.g. "
                             "denser ones for the refreshes, whose torch.topk time jumps between "
                             "the factor-2 points: --only selection --contexts "
                             "1024,1536,2048,3072,4096,6144,8192)")
    parser.add_argument("--batches", default=None,
                        help="comma-separated batch sizes instead of the model's grid")
    parser.add_argument("--qs", default=None,
                        help="comma-separated verify query counts instead of the model's grid "
                             "(e.g. 16 alone when only the policies' own verify passes, "
                             "timed at fixed q up to the largest, are re-measured)")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="engine setting (repeatable; specsim calibrate --help lists them)")
    args = parser.parse_args()
    settings = EngineSettings.parse(args.setting)
    os.makedirs(args.out_dir, exist_ok=True)
    names = args.models.split(",")
    budgets = [float(b) for b in args.budget_s.split(",")]
    if len(budgets) not in (1, len(names)):
        parser.error("--budget-s: one value, or one per model")
    budgets = budgets * len(names) if len(budgets) == 1 else budgets
    for name, budget in zip(names, budgets):
        spec = load_model(name)
        size = "small" if spec.param_count() < 1e9 else "large"
        shape = dict(GRIDS[size])
        if args.contexts:
            shape["contexts"] = [int(c) for c in args.contexts.split(",")]
        if args.batches:
            shape["batches"] = [int(b) for b in args.batches.split(",")]
        if args.qs:
            shape["qs"] = [int(q) for q in args.qs.split(",")]
        grid = CalibrationGrid(**shape, sparsities=[float(s) for s in
                                                          args.sparsities.split(",")],
                               policies=args.policies.split(","), repeats=args.repeats,
                               time_budget_s=budget,
                               only=args.only.split(",") if args.only else None)
        t0 = time.perf_counter()
        path = os.path.join(args.out_dir, f"{name}.json")
        # written after every shape: a call cut short keeps what it measured, and the same
        # command resumes it
        cal = measure(spec, grid, settings=settings, checkpoint=path)
        print(f"{name}: {len(cal.measurements)} measurements in {time.perf_counter() - t0:.0f} s"
              f" -> {path}; ceilings {cal.ceilings}")


if __name__ == "__main__":
    main()
