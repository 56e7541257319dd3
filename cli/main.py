"""The `specsim` command line (click). Installed as ``specsim.cli``; entry point :func:`main`.

Every command prints human tables by default and machine-readable JSON with ``--json``. Bad
input ends with one line on stderr and a non-zero exit, never a traceback (set SPECSIM_DEBUG=1
to see one).
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, replace

import click

from specsim.cli import defaults
from specsim.cli.files import check_outputs, load_trace_arg, stream_name
from specsim.cli.terminal import echo, error_line, printable
from specsim.errors import SpecsimError
from specsim.deploy import FORMATS as EMIT_FORMATS
from specsim.report import HardwareSummary, ModelSummary, PredictReport, WhatIfReport


def _emit_json(obj) -> None:
    """``obj`` as indented JSON on stdout: a report's ``to_json()``, or plain JSON values
    (numpy scalars and arrays allowed)."""
    from specsim.report import to_json_value
    if hasattr(obj, "to_json"):
        obj = obj.to_json()
    click.echo(json.dumps(to_json_value(obj), indent=2))


def _float_list(text: str) -> list[float]:
    try:
        return [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got '{text}'") from None


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.1f} TiB"


def _table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    cells = [[printable(c, one_line=True) for c in headers]] + [
        [printable(c, one_line=True) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    align = align or ("l" + "r" * (len(headers) - 1))
    lines = []
    for j, row in enumerate(cells):
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)]
        lines.append("  ".join(parts).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="specsim")
def cli():
    """specsim: how fast will sparse-attention self-speculative decoding run on your model,
    GPU and workload, and which draft length k and sparsity s should you pick?

    \b
    Start with:
      specsim predict        # shipped SmolLM2-135M trace, costed for SmolLM2-135M on an H200
                             # with the shipped calibration, batch 32
      specsim predict --trace my.jsonl --model llama-3.1-8b --hardware h100-sxm --batch 16
      specsim predict --alpha 0.7 --gamma 0.1          # SparseSpec-L what-if
      specsim dashboard      # the same as an interactive HTML page
      specsim costs --model qwen3-8b --hardware h200 --batch 4 --context 32768
      specsim models / specsim hardware    # what the catalogue knows
    """


# --------------------------------------------------------------------------------------------
# predict
# --------------------------------------------------------------------------------------------


@cli.command()
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False),
              help=defaults.TRACE_HELP)
@click.option("--format", "fmt", type=click.Choice(defaults.FORMATS), default="auto",
              show_default=True, help="Trace format; 'auto' detects it from the content.")
@click.option("--model", default=None, help=defaults.MODEL_HELP)
@click.option("--hardware", default=defaults.HARDWARE, show_default=True,
              help=defaults.HARDWARE_HELP)
@click.option("--batch", type=click.IntRange(min=1), default=defaults.BATCH, show_default=True,
              help="Sequences decoded together. Self-speculation with a sparse draft pays off "
                   "when KV reads dominate: large batch × long context.")
@click.option("--context", type=click.IntRange(min=1), default=None,
              help="Context length (tokens) of every sequence. Default: the batch follows the "
                   "trace's recorded context lengths (quantiles, ragged, never the mean).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor-parallel GPUs (per-GPU share of weights/KV plus all-reduce).")
@click.option("--k-max", type=click.IntRange(1, defaults.K_MAX), default=None,
              help="Largest draft length k to evaluate. Default: the trace's recorded k "
                   "(or 16 for --alpha). Beyond what the trace measured, acceptance is "
                   "extrapolated by a fitted per-position model and flagged.")
@click.option("--policy", default=None,
              help="Selection policy to cost trace groups with (for traces whose drafter "
                   "specsim does not model, e.g. imported from vLLM).")
@click.option("--sparsity", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="Sparsity s (selected KV / context) for trace groups recorded without one.")
@click.option("--drafter", "drafter_text", default=None,
              help="Drafter of trace groups whose trace does not record one: KIND[:NAME], "
                   "KIND one of sparse-self, eagle, mtp, medusa, draft-model, ngram (NAME: a "
                   "head in models/drafters/ or a config.json; draft-model: a catalogue model). "
                   "A drafter the trace records (Spec-Bench eagle/medusa/hydra/pld/lookahead "
                   "files) is used as recorded; --drafter of the same kind names its head.")
@click.option("--engine-profile", "profile_path", type=click.Path(dir_okay=False), default=None,
              help="An engine profile (`specsim calibrate --from-server`): the costs adjusted "
                   "to the vLLM or SGLang deployment it was fitted on (plain steps, draft "
                   "steps, verify passes and the fixed cost per iteration).")
@click.option("--tree-tokens", type=click.IntRange(min=2), default=None,
              help="Tokens of the drafter's verify tree (Medusa, EAGLE trees): each iteration "
                   "verifies this many tokens. Default: a chain of k + 1.")
@click.option("--vanilla", "vanilla_path", type=click.Path(dir_okay=False), default=None,
              help="Spec-Bench answer file of the plain (vanilla) run beside --trace's: the "
                   "measured speedup is the ratio of the two files' tokens per wall second.")
@click.option("--recorded-on", default=None,
              help="GPU the Spec-Bench run was timed on (the files do not say); its measured "
                   "numbers are compared with the prediction only on that --hardware.")
@click.option("--bootstrap", "n_boot", type=click.IntRange(min=50), default=defaults.BOOTSTRAP,
              show_default=True, help="Bootstrap replicates (resampling requests) for the CIs.")
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@click.option("--alpha", type=click.FloatRange(0, 1), default=None,
              help="What-if: SparseSpec-L acceptance rate α = E[m/k] (with --gamma).")
@click.option("--accept-rates", default=None,
              help="What-if: conditional per-position acceptance p1,p2,… (with --gamma).")
@click.option("--gamma", type=float, default=None,
              help="What-if: γ = C_d / C_v, cost of one draft step over one verify pass "
                   "(a verify pass is taken to cost one plain step).")
@click.option("--costs", "costs_choice", default="auto", show_default=True,
              help=defaults.COSTS_HELP)
@click.option("--holdout", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=None,
              help="Also tune on part of the prompts and report on the rest: FRACTION of the "
                   "prompts (seeded by --seed) is held out for evaluation; reports the speedup "
                   "there at the (k*, s*) picked on the tuning part, and the optimism of "
                   "tuning on the evaluation part itself.")
@click.option("--output-tokens", type=click.IntRange(min=2), default=None,
              help="Answers of N tokens: an answer's last iteration accepts drafts past its "
                   "end that are never emitted, so short answers gain less from long drafts "
                   "(expected iterations of a finite answer from the trace's acceptance). "
                   "Default: unbounded answers.")
@click.option("--emit", "emit_format", type=click.Choice(EMIT_FORMATS), default=None,
              help="Also print what to deploy for the best setting: 'vllm' (the "
                   "--speculative-config and engine arguments, as a `vllm serve` command; "
                   "sparse policies need the Vegas fork), 'sglang' (what carries over; stock "
                   "SGLang has no sparse self-speculation) or 'schedule' (k* per batch × "
                   "context, and vLLM's num_speculative_tokens_per_batch_size). With --json: "
                   "the 'emit' key.")
@click.option("--schedule-batches", default="1,4,16,64", show_default=True,
              help="Batch sizes (rows) of --emit schedule.")
@click.option("--schedule-contexts", default="4K,16K,64K", show_default=True,
              help="Context lengths (columns) of --emit schedule; K = ×1024.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def predict(trace_path, fmt, model, hardware, batch, context, tp, k_max, policy, sparsity,
            drafter_text, profile_path, tree_tokens, vanilla_path, recorded_on, n_boot, seed,
            alpha, accept_rates, gamma, costs_choice, holdout, output_tokens,
            emit_format, schedule_batches, schedule_contexts, as_json):
    """Predict the speedup of sparse self-speculative decoding over plain decoding.

    \b
    With a trace: what the trace itself shows (tokens per iteration, conditional per-position
    acceptance p_i and survivals P_i, per policy and s), then the speedup S(k, s) =
    E[m+1]·T_ar / T(k, s) over k and the recorded s values, k*, s*, 95% confidence
    intervals (bootstrap over requests), the iteration-time split (draft / verify / selection
    / other, ms) and which numbers are extrapolated. Costs come from the calibration shipped
    for MODEL on HARDWARE where there is one (GPU measurements), else from the operator table
    shipped for HARDWARE (the GPU's measured operators composed for MODEL), else from another
    GPU's operator table scaled to HARDWARE (flagged SCALED: a prior), else from the
    roofline model; the `costs` line says which priced it and the `trust` line what the
    validation runs say of it; --costs chooses.

    Without arguments: the shipped SmolLM2-135M trace, costed for SmolLM2-135M on an H200.

    \b
    What to deploy for the best (policy, s, k), pinned to vLLM 0.34.0 and SGLang 0.5.23:
      specsim predict --model qwen3-8b --batch 16 --context 32768 --emit vllm
        → vllm serve Qwen/Qwen3-8B --speculative-config '{"method": "sparse_attn",
          "num_speculative_tokens": K, ...}' --tensor-parallel-size 1 --max-num-seqs 16 ...
      specsim predict --emit schedule --schedule-batches 1,8,32 --schedule-contexts 8K,32K

    \b
    What-ifs without a trace or hardware:
      --alpha A --gamma G          S = (αk + 1)/(kγ + 1)            (SparseSpec-L Eq. 1)
      --accept-rates p1,p2 --gamma G  S = (1 + Σ_{i≤k} P_i)/(kγ + 1)
    """
    from specsim import predict as P

    if alpha is not None or accept_rates is not None:
        if emit_format:
            raise click.UsageError("--emit needs a trace prediction, not a what-if")
        if trace_path:
            raise click.UsageError("give either --trace or a what-if (--alpha/--accept-rates)")
        if gamma is None:
            raise click.UsageError("a what-if needs --gamma (C_d / C_v)")
        if alpha is not None and accept_rates is not None:
            raise click.UsageError("give --alpha or --accept-rates, not both")
        try:
            report = (P.what_if_alpha(alpha, gamma, k_max or 16) if alpha is not None
                      else P.what_if_rates(_float_list(accept_rates), gamma))
        except ValueError as exc:
            raise SpecsimError(str(exc)) from None
        return _emit_json(report) if as_json else _print_what_if(report)
    if gamma is not None:
        raise click.UsageError("--gamma belongs to a what-if: add --alpha or --accept-rates")

    from specsim.costs import resolve_cost_source
    from specsim.specs import load_hardware, load_model

    trace = load_trace_arg(trace_path, fmt, per_draft=False)
    model_name, model_reason = defaults.model_for(model, trace.header)
    spec = load_model(model_name)
    hw = load_hardware(hardware)
    if policy is not None:
        from specsim.policies import get_policy
        get_policy(policy)
    try:
        source = resolve_cost_source(spec, hw, tp, costs_choice)
    except ValueError as exc:
        raise SpecsimError(str(exc)) from None
    costs = source.cost_model
    drafter = None
    if drafter_text is not None or tree_tokens is not None:
        from specsim.drafters import parse_drafter, recorded_drafter
        if drafter_text is None:
            recorded = recorded_drafter("", trace.header)
            if recorded is None:
                raise click.UsageError("--tree-tokens needs --drafter (the trace records none)")
            drafter_text = recorded.kind
        drafter = parse_drafter(drafter_text, tree_tokens=tree_tokens)
        policies = sorted({p for p, _ in trace.groups()})
        given = P.PredictOptions(drafter=drafter)
        if drafter.kind != "sparse-self" and policies and all(
                P.group_drafter(p, trace.header, given) is None for p in policies):
            raise SpecsimError(f"--drafter {drafter.label}: every group of this trace records "
                               f"sparse self-speculation ({', '.join(policies)}), whose "
                               f"acceptance is not {drafter.kind}'s; give a trace recorded "
                               f"with that drafter")
    profile, cost_note = None, source.note
    if profile_path is not None:
        from specsim.costs.engine_profile import profile_note, read_profile
        profile = read_profile(profile_path)
        cost_note = f"{source.note}; {profile_note(profile, spec)}"
    opts = P.PredictOptions(batch=batch, context=context, k_max=k_max, n_boot=n_boot, seed=seed,
                            policy=policy, sparsity=sparsity, output_tokens=output_tokens,
                            drafter=drafter, engine_profile=profile)
    report = P.predict_trace(trace, costs, opts)
    if holdout is not None:
        try:
            report = replace(report, holdout=P.holdout_report(trace, costs, opts, holdout, seed))
        except ValueError as exc:
            raise SpecsimError(str(exc)) from None
    report = P.describe_setting(report, spec, hw, tp, cost_note, source.validated,
                                costs=costs, trace_header=trace.header,
                                model_reason=model_reason)
    if vanilla_path is not None or recorded_on is not None or trace.header.get("measured"):
        from specsim.traces.importers.specbench import wall_totals
        vanilla = None
        if vanilla_path is not None:
            vanilla = wall_totals(vanilla_path)
            if vanilla is None:
                raise SpecsimError(f"{vanilla_path}: no new_tokens/wall_time to time the "
                                   f"vanilla run by")
        try:
            report = P.measured_beside(report, trace.header, hw,
                                       load_hardware(recorded_on) if recorded_on else None,
                                       vanilla)
        except ValueError as exc:
            raise SpecsimError(str(exc)) from None
    if emit_format is None:
        return _emit_json(report) if as_json else _print_predict(report)
    emitted = _deployment(emit_format, report, spec, tp, output_tokens, trace, costs, opts,
                          schedule_batches, schedule_contexts)
    if as_json:
        return _emit_json({**report.to_json(), "emit": emitted.to_json()})
    _print_predict(report)
    echo("")
    _print_deployment(emitted)


def _deployment(emit_format, report, spec, tp, output_tokens, trace, costs, opts,
                schedule_batches, schedule_contexts):
    """What ``--emit`` prints for the report's best setting (:mod:`specsim.deploy`)."""
    from specsim import deploy as D

    setting = D.setting_of(report, spec, tp, output_tokens)
    if emit_format == "vllm":
        return D.emit_vllm(setting, spec, output_tokens)
    if emit_format == "sglang":
        return D.emit_sglang(setting, spec, output_tokens)
    return D.emit_schedule(report, trace, costs, opts, setting,
                           D.grid(schedule_batches, "--schedule-batches"),
                           D.grid(schedule_contexts, "--schedule-contexts"))


