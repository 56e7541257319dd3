"""`specsim review`: four questions about the evidence for Vegas' choices (is Collect-2-Query a
good proxy, is every policy tuned alike, is anything tuned on the test set, which differences
are within error bars), answered with specsim's own measurements (``specsim.review``)."""
from __future__ import annotations

import json
import sys

import click

from specsim.cli import defaults
from specsim.cli.files import trace_input
from specsim.cli.terminal import echo
from specsim.errors import SpecsimError
from specsim.shipped import shipped_file


def _default_proxy(trace_model: str | None) -> str | None:
    """The shipped proxy-check file, when it was measured on the trace's model."""
    path = shipped_file(defaults.REVIEW_PROXY)
    if path is None or trace_model is None:
        return None
    try:
        model = json.loads(open(path).read()).get("model")
    except (OSError, ValueError):
        return None
    return path if model == trace_model else None


@click.command("review")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Trace for answers (2)-(4), any format `specsim predict` reads. Default: "
                   f"the shipped {defaults.REVIEW_TRACE} (SmolLM2-135M, fp32 on a CPU, as the "
                   "shipped proxy check).")
@click.option("--format", "fmt", default="auto", show_default=True,
              type=click.Choice(defaults.FORMATS),
              help="Trace format; 'auto' detects it from the content.")
@click.option("--proxy", "proxy_path", type=click.Path(dir_okay=False), default=None,
              help="Proxy-check file for answer (1), made by scripts/review_proxy.py. Default: "
                   f"the shipped {defaults.REVIEW_PROXY} when it was measured on the trace's "
                   "model.")
@click.option("--model", default=None, help=defaults.MODEL_HELP)
@click.option("--hardware", default=defaults.HARDWARE, show_default=True,
              help=defaults.HARDWARE_HELP)
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor-parallel GPUs.")
@click.option("--batch", type=click.IntRange(min=1), default=defaults.BATCH, show_default=True,
              help="Sequences decoded together (predict's workload; the simulator's max batch).")
@click.option("--context", type=click.IntRange(min=1), default=None,
              help="Context of every sequence (default: the trace's recorded contexts).")
@click.option("--costs", "costs_choice", default="auto", show_default=True,
              help=defaults.COSTS_HELP)
@click.option("--holdout", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=0.5, show_default=True,
              help="Fraction of the prompts held out for evaluation in answer (3).")
@click.option("--bootstrap", "n_boot", type=click.IntRange(min=50), default=defaults.BOOTSTRAP,
              show_default=True, help="Bootstrap replicates for every CI.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the bootstraps and of the holdout split.")
@click.option("--simulate", is_flag=True,
              help="Also answer (2) and (3) with the serving simulator (specsim tune's sweep).")
@click.option("--sim-k", "sim_k", default="auto", show_default=True,
              help="Draft lengths the simulator sweeps (with --simulate), comma-separated; "
                   "auto: 1 to the largest recorded k, the analytical grid.")
@click.option("--arrivals", default="all:64", show_default=True,
              help="Simulator arrivals (with --simulate), as `specsim tune --arrivals`.")
