"""`specsim calibrate`: measure cost tables on a GPU (--gpu), check a calibration (--check),
combine two runs of one model and GPU into one file (--merge), or fit a serving engine's
profile from its metrics (--from-server)."""
from __future__ import annotations

import json
import sys

import click

from specsim.cli import defaults
from specsim.cli.engine_cmds import setting_option
from specsim.cli.files import check_outputs
from specsim.cli.lists import parse_ints, parse_shapes, parse_sparsities
from specsim.errors import SpecsimError


@click.command("calibrate")
@click.option("--gpu", is_flag=True,
              help="Measure on this machine's GPU: plain steps, verify passes (q = 1..16), "
                   "sparse draft steps, each policy's selection and the decoding loop's own "
                   "overheads, with the engine's kernels, CUDA graphs and random weights of "
                   "the model's real shapes.")
@click.option("--operators", is_flag=True,
              help="With --gpu: measure this GPU's operator tables instead of one model: GEMMs "
                   "at a grid of (m, n, k), the verify and sparse attention kernels through "
                   "their planners (head dims 64 and 128, GQA groups 3-8), the K/V append, "
                   "element-wise kernels, each policy's selection and the CUDA-graph replay, "
                   "with a copy-bandwidth probe; what prices any model without a calibration "
                   "of its own (an H200 measures it in about 13 minutes). Resumable like a "
                   "model calibration, also under a grid that adds groups; --time-budget "
                   "defaults to 900 s; --repeats, when given, sets the samples per point.")
@click.option("--check", "check_path", type=click.Path(dir_okay=False), default=None,
              help="Held-out check of a calibration file: predict every third interior "
                   "context point of each series from the rest; MAPE and worst case per term.")
@click.option("--compose", "compose_path", type=click.Path(dir_okay=False),
              default=None, metavar="TABLE",
              help="With --check: instead of the held-out check, the composition error of "
                   "operator table TABLE against the calibration: every measured step priced "
                   "from the GPU's operators alone and with the terms fitted on the other "
                   "models' calibrations on that GPU (MAPE, worst and bias per term).")
@click.option("--merge", "merge_paths", nargs=2, type=click.Path(exists=True, dir_okay=False),
              default=None, metavar="NEW OLD",
              help="Combine two calibration runs of the same model and GPU into --out: NEW's "
                   "rows all stay and OLD adds plain/verify/draft/selection rows at the "
                   "(batch, context) shapes NEW lacks (loop overheads from NEW only; recorded "
                   "under provenance.merged); with --replace, OLD with NEW's rows of those "
                   "families instead of its own (provenance.replaced). Rows timed with other "
                   "engine settings where those settings touch them are not mixed.")
@click.option("--replace", "replace_families", default=None, metavar="FAMILIES",
              help="With --merge: comma-separated op families (plain, verify, draft, "
                   "selection, overhead) or exact ops (draft:quest) to take from NEW, e.g. "
                   "'overhead' after re-measuring the loop overheads alone (--gpu --only "
                   "overhead).")
@click.option("--keep-other-shapes", is_flag=True,
              help="With --replace: keep OLD's rows of an op at the (batch, context) shapes "
                   "NEW did not measure it at (a budget-cut re-measurement of unchanged "
                   "kernels).")
@click.option("--exclude-ops", default="", metavar="OPS",
              help="With --merge (no --replace): comma-separated ops whose OLD rows are not "
                   "taken (their code changed between the runs), e.g. selection:last-token.")
@click.option("--note", default=None,
              help="With --merge: why the rows may be combined (recorded in the provenance).")
@click.option("--model", default=defaults.FALLBACK_MODEL, show_default=True,
              help="Catalogue name or config.json path (shapes only; weights are random).")
@click.option("--hardware", default=defaults.HARDWARE, show_default=True,
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
              help="Calibration file to write (with --gpu or --merge). With --gpu it is "
                   "rewritten after every (batch, context) shape, so an interrupted run keeps "
                   "what it measured; the same command again resumes it (measuring only the "
                   "missing shapes). A file made with other settings (the grid, the engine "
                   "settings, the software) is refused, not overwritten.")