def _print_deployment(e) -> None:
    if e.format == "vllm":
        s = e.setting
        what = (f"{s.drafter}" + (f" ({s.draft_name})" if s.draft_name else "")
                if s.drafter else f"{s.policy}, s = {s.s:g}")
        echo(f"Deploy with vLLM {e.vllm_version}{' (Vegas fork)' if e.needs_vegas_fork else ''}"
             f": {what}, k = {s.k}, batch {s.batch}, tp {s.tp}:")
        if not e.fork_has_algorithm:
            echo("NOT deployable as printed (the fork lacks this algorithm; see the note):")
        echo(e.command if e.fork_has_algorithm else f"# {e.command}")
    elif e.format == "sglang" and e.deployable:
        s = e.setting
        echo(f"Deploy with SGLang {e.sglang_version}: {s.drafter}, k = {s.k}, batch {s.batch}, "
             f"tp {s.tp}:")
        echo(e.command)
    elif e.format == "sglang":
        echo(f"SGLang {e.sglang_version}: NOT deployable: {e.reason}")
    else:
        echo(f"k schedule for {e.policy}, s = {_s(e.s)} (costed as {e.costed_as['policy']}, "
             f"s = {_s(e.costed_as['s'])}): k* per batch (rows) × context (columns), "
             f"as predict --batch B --context C prices it:")
        rows = [[b] + row for b, row in zip(e.batches, e.k_table)]
        echo(_table(["batch \\ context"] + [str(c) for c in e.contexts], rows))
        echo(f"vLLM {e.vllm_version} (batch only): num_speculative_tokens_per_batch_size = "
             f"{json.dumps(e.vllm_num_speculative_tokens_per_batch_size)}, "
             f"num_speculative_tokens = {e.vllm_num_speculative_tokens}")
        echo(f"  --speculative-config '{json.dumps(e.vllm_speculative_config)}'")
    for note in e.notes:
        echo(f"note: {note}")