@click.option("--output-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Output tokens per simulated request (all:/poisson: arrivals).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Simulator processes (default: all cores).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def review_cmd(trace_path, fmt, proxy_path, model, hardware, tp, batch, context, costs_choice,
               holdout, n_boot, seed, simulate, sim_k, arrivals, output_tokens, workers,
               as_json):
    """Check the evidence for Vegas' choices with specsim's own measurements: four
    questions, each answered with confidence intervals.

    \b
    (1) Is Collect-2-Query a good proxy? Vegas' draft reads the KV that two of the k+1
        verify rows rank highest: does that pick the KV all k+1 rows would, and are as
        many drafts accepted? From a proxy-check file: by default the shipped
        traces/review-proxy-smollm2-135m.json (SmolLM2-135M, fp32 on a CPU, 8 prompts;
        scripts/review_proxy.py makes one for another model or prompt set).
    (2) Symmetric tuning: every policy at its own optimum (k*, s*) on the same grid.
    (3) No tuning on the test set: (k*, s*) picked on part of the prompts, the speedup
        reported on the rest.
    (4) Error bars: which policies' best speedups are distinguishable (paired bootstrap
        over prompts).

    (2)-(4) price the trace (by default the shipped traces/smollm2-135m-greedy.jsonl) as
    `specsim predict` does; --simulate answers (2) and (3) with the serving simulator too.
    """
    from specsim import predict as P
    from specsim import review as R
    from specsim.costs import make_cost_model
    from specsim.specs import load_hardware, load_model
    from specsim.traces.importers import load_trace

    trace_path = (trace_input(trace_path)
                  or shipped_file(defaults.REVIEW_TRACE) or defaults.REVIEW_TRACE)
    trace = load_trace(trace_path, None if fmt == "auto" else fmt)
    trace_model = trace.header.get("model")
    model_name, model_source = defaults.model_for(model, trace.header)
    spec, hw = load_model(model_name), load_hardware(hardware)
    try:
        costs, costs_note = make_cost_model(spec, hw, tp, costs_choice)
    except ValueError as exc:
        raise SpecsimError(str(exc)) from None
    proxy_path = proxy_path or _default_proxy(trace_model)
    proxy = R.read_proxy(proxy_path) if proxy_path else None

    opts = P.PredictOptions(batch=batch, context=context, n_boot=n_boot, seed=seed)
    report = {"model": model_name, "model_source": model_source, "hardware": hardware,
              "tp": tp, "costs": costs_note}
    report["proxy"] = (R.proxy_answer(proxy, n_boot, seed) if proxy else None)
    report.update(R.review_trace(trace, costs, opts, holdout, seed))
    if simulate:
        from specsim.cli.simulate_cmds import parse_arrivals
        try:
            ks = (list(range(1, R.recorded_k(trace) + 1)) if sim_k == "auto"
                  else sorted({int(x) for x in sim_k.split(",") if x.strip()}))
        except ValueError:
            raise click.BadParameter("expected comma-separated integers",
                                     param_hint="--sim-k") from None
        if not ks or ks[0] < 1:
            raise click.BadParameter("draft lengths must be ≥ 1", param_hint="--sim-k")
        with click.progressbar(length=R.simulation_configs(trace, ks), label="simulating",
                               file=sys.stderr) as bar:
            report["simulated"] = R.simulated_answers(
                trace, model=model_name, hardware=hardware, tp=tp, costs=costs_choice,
                arrivals=parse_arrivals(arrivals, None, output_tokens, seed), max_batch=batch,
                ks=ks, holdout=holdout, seed=seed, workers=workers, progress=bar.update)
    if as_json:
        from specsim.cli.main import _emit_json
        return _emit_json(report)
    _print_review(report)


# --------------------------------------------------------------------------------------------
# text report
# --------------------------------------------------------------------------------------------


def _s(s) -> str:
    return "-" if s is None else f"{s:g}"


def _pct(x, digits=1) -> str:
    return "-" if x is None else f"{x * 100:.{digits}f}%"


def _ci(pair, fmt="{:.3f}") -> str:
    return f"[{fmt.format(pair[0])}, {fmt.format(pair[1])}]"


def _print_review(r: dict) -> None:
    from specsim.cli.main import _table
    level = int(round(r["confidence_level"] * 100))
    echo(f"trace     {r['trace']}" + ("   [SYNTHETIC]" if r["synthetic"] else "")
               + f"  ({r['requests']} requests, {r['prompts']} prompts)")
    echo(f"costs     {r['model']} ({r['model_source']}) on {r['hardware']}, tp {r['tp']}, "
               f"batch {r['batch']}: {r['costs']}")
    echo(f"CIs       {level}%, bootstrap over prompts ({r['bootstrap']} replicates"
               + (", paired by prompt)" if r["bootstrap_paired_by_prompt"] else
                  ", NOT paired: the trace has no prompt ids)"))
    echo("")
    _print_proxy(r["proxy"], _table, level)
    echo("")
    _print_tuning(r, _table, level)
    echo("")
    _print_holdout(r, _table, level)
    echo("")
    _print_comparison(r, _table, level)
    for note in r["notes"]:
        echo(f"note: {note}")


