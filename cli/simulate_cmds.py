"""`specsim simulate` and `specsim tune`: the SimPy serving simulator from the command line."""
from __future__ import annotations

import json
import os
import sys

import click

from specsim.cli import defaults
from specsim.cli.files import check_outputs, load_trace_arg, trace_input
from specsim.cli.lists import parse_ints
from specsim.cli.terminal import echo
from specsim.errors import SpecsimError

ARRIVALS_HELP = ("Request arrivals: 'all:N' (N requests at t=0), 'poisson:RATE:N' (RATE "
                 "requests/s), or a CSV/JSONL file (Azure columns TIMESTAMP, ContextTokens, "
                 "GeneratedTokens). Default: all:200.")


def parse_arrivals(text: str, prompt_tokens: int | None, output_tokens: int, seed: int) -> tuple:
    if os.path.exists(text):
        return ("file", text)
    kind, _, rest = text.partition(":")
    try:
        if kind == "all":
            return ("all", int(rest or 200), prompt_tokens, output_tokens)
        if kind == "poisson":
            rate, _, n = rest.partition(":")
            return ("poisson", int(n or 200), float(rate), seed, prompt_tokens, output_tokens)
    except ValueError:
        pass
    raise click.BadParameter(f"'{text}' is neither all:N, poisson:RATE:N nor an existing file",
                             param_hint="--arrivals")


def _common(f):
    options = [
        click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
                     help=defaults.TRACE_HELP),
        click.option("--format", "fmt", default="auto", show_default=True,
                     type=click.Choice(defaults.FORMATS),
                     help="Trace format; 'auto' detects it from the content."),
        click.option("--arrivals", default="all:200", show_default=True, help=ARRIVALS_HELP),
        click.option("--prompt-tokens", type=click.IntRange(min=1), default=None,
                     help="Prompt length for all:/poisson: arrivals (default: the trace's "
                          "recorded prompt lengths, cycled)."),
        click.option("--output-tokens", type=click.IntRange(min=1), default=300,
                     show_default=True, help="Output tokens per request (all:/poisson:)."),
        click.option("--model", default=None, help=defaults.MODEL_HELP),
        click.option("--hardware", default=defaults.HARDWARE, show_default=True,
                     help=defaults.HARDWARE_HELP),
        click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Tensor-parallel GPUs."),
        click.option("--max-batch", type=click.IntRange(min=1), default=64, show_default=True,
                     help="Most sequences decoded together (continuous batching)."),
        click.option("--prefill-chunk", type=click.IntRange(min=1), default=None,
                     metavar="TOKENS",
                     help="Chunked prefill: prefill up to TOKENS prompt tokens per iteration "
                          "beside the decode (as vLLM's and SGLang's schedulers do), instead "
                          "of pausing decoding for each admitted prompt's whole prefill."),
        click.option("--acceptance", type=click.Choice(("replay", "fitted")), default="replay",
                     show_default=True,
                     help="replay: each request replays a recorded request's iterations "
                          "(counterfactual m' = min(m, k)); fitted: sample m from the fitted "
                          "per-position model, by context-length bin."),
        click.option("--seed", type=int, default=0, show_default=True, help="Random seed."),
        click.option("--costs", "costs_choice", default="auto", show_default=True,
                     help=defaults.COSTS_HELP),
        click.option("--engine-profile", "profile_path", type=click.Path(dir_okay=False),
                     default=None,
                     help="An engine profile (`specsim calibrate --from-server`): the costs "
                          "adjusted to the vLLM or SGLang deployment it was fitted on."),
        click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _trace_path(trace_path):
    return trace_path or defaults.default_trace()


@click.command("simulate")
@_common
@click.option("--policy", default=defaults.POLICY, show_default=True,
              help="Selection policy (a group of the trace).")
@click.option("--sparsity", type=float, default=None,
              help="Sparsity s of the trace group to use (default: the policy's only s, or "
                   "the largest).")
@click.option("--k", type=click.IntRange(min=1), default=4, show_default=True,
              help="Draft length (the largest k for adaptive/oracle).")
@click.option("--k-policy", type=click.Choice(("fixed", "adaptive", "oracle", "plain")),
              default="fixed", show_default=True,
              help="fixed k; SparseSpec-L entropy-adaptive (needs entropies in the trace); "
                   "oracle upper bound (knows m in advance); plain decoding.")
