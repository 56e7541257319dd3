"""`specsim validate`: predicted vs measured throughput on the GPU (plan → --gpu → report)."""
from __future__ import annotations

import click

from specsim.cli import defaults
from specsim.cli.files import check_outputs
from specsim.cli.gpu import require_gpu_packages
from specsim.cli.lists import parse_ints, parse_names, parse_shapes, parse_sparsities
from specsim.cli.terminal import echo
from specsim.errors import SpecsimError

#: Where `validate plan` writes its plan, `validate --gpu` its measurements, and the other
#: subcommands read them: this folder.
DEFAULT_PLAN = "validation-plan.json"
DEFAULT_MEASURED = "validation-measured.json"
SHIPPED_PLANS = [defaults.validation_file(run, "plan")
                 for run in defaults.VALIDATION_RUNS.values()]


def _found(path: str, what: str) -> str:
    """``path`` as given where it exists, else the shipped file of that name."""
    from specsim.validate import repo_file
    try:
        return repo_file(path)[0]
    except SpecsimError:
        if path == DEFAULT_PLAN:
            raise SpecsimError(f"no {DEFAULT_PLAN} in this folder: write one with `specsim "
                               f"validate plan`, or pass --plan with a shipped run's plan "
                               f"({', '.join(SHIPPED_PLANS)})") from None
        raise SpecsimError(f"{path}: no such {what} here or in specsim's shipped data (shipped "
                           f"plans: {', '.join(SHIPPED_PLANS)})") from None


def _measured_for(plan_path: str, measured: str | None) -> str:
    """``--measured`` as given; without it, a shipped plan's own measurements, else
    :data:`DEFAULT_MEASURED`."""
    if measured:
        return measured
    if plan_path.endswith("-plan.json"):
        from specsim.validate import repo_file
        sibling = plan_path[: -len("plan.json")] + "measured.json"
        try:                           # the run's own measurements, beside its plan here or
            repo_file(sibling)         # in the shipped data
        except SpecsimError:
            pass
        else:
            return sibling
    return DEFAULT_MEASURED


#: The shipped setups, the plan without --model, --batch, --context, --shapes, --ks or --mode:
#: a forced setup (random weights at the model's shapes, the trace's accepted lengths replayed)
#: and a free-running one (real weights, the trace's own model and prompts).
FORCED_MODEL, FORCED_BATCH, FORCED_CONTEXT = "qwen3-8b", 4, 32768
K_FORCED, K_FREE = "2,4,8,12", "2,4,8,12,15"
#: Options that ask for setups of their own; options only the shipped setups take.
SETUP_OPTIONS = ("model", "batch", "context", "shapes", "ks", "mode")
SHIPPED_ONLY = {"k_forced": "--k-forced", "k_free": "--k-free", "batch_free": "--batch-free",
                "no_free": "--no-free"}


def _label(context: int) -> str:
    return f"{context // 1024}k" if context % 1024 == 0 else str(context)


def free_setup(name, model, batch, policies, ks, ss, weights, prompts_file, requests=None,
               prompt_ids=None):
    """A free-running setup: real weights (``weights``, a safetensors folder on the GPU
    machine), ``batch`` slots, ``requests`` prompts as a continuous batch — the prompt-id
    file's prompts the trace recorded (``prompt_ids``; the default set's 12 when None),
    cycled. The plan names the file and its sha256 instead of copying the token ids."""
    from specsim.engine.prompts import DEFAULT_SET
    from specsim.engine.record import read_prompt_ids
    from specsim.validate import Setup, file_sha, repo_file

    found, named = repo_file(prompts_file)
    wanted = prompt_ids or {p[0] for p in DEFAULT_SET}
    ids, tokens, _ = read_prompt_ids(found)
    chosen = [(n, t) for n, t in zip(ids, tokens) if n in wanted]
    if not chosen:
        raise SpecsimError(f"none of the prompts of {prompts_file} is in the trace")
    n = max(requests or batch, batch)
    cycled = [chosen[i % len(chosen)] for i in range(n)]
    # the tokens as read here (the plan records only the file and its sha256)
    return Setup(name, model, "free", batch, policies, ks, ss,
                 prompts=[t for _, t in cycled], prompt_ids=[n for n, _ in cycled],
                 weights=weights, prompts_file=named, prompts_sha256=file_sha(found))