@click.option("--time-budget", type=click.FloatRange(min=1), default=None,
              help="Seconds after which no new (batch, context) shape is started.")
@click.option("--only", default=None,
              help="Measure only these op families (comma-separated: plain, verify, draft, "
                   "selection, overhead, prefill). E.g. 'overhead' re-measures the decoding "
                   "loop's "
                   "overheads alone after a change to its host code; put them into a full "
                   "file with --merge NEW OLD --replace overhead. With --operators: these "
                   "operators alone, anew, in the table --out holds (gemm, grouped_gemm, "
                   "moe_routing, elementwise, graph, kv_append, verify, sparse, selection, "
                   "prefill_attention).")
@click.option("--from-server", "server_sources", multiple=True, metavar="FILE|URL",
              help="Fit an engine profile (the vLLM or SGLang deployment's own steps against "
                   "specsim's, for predict --engine-profile) from a capture file, or capture "
                   "one from a live server's URL (its /metrics and /v1/completions). Repeat "
                   "for several captures (a plain server and a speculative one). Writes the "
                   "profile to --out.")
@click.option("--capture-shapes", default="1x2048,4x2048,16x2048,4x8192", show_default=True,
              metavar="BxC,…",
              help="With a URL: concurrency x prompt tokens of each captured run.")
@click.option("--capture-output", type=click.IntRange(min=2), default=256, show_default=True,
              help="With a URL: output tokens per request (EOS ignored).")
@click.option("--speculative", "speculative_text", default="none", show_default=True,
              metavar="SPEC",
              help="With a URL: what the server runs: none, DRAFTER,k=K (eagle3,k=4) or "
                   "sparse-self,POLICY,s=S,k=K (the Vegas fork).")
@click.option("--capture-out", type=click.Path(dir_okay=False), default=None,
              help="With a URL: also keep the capture here (rewritten after every run).")