@click.option("--memory-gb", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Memory budget for KV + draft state per GPU, GB (default: 90% of the GPU "
                   "less the weights).")
@click.option("--chrome-trace", type=click.Path(dir_okay=False), default=None,
              help="Write the events as a Chrome trace (open in chrome://tracing or Perfetto).")
@click.option("--compare-plain/--no-compare-plain", default=True, show_default=True,
              help="Also simulate plain decoding on the same arrivals and report the speedup.")
@click.option("--static-batch", is_flag=True,
              help="A static batch (HF generate, specsim's engine) instead of continuous "
                   "batching: a new batch starts only when the last one is done, and finished "
                   "sequences keep costing their slot until then.")
@click.option("--fixed-slots", is_flag=True,
              help="Continuous batching with fixed slots (specsim's engine, CUDA graphs): a "
                   "finished sequence keeps costing its slot until a new request takes it.")
def simulate_cmd(trace_path, fmt, arrivals, prompt_tokens, output_tokens, model, hardware, tp,
                 max_batch, prefill_chunk, acceptance, seed, costs_choice, profile_path,
                 as_json, policy,
                 sparsity, k, k_policy, memory_gb,
                 chrome_trace, compare_plain, static_batch, fixed_slots):
    """Simulate a serving engine doing sparse self-speculative decoding (SimPy): continuous
    batching under a memory budget, per-iteration time from the cost model (--costs) for the
    batch's actual ragged contexts, acceptance from the trace.

    Prints throughput (tokens/s), tokens per iteration, TTFT/TPOT/latency/queueing
    percentiles (seconds; TPOT in ms), the time split and wasted draft work.
    """
    from specsim.costs import resolve_cost_source
    from specsim.simulator.acceptance_source import make_source
    from specsim.simulator.engine import SimConfig, Simulation
    from specsim.simulator.tuning import make_arrivals
    from specsim.specs import load_hardware, load_model

    check_outputs({"--chrome-trace": chrome_trace},
                  [trace_path, model, hardware, costs_choice, arrivals])
    # per-draft fields (entropies) only for the entropy-adaptive k policy that reads them
    trace = load_trace_arg(trace_path, fmt, per_draft=k_policy == "adaptive")
    groups = trace.groups()
    spec = load_model(defaults.model_for(model, trace.header)[0])
    hw = load_hardware(hardware)
    arrival_list = make_arrivals(parse_arrivals(arrivals, prompt_tokens, output_tokens, seed),
                                 trace)
    if k_policy == "plain":
        group_key = next(iter(groups))
        cfg_policy, cfg_s = "full", 1.0
    else:
        ss = sorted(s for (p, s) in groups if p == policy)
        if not ss:
            raise SpecsimError(f"the trace has no '{policy}' records; it has: "
                               f"{', '.join(sorted({p for p, _ in groups}))}")
        if sparsity is None:
            cfg_s = ss[-1]
        elif sparsity not in ss:
            raise SpecsimError(f"the trace has no '{policy}' records at s={sparsity}; it has "
                               f"s = {', '.join(f'{x:g}' for x in ss if x is not None)}")
        else:
            cfg_s = sparsity
        group_key, cfg_policy = (policy, cfg_s), policy
        if cfg_s is None:
            raise SpecsimError(f"'{policy}' records carry no sparsity; cost them with "
                               f"`specsim predict --sparsity` instead")
    try:
        cost_source = resolve_cost_source(spec, hw, tp, costs_choice)
        costs, costs_note = cost_source.cost_model, cost_source.note
        if profile_path is not None:
            from specsim.costs.engine_profile import (ProfiledCostModel, profile_note,
                                                      read_profile)
            profile = read_profile(profile_path)
            costs = ProfiledCostModel(costs, profile)
            costs_note = f"{costs_note}; {profile_note(profile, spec)}"
        source = make_source(acceptance, groups[group_key], k)
    except ValueError as exc:
        raise SpecsimError(str(exc)) from None
    cfg = SimConfig(cfg_policy, cfg_s, k=k, k_policy=k_policy, max_batch=max_batch, seed=seed,
                    memory_budget=memory_gb * 1e9 if memory_gb else None,
                    static_batch=static_batch, fixed_slots=fixed_slots,
                    prefill_chunk=prefill_chunk)
    result = Simulation(arrival_list, costs, spec, source, cfg, hw.memory_bytes, tp).run()
    report = result.to_json()
    report["costs"] = costs_note
    report["cost_validation"] = cost_source.validated
    if compare_plain and k_policy != "plain":
        base_cfg = SimConfig("full", 1.0, k=1, k_policy="plain", max_batch=max_batch, seed=seed,
                             memory_budget=cfg.memory_budget, static_batch=static_batch,
                             fixed_slots=fixed_slots, prefill_chunk=prefill_chunk)
        base = Simulation(arrival_list, costs, spec, source, base_cfg, hw.memory_bytes, tp).run()
        report["plain"] = base.summary
        report["speedup"] = (result.summary["throughput_tokens_per_s"]
                             / base.summary["throughput_tokens_per_s"])
    if chrome_trace:
        result.write_chrome_trace(chrome_trace)
        report["chrome_trace"] = chrome_trace
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    echo(f"{spec.name} on {hw.name}, tp {tp}; {cfg_policy} s={cfg_s:g}, k={k} "
               f"({k_policy}), max batch {max_batch}, {acceptance} acceptance"
               + ("   [SYNTHETIC trace]" if trace.synthetic else ""))
    echo(f"costs: {costs_note}")
    echo(f"trust: {cost_source.validated}")
    echo(result.table())
    if "speedup" in report:
        echo(f"plain decoding on the same arrivals: "
                   f"{report['plain']['throughput_tokens_per_s']:.0f} tokens/s → speedup "
                   f"{report['speedup']:.3f}×")
    if chrome_trace:
        echo(f"chrome trace written to {chrome_trace}")


@click.command("tune")
@_common
@click.option("--policies", default="all", show_default=True,
              help="Comma-separated policies to tune, or 'all' (every policy in the trace).")
@click.option("--k", "k_values", default="1,2,3,4,5,6,8,10,12", show_default=True,
              help="Draft lengths to sweep (comma-separated).")
@click.option("--k-policy", type=click.Choice(("fixed", "oracle")), default="fixed",
              show_default=True, help="fixed k per configuration, or the oracle bound.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes (default: all cores).")
@click.option("--holdout", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=None,
              help="Hold out FRACTION of the prompts (seeded by --seed): pick (k*, s*) by "
                   "simulating the rest, report the held-out part's throughput there and the "
                   "optimism of tuning on it directly.")
@click.option("--objective", default="throughput", show_default=True,
              metavar="METRIC",
              help="What the pick optimises: throughput (tokens/s over the whole run, higher "
                   "is better) or a latency percentile, lower is better: tpot-p50, tpot-p90, "
                   "tpot-p99 (time per output token after the first), ttft-p50 … ttft-p99 "
                   "(time to first token), latency-p50 … latency-p99 (a request's whole "
                   "time). Latencies include queueing: give --arrivals poisson:RATE for a "
                   "served load.")
@click.option("--slo", default=None, metavar="METRIC=TIME,…",
              help="Bounds every pick must meet, e.g. tpot-p99=50ms,ttft-p99=2s (units us, "
                   "ms, s). No setting meeting them: the closest is named, exit status 3.")
@click.option("--batches", default=None, metavar="B,B,…",
              help="Largest batch sizes (concurrency) to sweep as part of the setting, e.g. "
                   "8,16,32,64 (default: --max-batch alone).")
@click.option("--dashboard", "dashboard_path", type=click.Path(dir_okay=False), default=None,
              metavar="FILE.html",
              help="Also write the throughput-latency trade-off of every simulated setting "
                   "as an interactive page (a control picks the latency percentile).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
              metavar="[ADDRESS]",
              help="Run the sweep on Ray (same rows as the local processes). Alone or 'local': "
                   "a private instance on 127.0.0.1 with --workers CPUs (default: all); "
                   "'auto' or ray://HOST:PORT: that cluster, at most --workers tasks at a "
                   'time when given. Needs pip install "specsim[ray]".')
def tune_cmd(trace_path, fmt, arrivals, prompt_tokens, output_tokens, model, hardware, tp,
             max_batch, prefill_chunk, acceptance, seed, costs_choice, profile_path,
             as_json, policies,
             k_values, k_policy, workers,
             holdout, objective, slo, batches, dashboard_path, ray_address):
    """Tune (policy, s, k) by simulation: sweep the grid (every s the trace recorded), in
    parallel, and report the optimum, the runner-up, the sensitivity, Vegas' 3-step result
    beside the joint optimum, and the analytical prediction beside the simulated one with the
    gap split into batching, decode dynamics, and prefill + queueing.

    \b
    specsim tune --trace T.jsonl --k 2,4,6 --workers 8
    specsim tune --trace T.jsonl --ray                      # a local Ray instance, all cores
    specsim tune --trace T.jsonl --ray ray://head:10001     # an existing Ray cluster
    specsim tune --arrivals poisson:4 --batches 8,16,32 --objective throughput \\
        --slo tpot-p99=30ms                                 # the fastest setting within an SLO

    The pick ranks every simulated setting, plain decoding included, by --objective among
    those meeting --slo; the trade-off table lists the settings no other beats on both
    throughput and the objective's latency (tpot-p99 for throughput). The per-policy grid
    below it is at the pick's batch size. With --ray each row of --json names the Ray worker
    (node id, pid) that computed it.
    """
    from specsim.simulator.objectives import parse_objective, parse_slos
    try:
        goal, slos = parse_objective(objective), parse_slos(slo)
    except SpecsimError as exc:
        raise click.BadParameter(str(exc), param_hint="--slo" if "SLO" in str(exc) or
                                 "duration" in str(exc) else "--objective") from None
    batch_sizes = _int_list(batches, "--batches") if batches else [max_batch]
    profile = None
    if profile_path is not None:      # refused here in one line, not in every worker
        from specsim.costs.engine_profile import read_profile
        profile = read_profile(profile_path)
    if dashboard_path is not None:
        from specsim.cli.files import check_outputs
        check_outputs({"--dashboard": dashboard_path}, [trace_path])
    if ray_address is not None:
        from specsim.simulator.ray_sweep import import_ray
        import_ray()
    from specsim.simulator.tuning import SweepSpec, at_batch, summarise, sweep
    from specsim.traces.importers import load_trace

    path = trace_input(trace_path) or _trace_path(None)
    trace = load_trace(path, None if fmt == "auto" else fmt,
                       per_draft=k_policy == "adaptive")
    groups = trace.groups()
    model = defaults.model_for(model, trace.header)[0]
    available = sorted({p for p, s in groups if s is not None})
    if not available:
        raise SpecsimError(f"{trace.path or path}: the trace has no sparse groups (every "
                           f"record has s = null, a drafter that is not sparse, as in a "
                           f"Spec-Bench file); tune sweeps (policy, s) groups with s recorded")
    chosen = available if policies == "all" else [p.strip() for p in policies.split(",")]
    missing = [p for p in chosen if p not in available]
    if missing:
        raise SpecsimError(f"the trace has no sparse groups for {', '.join(missing)}; it has "
                           f"{', '.join(available) or 'none'}")
    ks = _int_list(k_values, "--k")
    spec = SweepSpec(os.path.abspath(path), model, hardware, tp,
                     parse_arrivals(arrivals, prompt_tokens, output_tokens, seed), max_batch,
                     acceptance, k_policy, seed, None if fmt == "auto" else fmt,
                     costs=costs_choice, prefill_chunk=prefill_chunk,
                     engine_profile=os.path.abspath(profile_path) if profile_path else None)
    if ray_address is not None:
        # one Ray for every sweep of the command, shut down when the command ends
        from specsim.simulator.ray_sweep import ray_session
        click.get_current_context().with_resource(ray_session(ray_address, workers))
    n_configs = len(batch_sizes) * (
        1 + sum(len([s for (p, s) in groups if p == pol]) for pol in chosen) * len(ks))
    with click.progressbar(length=n_configs, label="simulating", file=sys.stderr,
                           show_eta=True) as bar:
        try:
            everything = sweep(spec, chosen, ks, workers, progress=bar.update,
                               ray_address=ray_address, batches=batch_sizes)
        except ValueError as exc:
            raise SpecsimError(str(exc)) from None
    picked = _objective_report(everything, goal, slos)
    focus = (picked["best"] or picked["closest"])["max_batch"]
    swept = at_batch(everything, focus)
    from specsim.costs import resolve_cost_source
    from specsim.specs import load_hardware, load_model
    cost_source = resolve_cost_source(load_model(model), load_hardware(hardware), tp,
                                      costs_choice)
    analytical = _analytical_beside(trace, focus, swept, cost_source.cost_model)
    report = summarise(swept, analytical)
    report["objective"] = picked
    report["costs"], report["cost_validation"] = cost_source.note, cost_source.validated
    if profile is not None:
        from specsim.costs.engine_profile import profile_note
        report["costs"] += "; " + profile_note(profile, load_model(model))
    report["workers"] = swept["workers"]
    if "ray" in swept:
        report["ray"] = swept["ray"]
    if holdout is not None:
        from dataclasses import replace

        from specsim.simulator.tuning import holdout_summary
        parts = {}
        with click.progressbar(length=2 * n_configs, label="held-out tuning",
                               file=sys.stderr, show_eta=True) as bar:
            for part in ("tune", "eval"):
                try:
                    parts[part] = sweep(replace(spec, part=part, holdout=holdout,
                                                holdout_seed=seed, max_batch=focus), chosen,
                                        ks, workers, progress=bar.update,
                                        ray_address=ray_address)
                except ValueError as exc:
                    raise SpecsimError(str(exc)) from None
        report["holdout"] = holdout_summary(parts["tune"], parts["eval"]) | {
            "holdout_fraction": holdout, "seed": seed}
    if dashboard_path is not None:
        from specsim.dashboards.page import render_page
        from specsim.dashboards.tuning import tune_page
        from specsim.atomic import write_text_atomic
        facts = [("trace", os.path.basename(path)), ("model", model),
                 ("hardware", hardware), ("arrivals", arrivals),
                 ("objective", picked["objective"] + (f" within {', '.join(picked['slos'])}"
                                                      if picked["slos"] else ""))]
        page = tune_page(everything["plains"] + everything["rows"], picked, slos, facts,
                         [f"costs: {report['costs']}", f"trust: {report['cost_validation']}"])
        write_text_atomic(dashboard_path, render_page(page))
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_tune(report, trace.synthetic)
        if dashboard_path is not None:
            echo(f"trade-off page written to {dashboard_path}")
    if picked["best"] is None:
        sys.exit(3)


def _int_list(text: str, option: str) -> list[int]:
    """Comma-separated integers ≥ 1, sorted and distinct (``parse_ints``); a bad value is a
    usage error naming the option."""
    try:
        return parse_ints(text, option)
    except SpecsimError as exc:
        raise click.BadParameter(str(exc).removeprefix(f"{option}: "),
                                 param_hint=option) from None


def _objective_report(swept: dict, goal, slos) -> dict:
    """The pick under the objective and SLOs among every setting (plain decoding included),
    and the throughput–latency trade-off (the Pareto front on the objective's latency, or
    tpot-p99 for throughput)."""
    from specsim.simulator.objectives import LATENCY_METRICS, pareto_front, pick
    settings = swept["plains"] + swept["rows"]
    out = pick(settings, goal, slos)
    latency = "tpot-p99" if goal.maximise else goal.name
    out["tradeoff_metric"] = latency
    out["tradeoff"] = pareto_front(settings, LATENCY_METRICS[latency])
    return out


def _analytical_beside(trace, max_batch, swept, costs) -> dict:
    """The analytical speedup at each policy's simulated optimum, at the maximum batch and at
    the simulation's mean batch, priced by ``costs``."""
    from specsim import predict as P

    groups = trace.groups()
    out = {}
    best_rows: dict = {}
    for r in swept["rows"]:
        if r["policy"] not in best_rows or r["throughput"] > best_rows[r["policy"]]["throughput"]:
            best_rows[r["policy"]] = r
    for policy, r in best_rows.items():
        group = groups[(policy, r["s"])]
        values = {}
        for label, batch in (("speedup", max_batch),
                             ("speedup_at_sim_batch", max(1, round(r["mean_batch"])))):
            opts = P.PredictOptions(batch=batch, n_boot=50, k_max=max(r["k"], 1))
            contexts, source = P.workload_contexts(trace, opts, [])
            g = P.predict_group(group, costs, opts, [], contexts, source)
            values[label] = g.at(r["k"]).speedup
        out[(policy, r["s"])] = values
    return out


def _print_tune(report: dict, synthetic: bool) -> None:
    from specsim.cli.main import _table
    echo(f"costs: {report['costs']}")
    echo(f"trust: {report['cost_validation']}")
    _print_objective(report["objective"], _table)
    _print_tune_grid(report, synthetic, _table)
    if "holdout" in report:
        h = report["holdout"]
        echo(f"held-out tuning (fraction {h['holdout_fraction']:g}, seed {h['seed']}):")
        rows = [[p["policy"], f"k={p['tuned']['k']} s={p['tuned']['s']:g}",
                 f"{p['speedup_on_tuning_part']:.3f}×", f"{p['speedup_on_evaluation_part']:.3f}×",
                 f"k={p['tuned_on_evaluation']['k']} s={p['tuned_on_evaluation']['s']:g} "
                 f"{p['tuned_on_evaluation']['speedup']:.3f}×", f"{p['optimism']:+.3f}"]
                for p in h["policies"]]
        echo(_table(["policy", "tuned on tuning part", "there", "on evaluation part",
                           "tuned on evaluation", "optimism"], rows, "llrrlr"))
    if "ray" in report:
        ray = report["ray"]
        echo(f"computed on {ray['workers']} Ray workers on {ray['nodes']} "
             f"node{'s' if ray['nodes'] != 1 else ''} ({ray['address']})")


def _print_objective(picked: dict, _table) -> None:
    from specsim.simulator.objectives import format_seconds as t
    from specsim.simulator.objectives import setting_label
    bounds = f" within {', '.join(picked['slos'])}" if picked["slos"] else ""
    best = picked["best"]
    head = f"objective: {picked['objective']}{bounds}: "
    if best is None:
        close = picked["closest"]
        echo(head + f"no setting of {picked['settings']} meets the bounds; the closest: "
             f"{setting_label(close)} (TPOT p99 {t(close['tpot_p99_s'])}, TTFT p99 "
             f"{t(close['ttft_p99_s'])})")
    else:
        echo(head + f"{setting_label(best)}: {best['throughput']:.0f} tokens/s, TPOT p50 "
             f"{t(best['tpot_p50_s'])} p99 {t(best['tpot_p99_s'])}, TTFT p99 "
             f"{t(best['ttft_p99_s'])} ({picked['feasible']} of {picked['settings']} "
             f"settings meet the bounds)")
    rows = [[setting_label(r), f"{r['throughput']:.0f}", t(r["tpot_p50_s"]),
             t(r["tpot_p99_s"]), t(r["ttft_p99_s"])] for r in picked["tradeoff"]]
    echo(f"throughput against {picked['tradeoff_metric']}: the settings no other beats on both")
    echo(_table(["setting", "tokens/s", "TPOT p50", "TPOT p99", "TTFT p99"], rows, "lrrrr"))


def _print_tune_grid(report: dict, synthetic: bool, _table) -> None:
    plain = report["plain"]
    echo(f"at batch ≤ {plain['max_batch']}: plain decoding {plain['throughput']:.0f} tokens/s"
               + ("   [SYNTHETIC trace]" if synthetic else ""))
    rows = []
    for p in report["policies"]:
        step = p.get("three_step")
        ana = p.get("analytical") or {}
        rows.append([p["policy"], p["k_star"], f"{p['s_star']:g}", f"{p['speedup']:.3f}×",
                     f"k={step['k']} s={step['s']:g} {step['speedup']:.3f}×" if step else "-",
                     f"{ana.get('analytical_speedup', float('nan')):.3f}×",
                     f"{ana.get('simulated_decode_speedup', float('nan')):.3f}×"])
    echo(_table(["policy", "k*", "s*", "simulated", "Vegas 3-step", "analytical",
                       "sim decode-only"], rows, "lrrrlrr"))
    best, runner = report["best"], report["runner_up"]
    echo(f"optimum: {best['policy']} s={best['s']:g} k={best['k']}: "
               f"{best['throughput']:.0f} tokens/s ({best['speedup']:.3f}×)")
    if runner:
        echo(f"runner-up: {runner['policy']} s={runner['s']:g} k={runner['k']}: "
                   f"{runner['throughput']:.0f} tokens/s ({runner['speedup']:.3f}×)")
    for p in report["policies"]:
        sens = ", ".join(f"{label} ({v['k']}, {v['s']:g}) {v['change'] * 100:+.1f}%"
                         for label, v in p["sensitivity"].items())
        echo(f"sensitivity {p['policy']}: {sens}")
        ana = p.get("analytical")
        if ana:
            f = ana["factors"]
            echo("  simulated/analytical = " + " × ".join(
                f"{v:.3f} ({name})" for name, v in f.items()))
