"""`specsim calibrate`: measure cost tables on a GPU (--gpu) or check a calibration (--check)."""
from __future__ import annotations

import json

import click

from specsim.errors import SpecsimError


def _parse_ints(text: str, name: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise click.BadParameter("expected comma-separated integers", param_hint=name) from None
    if not values or values[0] < 1:
        raise click.BadParameter("values must be ≥ 1", param_hint=name)
    return values


def _parse_floats(text: str, name: str) -> list[float]:
    try:
        values = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise click.BadParameter("expected comma-separated numbers", param_hint=name) from None
    if not values or values[0] <= 0 or values[-1] > 1:
        raise click.BadParameter("sparsities must lie in (0, 1]", param_hint=name)
    return values


@click.command("calibrate")
@click.option("--gpu", is_flag=True,
              help="Measure on this machine's GPU: plain steps, verify passes (q = 1..16), "
                   "sparse draft steps, each policy's selection and the decoding loop's own "
                   "overheads, with the engine's kernels, CUDA graphs and random weights of "
                   "the model's real shapes.")
@click.option("--check", "check_path", type=click.Path(dir_okay=False), default=None,
              help="Held-out check of a calibration file: predict every third interior "
                   "context point of each series from the rest; MAPE and worst case per term.")
@click.option("--model", default="qwen3-8b", show_default=True,
              help="Catalogue name or config.json path (shapes only; weights are random).")
@click.option("--hardware", default="h200", show_default=True,
              help="Hardware spec for the roofline fallback outside the grid.")
@click.option("--batch", "batches", default="1,2,4,8,16,32,64", show_default=True,
              help="Batch sizes (dense where costs bend: small batches).")
@click.option("--context", "contexts", default="1024,2048,4096,8192,16384,32768,65536,131072",
              show_default=True, help="Context lengths in tokens (what does not fit is skipped).")
@click.option("--q", "qs", default="1,2,4,8,12,16", show_default=True,
              help="Verify query counts (k + 1).")
@click.option("--sparsity", "sparsities", default="0.03,0.05,0.1", show_default=True,
              help="Draft sparsities s.")
@click.option("--policy", "policies", default="vegas,sparsespec,streamingllm,quest,last-token",
              show_default=True, help="Selection policies to time.")
@click.option("--repeats", type=click.IntRange(min=3), default=20, show_default=True,
              help="Timed repetitions per grid point (after warm-up).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Calibration file to write (with --gpu). It is rewritten after every "
                   "(batch, context) shape, so an interrupted run keeps what it measured; "
                   "the same command again resumes it (measuring only the missing shapes). "
                   "A file made with other settings is refused, not overwritten.")
@click.option("--time-budget", type=click.FloatRange(min=1), default=None,
              help="Seconds after which no new (batch, context) shape is started.")
@click.option("--only", default=None,
              help="Measure only these op families (comma-separated: plain, verify, draft, "
                   "selection, overhead). E.g. 'overhead' re-measures the decoding loop's "
                   "overheads alone after a change to its host code; put them into a full "
                   "file with scripts/merge_calibrations.py --replace overhead.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def calibrate_cmd(gpu, check_path, model, hardware, batches, contexts, qs, sparsities, policies,
                  repeats, out, time_budget, only, as_json):
    """Measured cost tables for the calibrated cost model, and their held-out check.

    \b
    specsim calibrate --gpu --model qwen3-8b --out models/calibrations/h200-qwen3-8b.json
    specsim calibrate --check models/calibrations/h200-qwen3-8b.json
    """
    from specsim.specs import load_hardware, load_model

    if gpu == bool(check_path):
        raise click.UsageError("give exactly one of --gpu (measure) or --check FILE")
    if check_path:
        from specsim.costs.calibrated import held_out_check, read_calibration
        cal = read_calibration(check_path)
        spec = load_model(cal.provenance.get("model") or model)
        report = held_out_check(cal, spec, load_hardware(hardware))
        if as_json:
            click.echo(json.dumps(report, indent=2))
            return
        from specsim.cli.main import _table
        prov = cal.provenance
        click.echo(f"{check_path}: {prov.get('gpu')}, {prov.get('model')}, torch "
                   f"{prov.get('torch')}, triton {prov.get('triton')}, {prov.get('date')}")
        click.echo(f"held out {report['held_out']} interior grid points, fitted on "
                   f"{report['kept']}:")
        rows = [[op, v["points"], f"{v['mape'] * 100:.2f}%", f"{v['worst'] * 100:.2f}%"]
                for op, v in report["per_op"].items()]
        click.echo(_table(["term", "points", "MAPE", "worst"], rows))
        click.echo(f"all: MAPE {report['mape'] * 100:.2f}%, worst {report['worst'] * 100:.2f}%")
        if report["overheads"]:
            click.echo("loop overheads and Quest's empty refresh (residuals near 0: absolute "
                       "errors):")
            rows = [[op, v["points"], f"{v['measured_ms_median'] * 1e3:.0f} µs",
                     f"{v['mean_abs_error_ms'] * 1e3:.0f} µs",
                     f"{v['worst_abs_error_ms'] * 1e3:.0f} µs"]
                    for op, v in report["overheads"].items()]
            click.echo(_table(["term", "points", "measured", "mean |error|", "worst"], rows))
        return
    if not out:
        raise click.UsageError("--gpu needs --out FILE")
    from specsim.calibrate import OP_FAMILIES
    families = [f.strip() for f in only.split(",") if f.strip()] if only else None
    if families is not None and (not families or set(families) - set(OP_FAMILIES)):
        raise click.UsageError(f"--only {only!r}: expected some of {', '.join(OP_FAMILIES)}")
    try:
        import torch
    except ImportError:
        raise SpecsimError("--gpu needs torch with CUDA") from None
    if not torch.cuda.is_available():
        raise SpecsimError("--gpu needs a CUDA GPU; none is visible")
    from specsim.calibrate import CalibrationGrid, measure
    spec = load_model(model)
    grid = CalibrationGrid(batches=_parse_ints(batches, "--batch"),
                           contexts=_parse_ints(contexts, "--context"),
                           qs=_parse_ints(qs, "--q"),
                           sparsities=_parse_floats(sparsities, "--sparsity"),
                           policies=[p.strip() for p in policies.split(",") if p.strip()],
                           repeats=repeats, time_budget_s=time_budget, only=families)
    cal = measure(spec, grid, progress=True, checkpoint=out)
    left = cal.provenance.get("shapes_left", 0)
    click.echo(f"wrote {len(cal.measurements)} measurements to {out}"
               + (f" ({left} shapes not measured: run the same command to resume)"
                  if left else ""))