@click.option("--costs", "costs_choice", default="auto", show_default=True,
              help="With --from-server: the cost source the profile is fitted against.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@setting_option
@click.pass_context
def calibrate_cmd(ctx, gpu, operators, check_path, compose_path, merge_paths, replace_families,
                  keep_other_shapes, exclude_ops, note, model, hardware, batches, contexts, qs,
                  sparsities, policies, repeats, out, time_budget, only, server_sources,
                  capture_shapes, capture_output, speculative_text, capture_out, costs_choice,
                  as_json, engine_settings):
    """Measured cost tables (a model's calibration, a GPU's operator tables), their checks,
    and the combination of two runs.

    \b
    specsim calibrate --gpu --model qwen3-8b --out qwen3-8b.json [--setting c2q=rows]
    specsim calibrate --gpu --operators --out h200.json
    specsim calibrate --check models/calibrations/h200/qwen3-8b.json
    specsim calibrate --merge NEW.json OLD.json --out OUT.json --note "why"
    specsim calibrate --merge NEW.json OLD.json --replace overhead --out OUT.json --note "why"
    specsim calibrate --from-server http://127.0.0.1:8000 --capture-out plain.json \\
        --model qwen3-8b --out vllm-profile.json      # a plain server, captured and fitted
    specsim calibrate --from-server plain.json --from-server eagle.json --out profile.json

    A --gpu run records its engine settings and their hash in provenance.engine (settings,
    settings_hash).
    """
    from specsim.specs import load_hardware, load_model

    if sum((gpu, bool(check_path), bool(merge_paths), bool(server_sources))) != 1:
        raise click.UsageError("give exactly one of --gpu (measure), --check FILE, "
                               "--merge NEW OLD or --from-server FILE|URL")
    if server_sources:
        model_given = ctx.get_parameter_source("model") != click.core.ParameterSource.DEFAULT
        _from_server(server_sources, capture_shapes, capture_output, speculative_text,
                     capture_out, model if model_given else None, hardware, costs_choice, out,
                     as_json)
        return
    if not merge_paths and (replace_families or keep_other_shapes or exclude_ops or note):
        raise click.UsageError("--replace, --keep-other-shapes, --exclude-ops and --note go "
                               "with --merge")
    if compose_path and not check_path:
        raise click.UsageError("--compose goes with --check CALIBRATION")
    if operators and not gpu:
        raise click.UsageError("--operators goes with --gpu (a measurement)")
    if engine_settings != engine_settings.__class__() and not gpu:
        raise click.UsageError("--setting goes with --gpu (a measurement's engine)")
    if merge_paths:
        _merge(merge_paths, replace_families, keep_other_shapes, exclude_ops, note, out,
               as_json)
        return
    if check_path:
        from specsim.costs.calibration_file import read_calibration
        from specsim.costs.held_out import held_out_check
        from specsim.shipped import resolve
        check_path = resolve(check_path)       # a shipped calibration by its repository name
        cal = read_calibration(check_path)
        spec = load_model(cal.provenance.get("model") or model)
        if compose_path:
            _compose(cal, spec, load_hardware(hardware), check_path, resolve(compose_path),
                     as_json)
            return
        report = held_out_check(cal, spec, load_hardware(hardware))
        if as_json:
            click.echo(json.dumps(report, indent=2))
            return
        from specsim.cli.main import _table
        from specsim.settings import retired_settings
        prov = cal.provenance
        click.echo(f"{check_path}: {prov.get('gpu')}, {prov.get('model')}, torch "
                   f"{prov.get('torch')}, triton {prov.get('triton')}, {prov.get('date')}")
        click.echo(f"held out {report['held_out']} interior grid points, fitted on "
                   f"{report['kept']}:")
        retired = retired_settings(cal.provenance.get("engine") or {})
        if retired:
            click.echo("timed with retired engine settings: " + "; ".join(
                f"{name}={str(ran).lower()} (the engine runs {str(now).lower()})"
                for name, (ran, now) in retired.items()))
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
    check_outputs({"--out": out})      # an existing file is the run's checkpoint: resumed
    from specsim.calibrate import OP_FAMILIES
    from specsim.operator_sweep import MEASURES
    kinds = MEASURES if operators else OP_FAMILIES
    families = [f.strip() for f in only.split(",") if f.strip()] if only else None
    if families is not None and (not families or set(families) - set(kinds)):
        raise click.UsageError(f"--only {only!r}: expected some of {', '.join(kinds)}")
    _require_cuda()
    if operators:
        _operators(ctx, out, repeats, time_budget, engine_settings, tuple(families or ()))
        return
    from specsim.calibrate import CalibrationGrid, measure
    spec = load_model(model)
    grid = CalibrationGrid(batches=parse_ints(batches, "--batch"),
                           contexts=parse_ints(contexts, "--context"),
                           qs=parse_ints(qs, "--q"),
                           sparsities=parse_sparsities(sparsities, "--sparsity"),
                           policies=[p.strip() for p in policies.split(",") if p.strip()],
                           repeats=repeats, time_budget_s=time_budget, only=families)
    cal = measure(spec, grid, progress=True, settings=engine_settings, checkpoint=out)
    left = cal.provenance.get("shapes_left", 0)
    click.echo(f"wrote {len(cal.measurements)} measurements to {out}"
               + (f" ({left} shapes not measured: run the same command to resume)"
                  if left else ""))


def _compose(cal, spec, hardware, check_path, compose_path, as_json) -> None:
    """``--check CAL --compose TABLE``: the composition error table, of the operators alone
    and with the terms fitted on the other models' calibrations on this GPU (as predict
    prices)."""
    from specsim.cli.main import _table
    from specsim.costs.composition import composition_error
    from specsim.costs.fitted import fitted_for
    from specsim.costs.operator_file import read_operator_table
    from specsim.costs.operators import OperatorCostModel

    table = read_operator_table(compose_path)
    fitted = fitted_for(table, spec, hardware)
    composed = OperatorCostModel.as_calibrated(table, spec, hardware, cal, fitted=fitted)
    alone = composition_error(cal, composed, residual=False)
    report = composition_error(cal, composed)
    if as_json:
        click.echo(json.dumps({"fitted_on": list(fitted.models) if fitted else [],
                               "operators_alone": alone, "fitted": report}, indent=2))
        return
    prov = table.provenance
    click.echo(f"{spec.name} composed from {compose_path} ({prov.get('gpu')}, "
               f"{prov.get('date')}) against its calibration {check_path}; residuals "
               + (fitted.source if fitted else "not fitted (no other model's calibration on "
                  f"'{hardware.key}')") + ":")
    rows = [[op, v["points"], f"{alone['per_op'][op]['mape'] * 100:.1f}%",
             f"{v['mape'] * 100:.1f}%", f"{v['worst'] * 100:+.1f}%", f"{v['bias'] * 100:+.1f}%"]
            for op, v in report["per_op"].items()]
    click.echo(_table(["term", "points", "alone MAPE", "MAPE", "worst", "bias"], rows))
    total = report["all"]
    click.echo(f"all: MAPE {total['mape'] * 100:.1f}% (operators alone "
               f"{alone['all']['mape'] * 100:.1f}%), worst {total['worst'] * 100:+.1f}%")


def _require_cuda() -> None:
    from specsim.cli.gpu import require_gpu_packages
    require_gpu_packages("specsim calibrate --gpu")
    import torch
    if not torch.cuda.is_available():
        raise SpecsimError("--gpu needs a CUDA GPU; none is visible")


def _operators(ctx, out, repeats, time_budget, engine_settings, only=()) -> None:
    """``--gpu --operators``: the operator grid measured into ``out`` (resumed when there)."""
    from click.core import ParameterSource

    from specsim.operator_sweep import OperatorGrid, measure_operators

    grid = OperatorGrid()
    if ctx.get_parameter_source("repeats") != ParameterSource.DEFAULT:
        grid.repeats = repeats
    if time_budget:
        grid.time_budget_s = time_budget
    table = measure_operators(grid, out, settings=engine_settings, only=only)
    left = table.provenance.get("groups_left", 0)
    click.echo(f"wrote {len(table.points)} operator points to {out}"
               + (f" ({left} groups not measured: run the same command to resume)"
                  if left else ""))


def _merge(paths, families, keep_other_shapes, exclude_ops, note, out, as_json) -> None:
    """``--merge NEW OLD``: ``merge_calibrations(NEW, OLD)``, or with ``--replace``
    ``replace_ops(OLD, NEW, families)``, written to ``--out``."""
    from specsim.costs.calibration_file import read_calibration
    from specsim.costs.merging import merge_calibrations, replace_ops

    if not out or not note:
        raise click.UsageError("--merge needs --out FILE and --note WHY")
    if keep_other_shapes and not families:
        raise click.UsageError("--keep-other-shapes goes with --replace")
    if exclude_ops and families:
        raise click.UsageError("--exclude-ops goes with --merge without --replace")
    check_outputs({"--out": out}, paths)
    new_path, old_path = paths
    new, old = read_calibration(new_path), read_calibration(old_path)
    if families:
        wanted = [f.strip() for f in families.split(",") if f.strip()]
        if not wanted:
            raise click.UsageError("--replace: name some op families")
        merged = replace_ops(old, new, wanted, note, keep_other_shapes=keep_other_shapes)
        info = merged.provenance["replaced"][-1]
        said = (f"{out}: {old_path} with {info['rows']} {'/'.join(info['families'])} rows of "
                f"{new_path} in place of its {info['replaced_rows']}")
    else:
        merged = merge_calibrations(new, old, note,
                                    tuple(op.strip() for op in exclude_ops.split(",")
                                          if op.strip()))
        info = merged.provenance["merged"][-1]
        said = (f"{out}: {info['rows']} rows at {len(info['shapes'])} shapes added from "
                f"{old_path} ({info['date']})"
                + "".join(f"; {op} not taken: {why}"
                          for op, why in info["ops_skipped"].items()))
    merged.write(out)
    click.echo(json.dumps(info, indent=2) if as_json else said)


def _from_server(sources, shapes_text, output_tokens, speculative_text, capture_out, model,
                 hardware, costs_choice, out, as_json) -> None:
    """``--from-server``: read or capture each source, fit the profile, write it to --out."""
    from specsim.costs import resolve_cost_source
    from specsim.costs.engine_profile import fit_profile, profile_error, read_capture, read_run
    from specsim.costs.engine_profile import Capture
    from specsim.costs.server_capture import REQUESTS_PER_SLOT, capture, parse_speculative
    from specsim.specs import catalogue_name, load_hardware, load_model

    if out is None:
        raise click.UsageError("--from-server needs --out PROFILE.json")
    urls = [s for s in sources if s.startswith(("http://", "https://"))]
    if capture_out and len(urls) != 1:
        raise click.UsageError("--capture-out keeps one live capture: give one URL")
    check_outputs({"--out": out, "--capture-out": capture_out},
                  [s for s in sources if s not in urls])
    if urls:            # what every live capture runs, checked before any of them
        spec = parse_speculative(speculative_text)
        try:
            shapes = parse_shapes(shapes_text, "--capture-shapes", low_context=1)
        except SpecsimError as exc:
            raise click.BadParameter(str(exc).removeprefix("--capture-shapes: "),
                                     param_hint="--capture-shapes") from None
    captures = []
    for source in sources:
        if source not in urls:
            captures.append(read_capture(source))
            continue
        write = None
        if capture_out:
            from specsim.atomic import write_text_atomic

            def write(doc):
                write_text_atomic(capture_out, json.dumps(doc, indent=1))
        total = sum(b for b, _ in shapes) * REQUESTS_PER_SLOT
        with click.progressbar(length=total, label=f"capturing {source}", file=sys.stderr,
                               show_eta=True) as bar:
            doc = capture(source, shapes, output_tokens, spec, progress=bar.update, write=write)
        runs = tuple(read_run(r, doc["engine"], f"{source}: run {i + 1}")
                     for i, r in enumerate(doc["runs"]))
        captures.append(Capture(doc["engine"], doc.get("engine_version"), doc.get("model"),
                                doc.get("gpu"), runs, capture_out or source))
    name = model or catalogue_name(captures[0].model)
    if name is None:
        raise click.UsageError(f"the capture's model {captures[0].model!r} is not in the "
                               f"catalogue: give --model")
    spec_model, hw = load_model(name), load_hardware(hardware)
    source = resolve_cost_source(spec_model, hw, 1, costs_choice)
    profile = fit_profile(captures, source.cost_model, source.note)
    profile.write(out)
    if as_json:
        click.echo(json.dumps(profile.to_json(), indent=2))
        return
    from specsim.cli.main import _table
    click.echo(f"{profile.engine} profile of {name} on {hw.name}, fitted against: "
               f"{source.note}")
    click.echo(f"plain step = {profile.plain_scale:.3f} x specsim's + "
               f"{profile.plain_fixed_s * 1e3:.3f} ms"
               + ("" if profile.draft_scale is None else
                  f"; iteration = {profile.draft_scale:.3f} x draft + "
                  f"{profile.verify_scale:.3f} x verify + selection + "
                  f"{profile.iteration_fixed_s * 1e3:.3f} ms"))
    rows = [[r["run"], f"{r['measured_s'] * 1e3:.3f}", f"{r['specsim_s'] * 1e3:.3f}",
             f"{r['fitted_s'] * 1e3:.3f}", f"{(r['fitted_s'] / r['measured_s'] - 1) * 100:+.1f}%"]
            for r in profile.runs]
    click.echo(_table(["run", "engine ms", "specsim ms", "profile ms", "error"], rows,
                      "lrrrr"))
    for n in profile.notes:
        click.echo(f"note: {n}")
    click.echo(f"mean error of the fit {profile_error(profile) * 100:.1f}%; profile written to "
               f"{out} (predict --engine-profile {out})")