def _print_what_if(r: WhatIfReport) -> None:
    if r.mode == "alpha":
        echo(f"SparseSpec-L what-if: α = {r.alpha}, γ = C_d/C_v = {r.gamma}")
        echo("S(k) = (αk + 1)/(kγ + 1); dS/dk = (α − γ)/(kγ + 1)²: longer drafts "
                   + ("help (α > γ)" if r.longer_drafts_help else "hurt (α ≤ γ)"))
    else:
        echo(f"Per-position what-if: γ = C_d/C_v = {r.gamma}; "
                   f"S(k) = (1 + Σ_{{i≤k}} P_i)/(kγ + 1)")
    rows = [[c.k, f"{c.expected_tokens:.3f}", f"{c.speedup:.3f}×"
             + ("  ← k*" if c.k == r.k_star else "")] for c in r.curve]
    echo(_table(["k", "E[m+1]", "speedup"], rows, "rrl"))
    echo(f"k* = {r.k_star}, speedup {r.speedup_at_k_star:.3f}×")


def _print_predict(r: PredictReport) -> None:
    m, hw = r.model, r.hardware
    echo(f"trace     {r.trace}" + ("   [SYNTHETIC]" if r.synthetic else ""))
    echo(f"model     {m.name}: {m.params / 1e9:.2f} B params"
               + (f" ({m.active_params / 1e9:.2f} B active)" if m.active_params != m.params
                  else "")
               + f", KV {_fmt_bytes(m.kv_bytes_per_token)}/token")
    echo(f"hardware  {hw.name}: {hw.bandwidth_TBps:.2f} TB/s, "
               f"{hw.bf16_TFLOPs:.0f} TFLOP/s bf16 ({hw.ceilings} ceilings); "
               f"batch {r.batch}, tp {r.tp}")
    echo(f"costs     {r.costs}")
    for g in r.groups:
        c = g.costed_as
        if c.drafter is not None:
            echo(f"drafter   {g.policy}: {c.drafter} ({c.drafter_origin}), draft step priced by "
                 f"{c.draft_priced_by}" + (f", tree of {c.tree_tokens} tokens"
                                           if c.tree_tokens else "") + f"; replay: {c.replay}")
    if r.cost_validation:
        echo(f"trust     {r.cost_validation}")
    if r.measured is not None:
        mm = r.measured
        echo(f"measured  {mm.tokens_per_s:.1f} tokens/s over {mm.wall_time_s:.2f} s"
             + (f", vanilla {mm.vanilla_tokens_per_s:.1f} tokens/s: {mm.speedup:.2f}×"
                if mm.speedup is not None else "")
             + f"; predicted {mm.predicted_speedup_at_k_recorded:.2f}× at k = {mm.k_recorded}"
             + f" ({mm.note})")
    if r.groups:
        echo(f"context   {_ctx_line(r.groups[0].contexts, r.groups[0].context_source)}")
    echo("")
    echo("What the trace shows (p_i conditional acceptance, P_i survival):")
    shown = min(ACCEPTANCE_COLUMNS, max(g.k_recorded for g in r.groups))
    same_k = len({min(g.k_recorded, shown) for g in r.groups}) == 1
    rows = []
    for g in r.groups:
        pos = g.positions[:min(g.k_recorded, shown)] or g.positions[:1]
        ps = " ".join("  - " if p.p is None else f"{p.p:.2f}" for p in pos)
        rows.append([g.policy, _s(g.s), g.requests, g.iterations, g.k_recorded,
                     f"{g.observed_tokens_per_iteration:.2f}", f"{g.observed_alpha:.2f}",
                     ps, f"{pos[-1].P:.2f}"])
    p_header = "p_1" if shown == 1 else f"p_1 … p_{shown}"
    echo(_table(["policy", "s", "requests", "iterations", "k_rec", "tokens/iter", "α",
                 p_header, f"P_{shown}" if same_k else "P at k_rec"], rows, "lrrrrrrlr"))
    echo("")
    level = int(round(r.confidence_level * 100))
    echo(f"Predicted speedup over plain decoding ({level}% CI: bootstrap over requests, "
               f"{r.bootstrap} replicates):")
    rows = []
    for g in r.groups:
        split = g.cost_split_at_k_star
        ci = g.speedup_at_k_star_ci
        rows.append([g.policy, _s(g.s), g.k_star, f"{g.k_star_ci.low}–{g.k_star_ci.high}",
                     f"{g.speedup_at_k_star:.2f}× [{ci.low:.2f}, {ci.high:.2f}]",
                     f"{g.plain_step_ms:.2f}",
                     " / ".join(f"{x * 1e3:.2f}" for x in
                                (split.draft, split.verify, split.selection, split.other))])
    echo(_table(["policy", "s", "k*", "k* CI", "speedup at k* [CI]", "T_ar ms",
                       "T(k*) split ms: draft / verify / sel / other"], rows, "lrrrrrl"))
    echo("")
    best = r.best
    echo(f"Speedup over k for the best group ({best.policy}, s = {_s(best.s)}); "
               f"* = extrapolated beyond the measured positions:")
    rows = [[c.k, f"{c.expected_tokens:.2f}", f"{c.speedup:.3f}",
             f"[{c.speedup_ci.low:.3f}, {c.speedup_ci.high:.3f}]", f"{c.iteration_ms:.2f}",
             ("yes" if c.extend_helps else "no") if c.extend_helps is not None else "",
             "*" if c.extrapolated else ""] for c in r.best_group().curve]
    echo(_table(["k", "E[m+1]", "speedup", "CI", "T(k) ms", "k+1 helps", ""], rows))
    echo("")
    echo("Per policy, tuned on the recorded s values (joint grid optimum vs Vegas 3-step):")
    rows = []
    for p in r.policies:
        step = p.three_step
        rows.append([p.policy, p.k_star, _s(p.s_star), f"{p.speedup:.3f}×",
                     f"k={step.k}, s={_s(step.s)}, {step.speedup:.3f}× "
                     f"({_percent(-step.gap_to_joint, signed=True)})" if step
                     else "needs ≥ 2 s values"])
    echo(_table(["policy", "k*", "s*", "speedup", "3-step result"], rows, "lrrrl"))
    if "quest" in r.policy_names and r.cost_model == "calibrated":
        echo("(quest: measured on specsim's engine, whose fused page selection scores "
                   "every page of the cache at every draft step — 1.4–1.7× a Vegas draft step "
                   "on the H200 (Qwen3-8B batch 4 at 32K, SmolLM2 batch 32 at 4K). README, "
                   "BENCHMARKS.md.)")
    echo("")
    d = best.distinguishable_from_runner_up
    line = (f"Best: {best.policy} at s = {_s(best.s)}, k = {best.k}: "
            f"{best.speedup:.2f}× [{best.speedup_ci.low:.2f}, {best.speedup_ci.high:.2f}]")
    if d:
        ru = d.runner_up
        line += (f"; beats runner-up {ru.policy} (s = {_s(ru.s)}, k = {ru.k}, "
                 f"{ru.speedup:.2f}×) in {d.share_of_replicates_best_wins * 100:.0f}% of "
                 f"replicates: " + ("distinguishable" if d.distinguishable
                                    else "NOT distinguishable"))
    echo(line)
    if r.policy_comparison:
        echo("")
        echo("Policies at their own optima, pairwise (share of bootstrap replicates "
                   "where the first wins" + (", paired by prompt" if
                                             r.bootstrap_paired_by_prompt else "") + "):")
        rows = [[f"{c.a} vs {c.b}", f"{c.a_speedup:.3f}× vs {c.b_speedup:.3f}×",
                 f"{c.share_a_wins * 100:.1f}%", "yes" if c.distinguishable else "NO"]
                for c in r.policy_comparison]
        echo(_table(["pair", "speedups", "first wins", "distinguishable"], rows, "lrrl"))
    if r.holdout is not None:
        h = r.holdout
        echo("")
        echo(f"Held-out tuning: {h.tuning_requests} requests tune, "
                   f"{h.evaluation_requests} evaluate (fraction {h.holdout_fraction:g}, "
                   f"seed {h.seed}):")
        rows = [[p.policy, f"k={p.tuned.k} s={_s(p.tuned.s)}",
                 f"{p.speedup_on_tuning_part:.3f}×",
                 f"{p.speedup_on_evaluation_part:.3f}× [{p.speedup_ci.low:.3f}, "
                 f"{p.speedup_ci.high:.3f}]",
                 f"k={p.tuned_on_evaluation.k} s={_s(p.tuned_on_evaluation.s)} "
                 f"{p.tuned_on_evaluation.speedup:.3f}×", f"{p.optimism:+.3f}"]
                for p in h.policies]
        echo(_table(["policy", "tuned on tuning part", "there", "on evaluation part",
                           "tuned on evaluation (test)", "optimism"], rows, "llrrlr"))
    for note in r.notes:
        echo(f"note: {note}")


