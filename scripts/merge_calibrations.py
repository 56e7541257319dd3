"""Fill the shapes a (time-budgeted) calibration run did not reach with an older run's step
timings of the same model and GPU: `specsim.costs.calibrated.merge_calibrations`.

    python scripts/merge_calibrations.py NEW.json OLD.json OUT.json --note "why"

The newer run's rows all stay; the older run adds plain/verify/draft/selection rows at the
(batch, context) shapes the newer one lacks; loop overheads come from the newer run only. The
merge is recorded under ``provenance.merged``.
"""
from __future__ import annotations

import argparse

from specsim.costs.calibrated import merge_calibrations, read_calibration


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("new")
    parser.add_argument("old")
    parser.add_argument("out")
    parser.add_argument("--note", required=True, help="why the older rows may be used")
    args = parser.parse_args()
    merged = merge_calibrations(read_calibration(args.new), read_calibration(args.old),
                                args.note)
    merged.write(args.out)
    info = merged.provenance["merged"][-1]
    print(f"{args.out}: {info['rows']} rows at {len(info['shapes'])} shapes added from "
          f"{args.old} ({info['date']})")


if __name__ == "__main__":
    main()