def default_setups(policies, ks_forced, ks_free, ss, batch_free, context, weights,
                   prompts_file=None, requests_free=None, prompt_ids=None):
    """The shipped setups: Qwen3-8B forced (random weights, batch 4, at ``context``: one
    setup per context when it is a list) and, with ``prompts_file`` (a prompt-id file),
    SmolLM2-135M free (:func:`free_setup`)."""
    from specsim.validate import Setup

    contexts = context if isinstance(context, (list, tuple)) else [context]
    out = [Setup(FORCED_MODEL if len(contexts) == 1 else f"{FORCED_MODEL}-{_label(c)}",
                 FORCED_MODEL, "forced", FORCED_BATCH, policies, ks_forced, ss, context=c)
           for c in contexts]
    if prompts_file:
        out.append(free_setup("smollm2", "smollm2-135m", batch_free, policies, ks_free, ss,
                              weights, prompts_file, requests_free, prompt_ids))
    return out


def requested_setups(model, batches, contexts, mode, policies, ks, ss, weights, prompts_file,
                     requests, prompt_ids, trace_model, shapes=None):
    """Exactly the setups asked for: one per (batch, context) of ``model`` (each pair of
    ``shapes``, else every batch with every context; a catalogue name
    or a config.json path, whose config the plan then carries), forced, or free-running where
    the model is the trace's own (``trace_model``), one per batch."""
    from pathlib import Path

    from specsim.specs import load_model
    from specsim.validate import Setup

    spec = load_model(model)                       # an unknown name: one line, the known ones
    config = None
    if Path(model).exists():                       # as load_model reads it
        from specsim.atomic import read_json
        config = read_json(str(Path(model) / "config.json" if Path(model).is_dir()
                               else Path(model)), "model config")
    if mode == "free":
        if config is not None or spec.name != trace_model:
            raise SpecsimError(f"free-running setups decode the trace's own model "
                               f"({trace_model}) with its real weights and recorded prompts; "
                               f"{model} runs forced (--mode forced)")
        if contexts is not None or shapes:
            raise SpecsimError("--context and --shapes set forced setups' prompts; free-running setups "
                               "decode the prompt-id file's prompts (--prompts) at their own "
                               "lengths")
        return [free_setup(f"{spec.name}-b{b}-free", spec.name, b, policies, ks, ss, weights,
                           prompts_file, requests, prompt_ids) for b in batches]
    pairs = shapes or [(b, c) for b in batches for c in contexts or [FORCED_CONTEXT]]
    return [Setup(f"{spec.name}-b{b}-{_label(c)}", spec.name, "forced", b, policies, ks, ss,
                  context=c, model_config=config)
            for b, c in pairs]


@click.group("validate", invoke_without_command=True)
@click.option("--gpu", is_flag=True, help="Measure every configuration of --plan on this GPU.")
@click.option("--plan", "plan_path", default=DEFAULT_PLAN, show_default=True,
              type=click.Path(dir_okay=False), help="Plan file (from `specsim validate plan`).")
@click.option("--out", default=DEFAULT_MEASURED, show_default=True,
              type=click.Path(dir_okay=False), help="Measurements to write (with --gpu).")
@click.option("--repeats", type=click.IntRange(min=1), default=2, show_default=True,
              help="Timed runs per configuration (median), after one warm-up run.")
@click.option("--setups", default=None,
              help="Only these setups of the plan (comma-separated names, e.g. qwen3-8b).")
@click.option("--policies", default=None,
              help="Only these policies (comma-separated): a part of the grid per process; "
                   "join the parts with `specsim validate merge`.")
