"""GPU side without the CLI installed: ``python -m specsim.validate PLAN OUT [REPEATS
[SETUP,…|all [POLICY,…]]]`` and ``python -m specsim.validate merge OUT PART.json …``."""
from __future__ import annotations

import sys

from specsim.validate.files import (FORMAT_KEY, MEASURED_KEY, merge_measured, read_json, select,
                                    write_json)
from specsim.validate.measuring import measure
from specsim.validate.reporting import _cell_label, report


def main(argv=None) -> None:
    """GPU side without the CLI installed:
    ``python -m specsim.validate PLAN OUT [REPEATS [SETUP,…|all [POLICY,…]]]``, and
    ``python -m specsim.validate merge OUT PART.json PART.json …``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["merge"]:
        if len(argv) < 3:
            raise SystemExit("usage: python -m specsim.validate merge OUT PART.json …")
        write_json(argv[1], merge_measured([read_json(p, MEASURED_KEY) for p in argv[2:]]))
        return
    if len(argv) < 2:
        raise SystemExit("usage: python -m specsim.validate PLAN MEASURED_OUT [REPEATS "
                         "[SETUPS|all [POLICIES]]]")
    plan = select(read_json(argv[0], FORMAT_KEY),
                  argv[3] if len(argv) > 3 and argv[3] != "all" else None,
                  argv[4] if len(argv) > 4 else None)
    got = measure(plan, repeats=int(argv[2]) if len(argv) > 2 else 2)
    write_json(argv[1], got)
    rep = report(plan, got)
    for item in rep["setups"]:
        for p, sm in [*item["per_policy"].items(), ("all", item["all"])]:
            e = sm["predict"]
            print(f"{item['name']:>10} {p:>12}: predict MAPE {e['mape'] * 100:5.1f}% worst "
                  f"{e['worst'] * 100:5.1f}% ({_cell_label(e['worst_cell'], p == 'all')}) r "
                  f"{e['pearson_r']:.3f} regret {e['regret']:.3f}")


if __name__ == "__main__":
    main()
