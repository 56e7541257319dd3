"""Compare two calibrations of one model, tile by tile: how each full-attention step moved.

A change to how verify attention is launched (an engine setting, the planner's tiles, block
sizes) changes the plain and verify rows of every shipped calibration. Before such a change
ships, re-measure the files with it and compare them with the shipped ones here: for each verify tile (head_dim, tile rows, collect mode; see
``verify_attention.plan_verify``) and batch, the ratio new / old of the medians of every shape
both files measured. Ratios above 1 are slowdowns; ``--fail-above`` turns any tile whose mean
exceeds it into a non-zero exit.

    python scripts/compare_calibrations.py models/calibrations/h200/qwen3-4b.json NEW.json [--family plain,verify]
"""
from __future__ import annotations

import argparse
import collections
import sys

from specsim.calibrate import shared_verify_policy
from specsim.costs.calibration_file import read_calibration
from specsim.engine.selection import policy_collect_rows
from specsim.kernels._runtime import next_power_of_2
from specsim.kernels.verify_attention import WAVE_CONFIGS
from specsim.specs import load_model



def collected(op: str, q: int) -> tuple[int, ...]:
    """The rows the engine's verify of ``op`` collects (the shared ``verify`` op is Vegas')."""
    policy = op.split(":", 1)[1] if ":" in op else ("plain" if op == "plain" else "vegas")
    return policy_collect_rows(policy, q)


def tile(op: str, q: int, group: int, head_dim: int, c2q: str = "rows",
         shared_policy: str = "vegas") -> tuple[int, int, str]:
    """The verify tile that ran ``op`` at ``q``. With ``c2q`` "sum" Vegas' collecting tiles
    wrote the summed row (mode "sum"): the shared ``verify`` op, when the calibration timed it
    on Vegas (``shared_policy``: ``calibrate.shared_verify_policy`` of its grid)."""
    rows = collected(op, q)
    mode = "off" if not rows else "separate" if len(rows) < q else "main"
    if rows and c2q == "sum" and op == "verify" and shared_policy == "vegas":
        mode = "sum"
    return head_dim, max(16, next_power_of_2(group * q)), mode


def compare(old, new, families=("plain", "verify")) -> dict:
    """{(head_dim, rows, mode, batch): [new / old median per shape both measured]}; the tile
    is the one ``new`` ran (its ``c2q`` setting: a "sum" file's Vegas tiles are "sum")."""
    spec = load_model(old.provenance["model"])
    group = spec.num_heads // spec.num_kv_heads
    c2q = new.settings.c2q
    shared = shared_verify_policy(new.provenance.get("grid", {}).get("policies") or ["vegas"])

    def key(m):
        return m.op, m.batch, m.context, m.q, m.s
    before = {key(m): m for m in old.measurements if m.op.split(":")[0] in families}
    out = collections.defaultdict(list)
    for m in new.measurements:
        if key(m) in before:
            q = m.q or 1
            out[tile(m.op, q, group, spec.head_dim, c2q, shared) + (m.batch,)].append(
                m.median_ms / before[key(m)].median_ms)
    return dict(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--family", default="plain,verify")
    parser.add_argument("--fail-above", type=float, default=None,
                        help="exit 1 if a tile's mean ratio exceeds this (e.g. 1.03)")
    parser.add_argument("--changed-only", action="store_true",
                        help="apply --fail-above to WAVE_CONFIGS' tiles only: the others run "
                             "the same plan in both files, so their ratios measure the drift "
                             "between the two runs (machine, clocks), printed as such")
    args = parser.parse_args(argv)
    old, new = read_calibration(args.old), read_calibration(args.new)
    if old.provenance.get("model") != new.provenance.get("model"):
        parser.error(f"models differ: {old.provenance.get('model')} vs "
                     f"{new.provenance.get('model')}")
    ratios = compare(old, new, tuple(args.family.split(",")))
    if not ratios:
        print("no shape measured in both files")
        return 1
    worst, unchanged = 0.0, []
    print(f"{'hd':>3} {'rows':>4} {'mode':9} {'batch':>5} {'in WAVE_CONFIGS':16} "
          f"{'n':>3} {'mean':>6} {'min':>6} {'max':>6}")
    for (hd, rows, mode, batch), r in sorted(ratios.items()):
        mean = sum(r) / len(r)
        changed = mode == "sum" or (hd, rows, mode) in WAVE_CONFIGS   # sum: another kernel
        if changed or not args.changed_only:
            worst = max(worst, mean)
        if not changed:
            unchanged.append(mean)
        print(f"{hd:3d} {rows:4d} {mode:9} {batch:5d} {'yes' if changed else '':16} "
              f"{len(r):3d} {mean:6.3f} {min(r):6.3f} {max(r):6.3f}")
    if unchanged:
        print(f"tiles outside WAVE_CONFIGS (the drift between the runs): mean ratios "
              f"{min(unchanged):.3f}..{max(unchanged):.3f}")
    if args.fail_above is not None and worst > args.fail_above:
        which = "a WAVE_CONFIGS tile's" if args.changed_only else "a tile's"
        print(f"{which} mean ratio {worst:.3f} exceeds {args.fail_above}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