@click.pass_context
def validate_cmd(ctx, gpu, plan_path, out, repeats, setups, policies):
    """Does specsim predict what the GPU then measures, and pick the right k and s?

    \b
    1. specsim validate plan            predictions first (any machine)
    2. specsim validate --gpu           measure the plan's grid on the GPU
    3. specsim validate report          per policy: MAPE, worst cell, regret of the
                                        predicted best (k, s); overall (policy, k, s)

    The GPU step needs torch and triton (the gpu extra; no simpy); without the CLI run it as
    `python -m specsim.validate PLAN OUT`.
    """
    if ctx.invoked_subcommand is not None:
        return
    if not gpu:
        echo(ctx.get_help())
        return
    check_outputs({"--out": out}, [plan_path])
    require_gpu_packages("specsim validate --gpu")
    import torch
    if not torch.cuda.is_available():
        raise SpecsimError("--gpu needs a CUDA GPU; none is visible")
    from specsim.validate import FORMAT_KEY, measure, read_json, select, write_json
    got = measure(select(read_json(_found(plan_path, "plan"), FORMAT_KEY), setups, policies),
                  repeats=repeats)
    write_json(out, got)
    echo(f"wrote {out}")


@validate_cmd.command("plan")
@click.option("--model", default=None,
              help="Catalogue name (see `specsim models`), path to a config.json, or a "
                   "Hugging Face id in the local hub cache: the plan "
                   "holds exactly the setups of --model, --batch, --context, --shapes and --mode asked "
                   f"for, those not given taken from the shipped forced setup ({FORCED_MODEL}, "
                   f"batch {FORCED_BATCH}, context {FORCED_CONTEXT}, k {K_FORCED}). Without "
                   "any of --model, --batch, --context, --shapes, --ks, --mode: the shipped setups "
                   f"(that forced one and SmolLM2-135M free-running).")
@click.option("--batch", "batch_text", default=None,
              help=f"Slots, comma-separated (one setup each). Default: {FORCED_BATCH}.")
@click.option("--context", "context_text", default=None,
              help="Prompt length of forced setups, comma-separated (one setup each), at "
                   f"least 256. Default: {FORCED_CONTEXT}.")
@click.option("--shapes", "shapes_text", default=None,
              help="BATCHxCONTEXT pairs of forced setups, comma-separated (one setup each, "
                   "e.g. 16x8k,4x64k), instead of every --batch with every --context.")
@click.option("--ks", "ks_text", default=None,
              help=f"Draft lengths, comma-separated. Default: {K_FORCED} forced, {K_FREE} free.")
@click.option("--mode", type=click.Choice(["forced", "free"]), default=None,
              help="forced (default): random weights at the model's shapes replay the trace's "
                   "accepted lengths, so only cost is tested, for any model; free: the "
                   "trace's own model with its real weights (--weights) decodes its recorded "
                   "prompts.")
@click.option("--costs", default="auto", show_default=True, help=defaults.COSTS_HELP
              + " The plan records which source priced each setup.")
@click.option("--trace", "trace_path", default=None, type=click.Path(dir_okay=False),
              help=f"Acceptance trace. Default: the shipped {defaults.TRACE}.")
@click.option("--hardware", default=defaults.HARDWARE, show_default=True,
              help=defaults.HARDWARE_HELP + " Its memory bounds batch and context.")
@click.option("--policies", default="vegas,sparsespec,streamingllm,quest,last-token",
              show_default=True)
@click.option("--s", "ss", default="0.03,0.1", show_default=True,
              help="Sparsities, comma-separated: the trace's groups of each policy.")
@click.option("--k-forced", default=K_FORCED, show_default=True,
              help="Draft lengths of the shipped forced setup.")
@click.option("--k-free", default=K_FREE, show_default=True,
              help="Draft lengths of the shipped free-running setup (> the trace's k_rec: the "
                   "fitted extrapolation is checked too).")
@click.option("--batch-free", type=click.IntRange(min=1), default=32, show_default=True,
              help="Slots of the shipped free-running setup.")
