"""Combine two calibration runs of the same model and GPU.

Fill the shapes a (time-budgeted) run did not reach with an older run's step timings
(`specsim.costs.calibrated.merge_calibrations`):

    python scripts/merge_calibrations.py NEW.json OLD.json OUT.json --note "why"

The newer run's rows all stay; the older run adds plain/verify/draft/selection rows at the
(batch, context) shapes the newer one lacks; loop overheads come from the newer run only.
Recorded under ``provenance.merged``.

Or put some op families of a partial run into a full one
(`specsim.costs.calibrated.replace_ops`), e.g. loop overheads re-measured alone
(`calibrate_shipped.py --only overhead`) after a change to the loop's host code:

    python scripts/merge_calibrations.py NEW.json OLD.json OUT.json --replace overhead --note "why"

OLD's rows of those families are dropped and NEW's taken; recorded under
``provenance.replaced``. With ``--keep-other-shapes`` OLD's rows of an op stay at the shapes
NEW did not measure it at (a budget-cut re-measurement of unchanged kernels, e.g. the verify
rows re-timed to add shapes: ``--replace verify --keep-other-shapes``).
"""
from __future__ import annotations

import argparse

from specsim.costs.calibrated import merge_calibrations, read_calibration, replace_ops


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("new")
    parser.add_argument("old")
    parser.add_argument("out")
    parser.add_argument("--note", required=True, help="why the rows may be combined")
    parser.add_argument("--exclude-ops", default="",
                        help="comma-separated ops whose OLD rows are not taken (their code "
                             "changed between the runs), e.g. selection:last-token")
    parser.add_argument("--replace", default=None,
                        help="comma-separated op families (plain, verify, draft, selection, "
                             "overhead) or exact ops (draft:quest): OLD with NEW's rows of "
                             "these instead of its own")
    parser.add_argument("--keep-other-shapes", action="store_true",
                        help="with --replace: keep OLD's rows of an op at the (batch, context) "
                             "shapes NEW did not measure it at")
    args = parser.parse_args()
    if args.keep_other_shapes and not args.replace:
        parser.error("--keep-other-shapes goes with --replace")
    new, old = read_calibration(args.new), read_calibration(args.old)
    if args.replace:
        merged = replace_ops(old, new, args.replace.split(","), args.note,
                             keep_other_shapes=args.keep_other_shapes)
        merged.write(args.out)
        info = merged.provenance["replaced"][-1]
        print(f"{args.out}: {args.old} with {info['rows']} {'/'.join(info['families'])} rows "
              f"of {args.new} in place of its {info['replaced_rows']}")
        return
    merged = merge_calibrations(new, old, args.note,
                                tuple(op for op in args.exclude_ops.split(",") if op))
    merged.write(args.out)
    info = merged.provenance["merged"][-1]
    print(f"{args.out}: {info['rows']} rows at {len(info['shapes'])} shapes added from "
          f"{args.old} ({info['date']})"
          + "".join(f"; {op} not taken: {why}" for op, why in info["ops_skipped"].items()))


if __name__ == "__main__":
    main()