def _s(s) -> str:
    return "-" if s is None else f"{s:g}"


#: Draft positions the acceptance table shows (p_1 … p_8 at most).
ACCEPTANCE_COLUMNS = 8


def _percent(fraction: float, signed: bool = False) -> str:
    """``fraction`` as a percentage to 0.1%, never "-0.0%"."""
    value = round(fraction * 100, 1) + 0.0
    return f"{value:+.1f}%" if signed and value else f"{value:.1f}%"


def _ctx_line(contexts, source: str) -> str:
    """The context lengths a prediction assumed, and where they come from."""
    import numpy as np
    values = np.asarray(contexts)
    lo, hi = int(values.min()), int(values.max())
    if lo == hi:
        return f"{lo} tokens per sequence ({source})"
    return (f"{lo}–{hi} tokens per sequence, median {int(np.median(values))} "
            f"({source})")


# --------------------------------------------------------------------------------------------
# costs
# --------------------------------------------------------------------------------------------


class ContextLengths(click.ParamType):
    """``N`` or ``N1,N2,...``: whole numbers of tokens, each at least 1."""

    name = "N[,N...]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        items = [x for x in str(value).replace(" ", "").split(",") if x]
        try:
            lengths = [int(x) for x in items]
        except ValueError:
            self.fail(f"expected whole numbers of tokens separated by commas, got '{value}'",
                      param, ctx)
        if not lengths or min(lengths) < 1:
            self.fail(f"context lengths must be at least 1 token, got '{value}'", param, ctx)
        return lengths


