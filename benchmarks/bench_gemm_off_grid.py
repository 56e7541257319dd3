"""The operator table's GEMMs at widths it did not measure: every catalogue model's own GEMM
shapes (fused QKV, output projection, gate-up, down, MoE router, LM head) that are off the
table's (n, k) grid, timed on the GPU exactly as the sweep times a GEMM
(``specsim.operator_sweep``'s ``gemm`` measure, the default grid's method), then priced from the
table (``OperatorCostModel.gemm``) and compared (VALIDATION.md, "GEMM widths off the grid").

On the GPU (writes the measured points, with the sweep's provenance):

    PYTHONPATH=. python3 benchmarks/bench_gemm_off_grid.py --measure $OUT/gemm-off-grid.json

Anywhere (prints the error of the table's pricing, per shape and pooled):

    python benchmarks/bench_gemm_off_grid.py --report benchmarks/gemm-off-grid-h200.json \\
        [--table models/operators/h200.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

MS = (1, 4, 16, 64, 256, 1024)
FORMAT_KEY = "specsim_gemm_off_grid"


def catalogue_shapes(table) -> dict[tuple[int, int], list[str]]:
    """{(n, k): [catalogue models with a GEMM of that shape]} for the shapes the table's grid
    does not hold, as the cost model composes each model's step."""
    from specsim.costs.operators import OperatorCostModel
    from specsim.specs import known_models, load_hardware, load_model

    class Recording(OperatorCostModel):
        def _gemm(self, m, n, k):
            self.seen.add((n, k))
            return super()._gemm(m, n, k)

    on_grid = {(p.key["n"], p.key["k"]) for p in table.points if p.op == "gemm"}
    shapes: dict[tuple[int, int], list[str]] = {}
    for name in known_models():
        priced = Recording(table, load_model(name), load_hardware("h200"))
        priced.seen = set()
        priced.forward_parts([4096] * 3, 1)
        for shape in sorted(priced.seen - on_grid):
            shapes.setdefault(shape, []).append(name)
    return shapes


def measure(out: str, table_path: str) -> None:
    import torch

    from specsim.costs.operator_file import read_operator_table
    from specsim.operator_sweep import MEASURES, OperatorGrid, _Timer, provenance
    from specsim.settings import DEFAULT

    grid, device = OperatorGrid(), torch.device("cuda")
    timer = _Timer(torch, device, DEFAULT)
    shapes = catalogue_shapes(read_operator_table(table_path))
    points, started = [], time.perf_counter()
    for (n, k), users in sorted(shapes.items()):
        with torch.inference_mode():
            for at, ms in MEASURES["gemm"](torch, device, timer, grid, DEFAULT,
                                           {"n": n, "k": k}, [{"m": m} for m in MS]):
                points.append({"n": n, "k": k, "m": at["m"], "samples_ms": ms,
                               "models": users})
        torch.cuda.empty_cache()
    doc = {FORMAT_KEY: 1, "provenance": provenance(grid, DEFAULT, device),
           "seconds": round(time.perf_counter() - started, 1), "points": points}
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {out}: {len(points)} points over {len(shapes)} shapes")


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
    errors, rows = [], []
    for p in doc["points"]:
        measured = statistics.median(p["samples_ms"]) / 1e3
        error = priced.gemm(p["m"], p["n"], p["k"])[0] / measured - 1
        errors.append(error)
        rows.append((",".join(p["models"]), p["n"], p["k"], p["m"], measured * 1e6, error))
    prov = doc.get("provenance", {})
    print(f"GEMMs off the grid of {table_path}, measured {prov.get('date')} on "
          f"{prov.get('gpu')} ({measured_path}):")
    print(f"{'models':28s} {'n':>7s} {'k':>6s} {'m':>5s} {'measured us':>11s} {'error':>7s}")
    for models, n, k, m, us, error in rows:
        print(f"{models[:28]:28s} {n:7d} {k:6d} {m:5d} {us:11.1f} {error * 100:+6.1f}%")
    a = np.abs(errors)
    print(f"{len(errors)} points over {len({(r[1], r[2]) for r in rows})} shapes: MAPE "
          f"{a.mean() * 100:.1f}%, median {np.median(a) * 100:.1f}%, 90th percentile "
          f"{np.percentile(a, 90) * 100:.1f}%, worst {a.max() * 100:.1f}%, bias "
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