@click.option("--requests-free", type=click.IntRange(min=1), default=96, show_default=True,
              help="Prompts through a free-running setup's slots: more than its slots run as "
                   "a continuous batch (a finished answer's slot takes the next prompt), so "
                   "the steady window spans whole answers; equal to them, one static batch.")
@click.option("--weights", default="/root/smollm2", show_default=True,
              help="Where the free-running model's safetensors will be on the GPU machine.")
@click.option("--prompts", "prompts_file", default="traces/smollm2-prompt-ids-extended.json",
              show_default=True, type=click.Path(dir_okay=False),
              help="Prompt-id file of free-running setups (the trace's prompts: the plan "
                   "names it and its sha256; the GPU run reads the token ids from it).")
@click.option("--no-free", is_flag=True, help="Only the shipped forced setup.")
@click.option("--out", default=DEFAULT_PLAN, show_default=True, type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True,
              help="Replace an existing plan file (a plan is the record of what was predicted "
                   "before its runs: by default it is never overwritten).")
@click.pass_context
def plan_cmd(ctx, model, batch_text, context_text, shapes_text, ks_text, mode, costs, trace_path, hardware,
             policies, ss, k_forced, k_free, batch_free, requests_free, weights, prompts_file,
             no_free, out, force):
    """Predict every configuration before the GPU runs it.

    \b
    Any model the engine runs, forced acceptance at its real shapes, on this GPU:
      specsim validate plan --model llama-3.2-3b --batch 8 --context 32768
      specsim validate --gpu && specsim validate report
    """
    import os

    check_outputs({"--out": out}, [trace_path, prompts_file, model, hardware, costs])
    if os.path.exists(out) and not force:
        raise click.UsageError(
            f"{out} exists: a plan records what was predicted before its runs, and results may "
            f"have been measured against it; write the new one with --out FILE, or pass "
            f"--force to replace it")
    from click.core import ParameterSource

    from specsim.traces.importers import load_trace
    from specsim.validate import build_plan, repo_file, write_json
    given = {name for name in ctx.params
             if ctx.get_parameter_source(name) != ParameterSource.DEFAULT}
    requested = {"model": model, "batch": batch_text, "context": context_text,
                 "shapes": shapes_text, "ks": ks_text, "mode": mode}
    custom = any(requested[name] is not None for name in SETUP_OPTIONS)
    if custom:
        clash = [flag for name, flag in SHIPPED_ONLY.items() if name in given]
        if clash:
            raise SpecsimError(f"{clash[0]} describes the shipped setups; with --model, "
                               f"--batch, --context, --shapes, --ks or --mode the plan holds only the "
                               f"setups asked for (draft lengths: --ks)")
    names = parse_names(policies, "--policies")
    sparsities = parse_sparsities(ss, "--s")
    trace_path, trace_named = repo_file(trace_path or defaults.TRACE)
    trace = load_trace(trace_path)
    groups = trace.groups()
    # a free run decodes the prompts the trace recorded (for the grid's groups), so that
    # the acceptance it is predicted from is that of its own workload
    recorded = {r.prompt_id for (p, s), g in groups.items() if p in names and s in sparsities
                for r in g.requests if r.prompt_id} or None
    if shapes_text and (batch_text or context_text):
        raise SpecsimError("--shapes names each setup's batch and context: give it or "
                           "--batch/--context, not both")
    if custom:
        contexts = parse_ints(context_text, "--context", low=256) if context_text else None
        shapes = parse_shapes(shapes_text) if shapes_text else None
        free = mode == "free"
        trace_model = str(trace.header.get("model") or "").lower()
        setups = requested_setups(
            model or (trace_model if free else FORCED_MODEL),
            parse_ints(batch_text, "--batch") if batch_text else [FORCED_BATCH], contexts,
            mode or "forced", names, parse_ints(ks_text or (K_FREE if free else K_FORCED),
                                                "--ks"),
            sparsities, weights, prompts_file, requests_free, recorded, trace_model, shapes)
    else:
        setups = default_setups(names, parse_ints(k_forced, "--k-forced"),
                                parse_ints(k_free, "--k-free"), sparsities, batch_free,
                                FORCED_CONTEXT, weights, None if no_free else prompts_file,
                                requests_free, recorded)
    plan = build_plan(setups, trace_path, hardware, costs=costs)
    plan["trace"] = trace_named          # relative to the repository when inside it
    write_json(out, plan)
    n = sum(len(s["configs"]) for s in plan["setups"])
    echo(f"wrote {out}: {n} configurations in {len(plan['setups'])} setups")
    for entry in plan["setups"]:
        echo(f"  {entry['setup']['name']}: {len(entry['configs'])} configurations; "
                   f"costs ({entry['cost_source']['kind']}): {entry['cost_source']['note']}")
    for note in plan.get("notes", ()):
        echo(f"note: {note}", err=True)