@dataclass(frozen=True)
class OperationCost:
    """One operation of a breakdown. ``ms`` is the chosen cost source's time; the bytes and
    FLOPs are the roofline's count of what the operation moves and computes (per GPU), and
    ``floor_ms`` those bytes over the hardware's bandwidth ceiling; ``floor_fraction`` is
    ``floor_ms / ms`` (1 at the floor). ``overhead_ms`` and ``comm_ms`` (launch and all-reduce
    terms) are parts of ``ms`` only where the roofline prices it, and are omitted elsewhere."""

    ms: float
    floor_ms: float
    floor_fraction: float | None
    weight_bytes: float
    kv_bytes: float
    other_bytes: float
    bytes: float
    flops: float
    roofline_bound: str           # the roofline term that dominates: memory | compute | overhead
    notes: tuple[str, ...]        # how the source priced it
    overhead_ms: float | None = field(default=None, metadata={"omit_none": True})
    comm_ms: float | None = field(default=None, metadata={"omit_none": True})

    @classmethod
    def of(cls, cost, bandwidth: float, roofline_priced: bool) -> "OperationCost":
        ms = _ms(cost.seconds)
        floor_ms = cost.bytes / bandwidth * 1e3
        fraction = floor_ms / (cost.seconds * 1e3) if cost.seconds > 0 else None
        return cls(ms=ms, floor_ms=floor_ms, floor_fraction=fraction,
                   weight_bytes=cost.weight_bytes, kv_bytes=cost.kv_bytes,
                   other_bytes=cost.other_bytes, bytes=cost.bytes, flops=cost.flops,
                   roofline_bound=cost.bound, notes=tuple(cost.notes),
                   overhead_ms=cost.overhead_s * 1e3 if roofline_priced else None,
                   comm_ms=cost.comm_s * 1e3 if roofline_priced else None)


