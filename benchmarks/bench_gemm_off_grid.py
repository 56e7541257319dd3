"""The operator table's GEMMs at widths it did not measure: every catalogue model's own GEMM
shapes (fused QKV, output projection, gate-up, down, MoE router, LM head) that are off the
table's (n, k) grid, and its MoE models' grouped expert GEMMs (at 1–256 pairs per expert over
8–128 experts), timed on the GPU exactly as the sweep times them (``specsim.operator_sweep``'s
``gemm`` and ``grouped_gemm`` measures, the default grid's method), then priced from the table
(``OperatorCostModel.gemm`` / ``grouped_gemm``) and compared (VALIDATION.md, "GEMM widths off
the grid").

On the GPU (writes the measured points, with the sweep's provenance):

    PYTHONPATH=. python3 benchmarks/bench_gemm_off_grid.py --measure $OUT/gemm-off-grid.json

Anywhere (prints the error of the table's pricing, per shape and pooled):

    python benchmarks/bench_gemm_off_grid.py --report tests/fixtures/gemm-off-grid-h200.json \\
        [--table models/operators/h200.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

MS = (1, 4, 16, 64, 256, 1024)
#: (pairs per expert, experts) of the grouped GEMMs timed
GROUPED_AT = tuple((r, g) for g in (8, 32, 128) for r in (1, 4, 16, 256))
FORMAT_KEY = "specsim_gemm_off_grid"


def catalogue_shapes(table, op: str = "gemm") -> dict[tuple[int, int], list[str]]:
    """{(n, k): [catalogue models with a GEMM of that shape]} for the shapes of ``op`` (gemm
    or grouped_gemm) the table's grid does not hold, as the cost model composes each model's
    step."""
    from specsim.costs.operators import OperatorCostModel
    from specsim.specs import known_models, load_hardware, load_model

    class Recording(OperatorCostModel):
        def _gemm(self, m, n, k):
            self.seen["gemm"].add((n, k))
            return super()._gemm(m, n, k)

        def grouped_gemm(self, rows, touched, n, k):
            self.seen["grouped_gemm"].add((n, k))
            return super().grouped_gemm(rows, touched, n, k)

    on_grid = {(p.key["n"], p.key["k"]) for p in table.points if p.op == op}
    shapes: dict[tuple[int, int], list[str]] = {}
    for name in known_models():
        priced = Recording(table, load_model(name), load_hardware("h200"))
        priced.seen = {"gemm": set(), "grouped_gemm": set()}
        priced.forward_parts([4096] * 3, 1)
        for shape in sorted(priced.seen[op] - on_grid):
            shapes.setdefault(shape, []).append(name)
    return shapes


def measure(out: str, table_path: str) -> None:
    import torch

    from specsim.costs.operator_file import read_operator_table
    from specsim.operator_sweep import MEASURES, OperatorGrid, _Timer, provenance
    from specsim.settings import DEFAULT

    grid, device = OperatorGrid(), torch.device("cuda")
    timer = _Timer(torch, device, DEFAULT)
    table = read_operator_table(table_path)
    points, started = [], time.perf_counter()
    for op, ats in (("gemm", [{"m": m} for m in MS]),
                    ("grouped_gemm", [{"rows": r * g, "groups": g} for r, g in GROUPED_AT])):
        shapes = catalogue_shapes(table, op)
        for (n, k), users in sorted(shapes.items()):
            with torch.inference_mode():
                for at, ms in MEASURES[op](torch, device, timer, grid, DEFAULT,
                                           {"n": n, "k": k}, ats):
                    points.append(dict(at, op=op, n=n, k=k, samples_ms=ms, models=users))
            torch.cuda.empty_cache()
    doc = {FORMAT_KEY: 1, "provenance": provenance(grid, DEFAULT, device),
           "seconds": round(time.perf_counter() - started, 1), "points": points}
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {out}: {len(points)} points")


def report(measured_path: str, table_path: str) -> None:
    from specsim.costs.operator_file import read_operator_table
    from specsim.costs.operators import OperatorCostModel
    from specsim.specs import load_hardware, load_model

    with open(measured_path) as fh:
        doc = json.load(fh)
    if doc.get(FORMAT_KEY) != 1:
        raise SystemExit(f"{measured_path}: not a {FORMAT_KEY} file")
    table = read_operator_table(table_path)
    priced = OperatorCostModel(table, load_model("qwen3-8b"), load_hardware("h200"))
    prov = doc.get("provenance", {})
    print(f"GEMMs off the grid of {table_path}, measured {prov.get('date')} on "
          f"{prov.get('gpu')} ({measured_path}):")
    for op in ("gemm", "grouped_gemm"):
        errors, rows = [], []
        for p in doc["points"]:
            if p.get("op", "gemm") != op:
                continue
            measured = statistics.median(p["samples_ms"]) / 1e3
            if op == "gemm":
                at = f"m={p['m']}"
                price = priced.gemm(p["m"], p["n"], p["k"])[0]
            else:
                at = f"{p['rows'] // p['groups']}/expert x {p['groups']}"
                price = priced.grouped_gemm(p["rows"], p["groups"], p["n"], p["k"])[0]
            errors.append(price / measured - 1)
            rows.append((",".join(p["models"]), p["n"], p["k"], at, measured * 1e6, errors[-1]))
        if not rows:
            continue
        print(f"{op}:")
        print(f"{'models':28s} {'n':>7s} {'k':>6s} {'at':>16s} {'measured us':>11s} "
              f"{'error':>7s}")
        for models, n, k, at, us, error in rows:
            print(f"{models[:28]:28s} {n:7d} {k:6d} {at:>16s} {us:11.1f} {error * 100:+6.1f}%")
        a = np.abs(errors)
        print(f"{op}: {len(errors)} points over {len({(r[1], r[2]) for r in rows})} shapes: "
              f"MAPE {a.mean() * 100:.1f}%, median {np.median(a) * 100:.1f}%, 90th "
              f"percentile {np.percentile(a, 90) * 100:.1f}%, worst {a.max() * 100:.1f}%, bias "
              f"{np.mean(errors) * 100:+.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", metavar="OUT", help="time the shapes on this GPU into OUT")
    ap.add_argument("--report", metavar="FILE", help="price a measured file from --table")
    ap.add_argument("--table", default="models/operators/h200.json",
                    help="the operator table (default: %(default)s)")
    args = ap.parse_args()
    if bool(args.measure) == bool(args.report):
        ap.error("give one of --measure OUT or --report FILE")
    if args.measure:
        measure(args.measure, args.table)
    else:
        report(args.report, args.table)


if __name__ == "__main__":
    main()