def _print_proxy(p: dict | None, _table, level: int) -> None:
    echo("(1) Is Collect-2-Query a good proxy for ranking by all k+1 verify rows?")
    if p is None:
        echo("    not measured: run scripts/review_proxy.py and pass --proxy FILE")
        return
    setup = p["setup"]
    echo(f"    {p['model']} ({setup.get('weights')} weights, {setup.get('dtype')}, "
               f"{setup.get('device')}, {setup.get('sampling')}), {len(p['prompts'])} prompts, "
               f"k ∈ {p['ks']}, s ∈ {p['ss']}; {p['budget_rule']}; file {p['source']}")
    o, a, f = p["overlap"], p["accepted"], p["falsifier"]
    echo(f"    top-K overlap: {_pct(o['mean'])} {_ci([x * 100 for x in o['ci']], '{:.1f}%')}"
               f" over {o['checks']} checks (sequence, verify) × {o['layers']} layers "
               f"(during C2Q drafting {_pct(o['during_c2q_runs'])}, during all-rows drafting "
               f"{_pct(o['during_all_rows_runs'])})")
    echo(f"    accepted drafts per iteration E[m]: C2Q {a['accepted_c2q']:.3f}, all rows "
               f"{a['accepted_all']:.3f}: deficit {_pct(a['deficit'])} "
               f"{_ci([x * 100 for x in a['deficit_ci']], '{:.1f}%')}; tokens per iteration "
               f"E[m+1] {a['tokens_c2q']:.3f} vs {a['tokens_all']:.3f}, deficit "
               f"{_pct(a['tokens_deficit'])} "
               f"{_ci([x * 100 for x in a['tokens_deficit_ci']], '{:.1f}%')}")
    echo(f"    falsifier (overlap < {_pct(f['overlap_below'], 0)} and deficit > "
               f"{_pct(f['deficit_above'], 0)}): {f['verdict']}")
    rows = [[r["k"], _s(r["s"]), r["prompts"], _pct(r["overlap"]),
             f"{r['accepted_c2q']:.3f}", f"{r['accepted_all']:.3f}",
             f"{_pct(r['deficit'])} {_ci([x * 100 for x in r['deficit_ci']], '{:.1f}%')}",
             f"{r['tokens_c2q']:.3f} / {r['tokens_all']:.3f}"] for r in p["by_config"]]
    echo(_table(["k", "s", "prompts", "overlap", "E[m] C2Q", "E[m] all",
                       f"deficit [{level}% CI]", "E[m+1] C2Q / all"], rows, "rrrrrrrr"))
    echo("    by the gap between the two collected rows (rows 1 and k of the k+1, "
               "k − 1 apart), over every s:")
    rows = [[g["row_gap"], g["k"], f"{_pct(g['overlap'])} "
             f"{_ci([x * 100 for x in g['overlap_ci']], '{:.1f}%')}",
             f"{_pct(g['deficit'])} {_ci([x * 100 for x in g['deficit_ci']], '{:.1f}%')}"]
            for g in p["by_row_gap"]]
    echo(_table(["row gap", "k", "overlap [CI]", "E[m] deficit [CI]"], rows, "rrrr"))
    echo("    by key distance d = L − n from the next token (recent "
               f"{p['recent_excluded']} excluded): recall = share of all-rows picks that C2Q "
               f"also picks")
    rows = [[b["distance"], _pct(b["recall"]), _pct(b["share_of_c2q_picks"]),
             _pct(b["share_of_all_rows_picks"])] for b in p["by_distance"]]
    echo(_table(["distance", "recall", "C2Q picks here", "all-rows picks here"], rows,
                      "lrrr"))
    rows = [[c["context"], _pct(c["overlap"]), c["layer_entries"]] for c in p["by_context"]]
    echo(_table(["context", "overlap", "layer entries"], rows, "lrr"))
    layers = p["by_layer"]
    worst = min(layers, key=lambda x: x["overlap"])
    best = max(layers, key=lambda x: x["overlap"])
    echo(f"    by layer: lowest layer {worst['layer']} {_pct(worst['overlap'])}, highest "
               f"layer {best['layer']} {_pct(best['overlap'])}")
    for start in range(0, len(layers), 10):
        chunk = layers[start:start + 10]
        echo("    " + "  ".join(f"L{x['layer']:<2d} {x['overlap'] * 100:5.1f}%"
                                      for x in chunk))