@dataclass(frozen=True)
class CostsReport:
    """`specsim costs`: one plain step, one draft step, one verify pass of k + 1 tokens, one
    selection and the iteration time T(k, s) for one batch, priced by the cost source that
    predict picks for the same (model, hardware, tp, --costs)."""

    model: ModelSummary
    hardware: HardwareSummary
    tp: int
    batch: int
    contexts: list[int]
    k: int
    s: float
    policy: str
    source: dict                  # kind, note, path, fallback, validated: see CostSource
    cost_validation: str          # what the shipped validation runs say of that source
    plain_step: OperationCost     # T_ar
    draft_step: OperationCost     # C_d(s)
    verify: OperationCost         # C_v(k + 1)
    selection: OperationCost      # C_sel(s), once per iteration
    iteration_ms: float           # T(k, s) = k·C_d + C_v + C_sel + other
    iteration_split_ms: dict[str, float]
    gamma: float                  # C_d / C_v
    notes: list[str]


def _ms(seconds: float) -> float:
    """Seconds as milliseconds to the nanosecond, as predict reports them."""
    return round(float(seconds) * 1e3, 6)


@cli.command()
@click.option("--model", default=defaults.FALLBACK_MODEL, show_default=True,
              help="Catalogue name (see `specsim models`), path to a Hugging Face "
                   "config.json, or a Hugging Face id (org/name) whose config is in the local "
                   "hub cache.")
@click.option("--hardware", default=defaults.HARDWARE, show_default=True,
              help=defaults.HARDWARE_HELP)
@click.option("--batch", type=click.IntRange(min=1), default=None,
              help="Sequences in the batch, all at --context. Default: 1, or as many as "
                   "--context lists.")
@click.option("--context", type=ContextLengths(), default=str(defaults.CONTEXT),
              show_default=True,
              help="Context length in tokens, or a comma-separated list of one length per "
                   "sequence (a ragged batch).")
@click.option("--k", type=click.IntRange(min=1), default=8, show_default=True,
              help="Draft length: the verify pass has k + 1 query tokens.")
@click.option("--sparsity", type=click.FloatRange(0, 1, min_open=True),
              default=defaults.SPARSITY, show_default=True,
              help="Sparsity s: selected KV entries / context length.")
@click.option("--policy", default=defaults.POLICY, show_default=True,
              help="Selection policy: vegas, sparsespec, streamingllm, quest, last-token, full.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor-parallel GPUs.")