@validate_cmd.command("report")
@click.option("--plan", "plan_path", default=DEFAULT_PLAN, show_default=True,
              type=click.Path(dir_okay=False),
              help="Plan file (`specsim validate plan`), or a shipped run's plan (found from "
                   f"any folder): {', '.join(SHIPPED_PLANS)}.")
@click.option("--measured", default=None, type=click.Path(dir_okay=False),
              help="Measurements of that plan (`specsim validate --gpu`). Default: a shipped "
                   f"plan's own measurements, else {DEFAULT_MEASURED}.")
@click.option("--markdown", "md_out", default=None, type=click.Path(dir_okay=False),
              help="Also write the tables as Markdown (for VALIDATION.md).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def report_cmd(plan_path, measured, md_out, as_json):
    """Compare the plan's predictions with the measurements: per setup and policy the error
    of each predictor (MAPE, worst case, Pearson r) and the regret of its predicted optimum.

    \b
    The shipped H200 run of Qwen3-8B, from any folder:
      specsim validate report --plan models/validation/h200-qwen3-8b-plan.json
    """
    import json

    from specsim.atomic import write_text_atomic
    from specsim.traces.format import read_trace
    from specsim.errors import SpecsimError
    from specsim.validate import (FORMAT_KEY, MEASURED_KEY, file_sha, markdown, read_json,
                                  repo_file, report)
    plan_file = _found(plan_path, "plan")
    measured_file = _found(_measured_for(plan_path, measured), "measurements")
    check_outputs({"--markdown": md_out}, [plan_file, measured_file])
    plan = read_json(plan_file, FORMAT_KEY)
    got = read_json(measured_file, MEASURED_KEY)
    trace = None   # the plan's trace, when it is here as it was: answers vs its records
    try:           # as named (plans name it relative to the repository), or in the repository
        trace_file = repo_file(plan["trace"])[0] if plan.get("trace") else None
    except SpecsimError:
        trace_file = None
    if trace_file:
        if file_sha(trace_file) == plan.get("trace_sha256"):
            trace = read_trace(trace_file)
        else:
            echo(f"note: {plan['trace']} is not the trace the plan was made with; "
                       f"answers are not compared with its records", err=True)
    rep = report(plan, got, trace)
    if md_out:
        write_text_atomic(md_out, markdown(rep, got))
    if as_json:
        click.echo(json.dumps(rep, indent=1))
    else:
        echo(markdown(rep, got))


@validate_cmd.command("merge")
@click.argument("parts", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False))
def merge_cmd(parts, out):
    """Join measurements of parts of one plan (--setups/--policies runs) into one file."""
    from specsim.validate import MEASURED_KEY, merge_measured, read_json, write_json
    check_outputs({"--out": out}, parts)
    merged = merge_measured([read_json(p, MEASURED_KEY) for p in parts])
    write_json(out, merged)
    n = sum(len(s["configs"]) for s in merged["setups"])
    echo(f"wrote {out}: {n} configurations in {len(merged['setups'])} setups")