def _print_tuning(r: dict, _table, level: int) -> None:
    t = r["tuning"]
    grid = t["grid"]
    echo("(2) Symmetric tuning: every policy at its own optimum on "
               + ("the same grid" if grid["same_for_every_policy"] else "its recorded grid "
                  "(NOT the same for every policy)")
               + f": k ∈ {grid['k']}, s ∈ {grid['s']} (analytical model, counterfactual "
                 f"replay)")
    rows = []
    for p in t["policies"]:
        step = p.get("three_step")
        rows.append([p["policy"], p["k_star"], _s(p["s_star"]),
                     f"{p['speedup']:.3f}× {_ci(p['speedup_ci'])}",
                     f"{p['k_star_ci_at_s_star'][0]}–{p['k_star_ci_at_s_star'][1]}",
                     f"{p['expected_tokens']:.2f}",
                     f"k={step['k']} s={_s(step['s'])} {step['speedup']:.3f}×" if step else "-"])
    echo(_table(["policy", "k*", "s*", f"speedup [{level}% CI]", "k* CI at s*", "E[m+1]",
                       "Vegas 3-step"], rows, "lrrrrrl"))
    sim = r.get("simulated")
    if sim:
        arrivals = ":".join(str(x) for x in sim["arrivals"] if x is not None)
        echo(f"    simulated (specsim tune's sweep, k ∈ {sim['grid']['k']}, s ∈ "
                   f"{sim['grid']['s']}, arrivals {arrivals}, max batch {sim['max_batch']}):")
        rows = [[p["policy"], p["k_star"], _s(p["s_star"]), f"{p['speedup']:.3f}×",
                 f"k={p['three_step']['k']} s={_s(p['three_step']['s'])} "
                 f"{p['three_step']['speedup']:.3f}×" if p.get("three_step") else "-"]
                for p in sim["policies"]]
        echo(_table(["policy", "k*", "s*", "simulated speedup", "Vegas 3-step"], rows,
                          "lrrrl"))


def _print_holdout(r: dict, _table, level: int) -> None:
    h = r["holdout"]
    echo(f"(3) No tuning on the test set: (k*, s*) picked on {h['tuning_requests']} "
               f"requests, reported on {h['evaluation_requests']} held-out ones (fraction "
               f"{h['holdout_fraction']:g}, seed {h['seed']}); optimism = tuned-on-test minus "
               f"tuned-on-holdout")
    rows = [[p["policy"], f"k={p['tuned']['k']} s={_s(p['tuned']['s'])}",
             f"{p['speedup_on_tuning_part']:.3f}×",
             f"{p['speedup_on_evaluation_part']:.3f}× {_ci(p['speedup_ci'])}",
             f"k={p['tuned_on_evaluation']['k']} s={_s(p['tuned_on_evaluation']['s'])} "
             f"{p['tuned_on_evaluation']['speedup']:.3f}×", f"{p['optimism']:+.3f}"]
            for p in h["policies"]]
    echo(_table(["policy", "tuned on tuning part", "on tuning part",
                       f"on held out [{level}% CI]",
                       "tuned on held out", "optimism"], rows, "llrrlr"))
    sim = r.get("simulated")
    if sim:
        echo("    simulated:")
        rows = [[p["policy"], f"k={p['tuned']['k']} s={_s(p['tuned']['s'])}",
                 f"{p['speedup_on_tuning_part']:.3f}×", f"{p['speedup_on_evaluation_part']:.3f}×",
                 f"k={p['tuned_on_evaluation']['k']} s={_s(p['tuned_on_evaluation']['s'])} "
                 f"{p['tuned_on_evaluation']['speedup']:.3f}×", f"{p['optimism']:+.3f}"]
                for p in sim["holdout"]["policies"]]
        echo(_table(["policy", "tuned on tuning part", "on tuning part", "on held out",
                           "tuned on held out", "optimism"], rows, "llrrlr"))


def _print_comparison(r: dict, _table, level: int) -> None:
    echo(f"(4) Error bars: policies at their own optima, pairwise ({level}% CI of the "
               f"speedup difference; distinguishable when one wins in ≥ {level}% of replicates)")
    comparison = r["comparison"]
    if not comparison:
        echo("    only one policy in the trace: nothing to compare")
        return
    rows = [[f"{c['a']} vs {c['b']}",
             f"{c['a_speedup']:.3f}× vs {c['b_speedup']:.3f}×",
             f"{c['difference']:+.3f} {_ci(c['difference_ci'], '{:+.3f}')}",
             f"{c['share_a_wins'] * 100:.1f}%", "yes" if c["distinguishable"] else "NO"]
            for c in comparison]
    echo(_table(["pair", "speedups", "difference [CI]", "first wins", "distinguishable"],
                      rows, "lrrrl"))
    same = [f"{c['a']} ≈ {c['b']}" for c in comparison if not c["distinguishable"]]
    echo("    not distinguishable: " + (", ".join(same) if same else "none"))


__all__ = ["review_cmd"]