@click.option("--costs", "costs_choice", default="auto", show_default=True,
              help=defaults.COSTS_HELP)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def costs(model, hardware, batch, context, k, sparsity, policy, tp, costs_choice, as_json):
    """Cost breakdown of one plain step (T_ar), one draft step (C_d), one verify pass (C_v)
    and one selection (C_sel), and the iteration time T(k, s), per GPU.

    The times come from the cost source predict uses for the same model, hardware, tp and
    --costs (the shipped calibration, else this GPU's operator table, else another GPU's
    scaled, else the roofline), so T_ar and
    T(k, s) equal predict's plain_step_ms and iteration_ms at that k for
    `predict --batch B --context N`. The bytes and FLOPs are the roofline's count of what each
    operation moves and computes; the floor is those bytes over the hardware's bandwidth
    ceiling (measured where the hardware spec has it, else the datasheet's), and floor/ms the
    share of the time the floor accounts for.
    """
    from specsim.costs import resolve_cost_source
    from specsim.policies import get_policy
    from specsim.shipped import display_name
    from specsim.specs import load_hardware, load_model

    contexts = list(context)
    if len(contexts) == 1:
        contexts = contexts * (batch or 1)
    elif batch is not None and batch != len(contexts):
        raise click.BadParameter(f"{batch} disagrees with the {len(contexts)} context "
                                 f"lengths given", param_hint="--batch")
    policy = get_policy(policy).name
    spec, hw = load_model(model), load_hardware(hardware)
    try:
        source = resolve_cost_source(spec, hw, tp=tp, costs=costs_choice)
        plain = source.cost_model.plain_step(contexts)
        it = source.cost_model.iteration(contexts, k, sparsity, policy)
    except ValueError as exc:
        raise SpecsimError(str(exc)) from None
    roofline_priced = source.kind == "roofline"
    op = lambda cost: OperationCost.of(cost, hw.bandwidth, roofline_priced)  # noqa: E731
    notes = []
    need = spec.memory_bytes(contexts, tp)
    if need > hw.memory_bytes:
        notes.append(f"the batch does not fit: weights + KV need {need / 1e9:.0f} GB per GPU, "
                     f"{hw.name} has {hw.memory_bytes / 1e9:.0f} GB")
    report = CostsReport(
        model=ModelSummary.of(spec), hardware=HardwareSummary.of(hw), tp=tp,
        batch=len(contexts), contexts=contexts, k=k, s=sparsity, policy=policy,
        source={"kind": source.kind, "note": source.note,
                "path": display_name(source.path) if source.path else None,
                "fallback": source.fallback, "validated": source.validated},
        cost_validation=source.validated,
        plain_step=op(plain), draft_step=op(it.draft_step), verify=op(it.verify),
        selection=op(it.selection), iteration_ms=_ms(it.seconds),
        iteration_split_ms={x: _ms(v) for x, v in it.split().items()},
        gamma=it.draft_step.seconds / it.verify.seconds, notes=notes)
    return _emit_json(report) if as_json else _print_costs(report)


def _print_costs(r: CostsReport) -> None:
    hw = r.hardware
    echo(f"{r.model.name} on {hw.name}, batch {r.batch} (contexts "
               f"{_ctx_summary(r.contexts)}), tp {r.tp}; k = {r.k}, s = {r.s:g}, {r.policy}")
    echo(f"costs     {r.source['note']}")
    echo(f"trust     {r.source['validated']}")
    roofline_priced = r.source["kind"] == "roofline"
    rows = []
    operations = (("plain step (T_ar)", r.plain_step), ("draft step (C_d)", r.draft_step),
                  (f"verify q={r.k + 1} (C_v)", r.verify), ("selection (C_sel)", r.selection))
    for label, c in operations:
        row = [label, f"{c.ms:.3f}", f"{c.floor_ms:.3f}",
               "-" if c.floor_fraction is None else f"{c.floor_fraction:.2f}",
               _fmt_bytes(c.weight_bytes), _fmt_bytes(c.kv_bytes), _fmt_bytes(c.other_bytes),
               f"{c.flops / 1e12:.3f}"]
        if roofline_priced:
            row += [f"{c.overhead_ms:.3f}", c.roofline_bound]
        rows.append(row)
    headers = ["operation", "ms", "floor ms", "floor/ms", "weights", "KV", "other", "TFLOP"]
    if roofline_priced:
        headers += ["overhead ms", "bound"]
    echo(_table(headers, rows, "lrrrrrrrrl"[:len(headers)]))
    priced_by = {"roofline": "the roofline's",
                 "calibration": "the calibration's, measured on the GPU",
                 "operators": "composed from the operator tables, measured on the GPU",
                 "scaled-operators": "composed from another GPU's operator tables, scaled to "
                                     "this one by the two GPUs' ceilings (a prior)"}.get(
        r.source["kind"], f"the {r.source['kind']} source's")
    echo(f"ms: {priced_by}. Bytes moved (weights, KV, other) and TFLOP: the roofline's "
               f"count.")
    echo(f"floor: those bytes / {hw.bandwidth_TBps:.2f} TB/s ({hw.ceilings} bandwidth "
               f"ceiling); floor/ms: the share of the time the floor accounts for.")
    split = r.iteration_split_ms
    echo(f"T(k={r.k}, s={r.s:g}) = {r.iteration_ms:.3f} ms  (draft "
               f"{split['draft']:.3f}, verify {split['verify']:.3f}, selection "
               f"{split['selection']:.3f}, other {split['other']:.3f}); γ = C_d/C_v = "
               f"{r.gamma:.3f}")
    priced = [(label, c.notes) for label, c in operations if c.notes]
    if priced:
        echo("how each is priced:")
        width = max(len(label) for label, _ in priced)
        for label, notes in priced:
            echo(f"  {label.ljust(width)}  {'; '.join(notes)}")
    for note in r.notes:
        echo(f"note: {note}")


def _ctx_summary(contexts) -> str:
    lo, hi = min(contexts), max(contexts)
    return str(lo) if lo == hi else f"{lo}–{hi}"


