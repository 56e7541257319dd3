"""`specsim dashboard`: one self-contained interactive HTML page from a trace.

Exported as :data:`dashboard_cmd` (a click command); ``cli/main.py`` registers it with
``cli.add_command(dashboard_cmd)``. Bad input raises :class:`~specsim.errors.SpecsimError` or
a click error, which ``main()`` turns into one line on stderr.
"""
from __future__ import annotations

import os

import click

from specsim.cli import defaults
from specsim.cli.files import check_outputs, load_trace_arg
from specsim.cli.terminal import echo
from specsim.errors import SpecsimError
from specsim.shipped import resolve, shipped_file

DEFAULT_OUT = "specsim-dashboard.html"
#: Shown in the measured-vs-predicted figure when no --calibration is given: the shipped
#: validation run of the model on the hardware shown first (`specsim validate report --json`
#: of a plan made before its runs; VALIDATION.md).
SHIPPED_VALIDATION = {key: defaults.validation_file(run, "report")
                      for key, run in defaults.VALIDATION_RUNS.items()}


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(float(x)) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got '{text}'",
                                 param_hint=name) from None
    if not values or any(v < 1 for v in values):
        raise click.BadParameter("give at least one value, each ≥ 1", param_hint=name)
    return values


def _hardware_set(default: str, choices: str) -> dict:
    """Catalogued hardware (or the listed names/paths), always including ``default``;
    keyed by catalogue name or file stem."""
    from pathlib import Path

    from specsim.specs import known_hardware, load_hardware

    names = known_hardware() if choices.strip().lower() == "all" else \
        [x.strip() for x in choices.split(",") if x.strip()]
    out = {}
    for name in [default, *names]:
        key = Path(name).stem.lower() if Path(name).is_file() else name.lower()
        if key not in out:
            out[key] = load_hardware(name)
    return out


@click.command("dashboard")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False),
              help=defaults.TRACE_HELP)
@click.option("--format", "fmt", type=click.Choice(defaults.FORMATS), default="auto",
              show_default=True, help="Trace format; 'auto' detects it from the content.")
@click.option("--model", default=None, help=defaults.MODEL_HELP)
@click.option("--hardware", default=defaults.HARDWARE, show_default=True,
              help="Hardware shown first: catalogue name (see `specsim hardware`) or path to "
                   "a hardware JSON.")
@click.option("--compare-hardware", default="all", show_default=True,
              help="Hardware the page's control offers: 'all' catalogued, or a "
                   "comma-separated list (--hardware is always included).")
@click.option("--batch", type=click.IntRange(min=1), default=defaults.BATCH, show_default=True,
              help="Batch size shown first.")
@click.option("--batches", default="1,8,32,64", show_default=True,
              help="Batch sizes the page's control offers (--batch is added).")
@click.option("--context", type=click.IntRange(min=1), default=None,
              help="Context length shown first (tokens per sequence). Default: the trace's "
                   "recorded context lengths.")
@click.option("--contexts", default="4096,16384,65536", show_default=True,
              help="Context lengths the page's control offers besides the trace's recorded "
                   "ones (--context is added).")
@click.option("--calibration", "calibration_path", type=click.Path(dir_okay=False),
              default=None, help="Measured times to set against predictions: a calibration "
                                 "file from `specsim calibrate` (compared with the roofline "
                                 "model on --hardware), a `specsim validate report --json` "
                                 "output (GPU runs vs their pre-run predictions), or a JSON "
                                 'list of {"label", "measured_ms", "predicted_ms"}. Default: '
                                 "the shipped validation run of the model on the first "
                                 "hardware, where there is one; 'none' for no such figure.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor-parallel GPUs.")
@click.option("--k-max", type=click.IntRange(1, defaults.K_MAX), default=None,
              help="Largest draft length k (default: the trace's recorded k).")
@click.option("--policy", default=None,
              help="Selection policy to cost trace groups with whose drafter specsim does not "
                   "model (e.g. imported from vLLM).")
@click.option("--sparsity", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="Sparsity s for trace groups recorded without one.")
@click.option("--bootstrap", "n_boot", type=click.IntRange(min=50), default=defaults.BOOTSTRAP,
              show_default=True, help="Bootstrap replicates (resampling requests) for the CIs.")
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=DEFAULT_OUT,
              show_default=True, help="HTML file to write (atomically).")
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a browser.")
@click.option("--costs", "costs_choice", default="auto", show_default=True,
              help=defaults.COSTS_HELP)
def dashboard_cmd(trace_path, fmt, model, hardware, compare_hardware, batch, batches, context,
                  contexts, calibration_path, tp, k_max, policy, sparsity, n_boot, seed,
                  out_path, open_browser, costs_choice):
    """Write an interactive dashboard: one self-contained HTML file (plotly.js inline, works
    offline).

    \b
    It shows the speedup heatmap over (k, s) with k*, s* and Vegas' 3-step path; speedup vs
    k per policy with confidence bands and the efficiency-inversion point; the iteration
    time split; acceptance per draft position and by context length; a batch × context
    regime map with the memory/compute-bound boundary; and measured vs predicted times (the
    shipped validation run of the model, or --calibration). Controls switch hardware, batch,
    context and policy: every combination is predicted in advance, so the page needs no
    server.
    """
    from specsim.dashboards import DashboardOptions, Validation, build_dashboard
    from specsim.dashboards.validation import ReadContext, load_validation
    from specsim.policies import get_policy
    from specsim.specs import load_model

    check_outputs({"--out": out_path},
                  [trace_path, model, hardware, calibration_path, costs_choice,
                   *compare_hardware.split(",")])
    trace_label = "<stdin>" if trace_path == "-" else trace_path or defaults.TRACE
    trace = load_trace_arg(trace_path, fmt, per_draft=False)
    spec = load_model(defaults.model_for(model, trace.header)[0])
    hw = _hardware_set(hardware, compare_hardware)
    if policy is not None:
        get_policy(policy)
    validation = None
    if calibration_path is None:
        shipped = SHIPPED_VALIDATION.get((spec.name, next(iter(hw))))
        calibration_path = shipped_file(shipped) if shipped else None
    if calibration_path and calibration_path.lower() != "none":
        calibration_path = resolve(calibration_path)
        what, points = load_validation(calibration_path,
                                       ReadContext(spec, next(iter(hw.values()))))
        validation = Validation(points, f"{os.path.basename(calibration_path)}: {what}")
    opts = DashboardOptions(
        hardware=next(iter(hw)), batch=batch, context=context,
        batches=_int_list(batches, "--batches"), contexts=_int_list(contexts, "--contexts"),
        tp=tp, k_max=k_max, n_boot=n_boot, seed=seed, policy=policy, sparsity=sparsity,
        costs=costs_choice)
    try:
        dash = build_dashboard(trace, spec, hw, opts, validation=validation,
                               trace_label=trace_label,
                               progress=lambda msg: echo(msg, err=True))
    except ValueError as exc:
        raise SpecsimError(str(exc)) from None
    path = dash.write(out_path)
    size = path.stat().st_size / 1e6
    best = dash.default_report.best
    echo(f"wrote {path} ({size:.1f} MB): {len(dash.reports)} settings; best at the first "
               f"one: {best.policy}, s = {best.s}, k = {best.k}, "
               f"{best.speedup:.2f}×" + ("   [SYNTHETIC trace]" if trace.synthetic else ""))
    if open_browser:
        click.launch(path.resolve().as_uri())