# --------------------------------------------------------------------------------------------
# catalogue
# --------------------------------------------------------------------------------------------


@cli.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def models(ctx, as_json):
    """List the model catalogue: parameters, KV bytes per token, attention layout.

    `specsim models fetch smollm2` installs and converts the real SmolLM2-135M-Instruct."""
    if ctx.invoked_subcommand is not None:
        return
    from specsim.specs import known_models, load_model
    specs = [load_model(n) for n in known_models()]
    if as_json:
        return _emit_json([ModelSummary.of(s) for s in specs])
    rows = [[s.name, s.architecture, f"{s.param_count() / 1e9:.2f}",
             f"{s.param_count(active=True) / 1e9:.2f}", s.num_layers,
             f"{s.num_heads}/{s.num_kv_heads}", s.head_dim,
             _fmt_bytes(s.kv_bytes_per_token), s.sliding_layers] for s in specs]
    echo(_table(["name", "type", "params B", "active B", "layers", "heads/kv", "head_dim",
                       "KV/token", "sliding layers"], rows, "llrrrrrrr"))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def hardware(as_json):
    """List the hardware catalogue: datasheet and measured ceilings."""
    from specsim.specs import known_hardware, load_hardware
    hws = {n: load_hardware(n) for n in known_hardware()}
    if as_json:
        return _emit_json({n: HardwareSummary.of(h).to_json() | {
            "datasheet_bandwidth_TBps": h.memory_bandwidth / 1e12,
            "datasheet_bf16_TFLOPs": h.bf16_flops / 1e12} for n, h in hws.items()})
    rows = [[n, h.name, f"{h.memory_bytes / 1e9:.0f}", f"{h.memory_bandwidth / 1e12:.2f}",
             f"{h.bf16_flops / 1e12:.0f}",
             f"{h.measured_bandwidth / 1e12:.2f}" if h.measured_bandwidth else "-",
             f"{h.measured_bf16_flops / 1e12:.0f}" if h.measured_bf16_flops else "-"]
            for n, h in hws.items()]
    echo(_table(["name", "GPU", "GB", "TB/s", "TFLOP/s", "measured TB/s",
                       "measured TFLOP/s"], rows, "llrrrrr"))


def _register() -> None:
    from specsim.cli.calibrate_cmd import calibrate_cmd
    from specsim.cli.engine_cmds import fetch_cmd, run_cmd, trace_cmd
    from specsim.cli.review_cmd import review_cmd
    from specsim.cli.validate_cmd import validate_cmd
    from specsim.cli.dashboard_cmd import dashboard_cmd
    from specsim.cli.simulate_cmds import simulate_cmd, tune_cmd
    cli.add_command(simulate_cmd)
    cli.add_command(tune_cmd)
    cli.add_command(dashboard_cmd)
    cli.add_command(calibrate_cmd)
    cli.add_command(run_cmd)
    cli.add_command(trace_cmd)
    models.add_command(fetch_cmd)
    cli.add_command(review_cmd)
    cli.add_command(validate_cmd)


_register()


def _note(message, category, filename, lineno, file=None, line=None) -> None:
    """A Python warning as one escaped line on stderr: ``specsim: note: ...``."""
    click.echo("specsim: note: " + printable(stream_name(str(message)), one_line=True),
               err=True)


def _error(message) -> None:
    click.echo(error_line(stream_name(str(message))), err=True)


#: Exit codes: bad data (a SpecsimError, an unreadable file), bad usage (click's errors).
EXIT_DATA, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def main(argv=None) -> int:
    """Entry point. Every failure ends in one line on stderr, ``specsim: error: ...``, and exit
    status 1 (bad data: :class:`SpecsimError`, an unreadable file, anything unexpected) or 2
    (bad usage: click's errors); no traceback unless SPECSIM_DEBUG is set. Warnings print as
    one ``specsim: note:`` line each."""
    import warnings

    debug = bool(os.environ.get("SPECSIM_DEBUG"))
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _note
        try:
            cli.main(args=argv, prog_name="specsim", standalone_mode=False)
        except (click.exceptions.Abort, KeyboardInterrupt):
            click.echo("specsim: aborted", err=True)
            return EXIT_INTERRUPTED
        except click.UsageError as exc:
            if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
                click.echo(exc.format_message())       # a bare group: its help
                return 0
            if debug:
                raise
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            _error(exc.format_message() + where)
            return EXIT_USAGE
        except click.ClickException as exc:
            if debug:
                raise
            _error(exc.format_message())
            return exc.exit_code
        except BrokenPipeError:
            # the reader has gone: no message, and none from the interpreter at exit either
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 0
        except SpecsimError as exc:
            if debug:
                raise
            _error(exc)
            return EXIT_DATA
        except OSError as exc:
            if debug:
                raise
            _error(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
            return EXIT_DATA
        except (MemoryError, RecursionError) as exc:
            if debug:
                raise
            _error(f"the input is too large or too deeply nested to read "
                   f"({type(exc).__name__})")
            return EXIT_DATA
        except Exception as exc:  # noqa: BLE001 - one line, never a traceback
            if debug:
                raise
            _error(f"{type(exc).__name__}: {exc} (an unexpected failure; SPECSIM_DEBUG=1 "
                   f"shows where)")
            return EXIT_DATA
    return 0


if __name__ == "__main__":
    sys.exit(main())
