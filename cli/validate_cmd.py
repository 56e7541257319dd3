"""`specsim validate`: predicted vs measured throughput on the GPU (plan → --gpu → report)."""
from __future__ import annotations

import click

from specsim.cli import defaults
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
        raise SpecsimError(f"{path}: no such {what} here or in specsim's shipped data (shipped "
                           f"plans: {', '.join(SHIPPED_PLANS)})") from None


def _measured_for(plan_path: str, measured: str | None) -> str:
    """``--measured`` as given; without it, a shipped plan's own measurements, else
    :data:`DEFAULT_MEASURED`."""
    if measured:
        return measured
    if plan_path.replace("\\", "/") in SHIPPED_PLANS:
        return plan_path[: -len("plan.json")] + "measured.json"
    return DEFAULT_MEASURED


def _ints(text):
    return sorted({int(x) for x in text.split(",") if x.strip()})


def _floats(text):
    return sorted({float(x) for x in text.split(",") if x.strip()})


def default_setups(policies, ks_forced, ks_free, ss, batch_free, context, weights,
                   prompts_file=None, requests_free=None, prompt_ids=None):
    """Qwen3-8B shapes forced (random weights, batch 4, context 32K) and, with ``prompts_file``
    (a prompt-id file), SmolLM2-135M free (real weights, ``batch_free`` slots,
    ``requests_free`` prompts as a continuous batch: the file's prompts the trace recorded —
    ``prompt_ids``; the default set's 12 when None — cycled). The plan names the file and its
    sha256 instead of copying the token ids."""
    from specsim.validate import Setup, _sha, repo_file

    out = [Setup("qwen3-8b", "qwen3-8b", "forced", 4, policies, ks_forced, ss,
                 context=context)]
    if prompts_file:
        from specsim.engine.prompts import DEFAULT_SET
        from specsim.engine.record import read_prompt_ids
        found, named = repo_file(prompts_file)
        wanted = prompt_ids or {p[0] for p in DEFAULT_SET}
        ids, tokens, _ = read_prompt_ids(found)
        chosen = [(n, t) for n, t in zip(ids, tokens) if n in wanted]
        if not chosen:
            raise SpecsimError(f"none of the prompts of {prompts_file} is in the trace")
        n = max(requests_free or batch_free, batch_free)
        cycled = [chosen[i % len(chosen)] for i in range(n)]
        # the tokens as read here (the plan records only the file and its sha256)
        out.append(Setup("smollm2", "smollm2-135m", "free", batch_free, policies, ks_free, ss,
                         prompts=[t for _, t in cycled], prompt_ids=[n for n, _ in cycled],
                         weights=weights, prompts_file=named, prompts_sha256=_sha(found)))
    return out


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
    3. specsim validate report          MAPE, worst case, Pearson r, k*/s* regret

    The GPU step needs only torch (no simpy); without the CLI installed run it as
    `python -m specsim.validate PLAN OUT`.
    """
    if ctx.invoked_subcommand is not None:
        return
    if not gpu:
        click.echo(ctx.get_help())
        return
    import torch
    if not torch.cuda.is_available():
        raise SpecsimError("--gpu needs a CUDA GPU; none is visible")
    from specsim.validate import FORMAT_KEY, measure, read_json, select, write_json
    got = measure(select(read_json(_found(plan_path, "plan"), FORMAT_KEY), setups, policies),
                  repeats=repeats)
    write_json(out, got)
    click.echo(f"wrote {out}")


@validate_cmd.command("plan")
@click.option("--trace", "trace_path", default=None, type=click.Path(dir_okay=False),
              help=f"Acceptance trace. Default: the shipped {defaults.TRACE}.")
@click.option("--hardware", default=defaults.HARDWARE, show_default=True,
              help="Its shipped calibrations cost the predictions.")
@click.option("--policies", default="vegas,sparsespec,streamingllm,quest,last-token",
              show_default=True)
@click.option("--k-forced", default="2,4,8,12", show_default=True,
              help="Draft lengths of the Qwen3-8B forced-acceptance setup.")
@click.option("--k-free", default="2,4,8,12,15", show_default=True,
              help="Draft lengths of the SmolLM2 free-running setup (> the trace's k_rec: the "
                   "fitted extrapolation is checked too).")
@click.option("--s", "ss", default="0.03,0.1", show_default=True)
@click.option("--context", type=click.IntRange(min=256), default=32768, show_default=True,
              help="Prompt length of the forced setup.")
@click.option("--batch-free", type=click.IntRange(min=1), default=32, show_default=True,
              help="Slots of the SmolLM2 free-running setup.")
@click.option("--requests-free", type=click.IntRange(min=1), default=96, show_default=True,
              help="Prompts through those slots: more than --batch-free run as a continuous "
                   "batch (a finished answer's slot takes the next prompt), so the steady "
                   "window spans whole answers; equal to it, one static batch.")
@click.option("--weights", default="/root/smollm2", show_default=True,
              help="Where the SmolLM2 safetensors will be on the GPU machine.")
@click.option("--prompts", "prompts_file", default="traces/smollm2-prompt-ids-extended.json",
              show_default=True, type=click.Path(dir_okay=False),
              help="Prompt-id file of the free-running setup (the trace's prompts: the plan "
                   "names it and its sha256; the GPU run reads the token ids from it).")
@click.option("--no-free", is_flag=True, help="Only the forced-acceptance setup.")
@click.option("--out", default=DEFAULT_PLAN, show_default=True, type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True,
              help="Replace an existing plan file (a plan is the record of what was predicted "
                   "before its runs: by default it is never overwritten).")
def plan_cmd(trace_path, hardware, policies, k_forced, k_free, ss, context, batch_free,
             requests_free, weights, prompts_file, no_free, out, force):
    """Predict every configuration before the GPU runs it."""
    import os

    if os.path.exists(out) and not force:
        raise click.UsageError(
            f"{out} exists: a plan records what was predicted before its runs, and results may "
            f"have been measured against it; write the new one with --out FILE, or pass "
            f"--force to replace it")
    from specsim.traces.importers import load_trace
    from specsim.validate import build_plan, repo_file, write_json
    trace_path, trace_named = repo_file(trace_path or defaults.TRACE)
    names = [p.strip() for p in policies.split(",") if p.strip()]
    # the free run decodes the prompts the trace recorded (for the grid's groups), so that
    # the acceptance it is predicted from is that of its own workload
    groups = load_trace(trace_path).groups()
    recorded = {r.prompt_id for (p, s), g in groups.items() if p in names and s in _floats(ss)
                for r in g.requests if r.prompt_id}
    setups = default_setups(names, _ints(k_forced), _ints(k_free), _floats(ss), batch_free,
                            context, weights, None if no_free else prompts_file, requests_free,
                            recorded or None)
    plan = build_plan(setups, trace_path, hardware)
    plan["trace"] = trace_named          # relative to the repository when inside it
    write_json(out, plan)
    n = sum(len(s["configs"]) for s in plan["setups"])
    click.echo(f"wrote {out}: {n} configurations in {len(plan['setups'])} setups")


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
    from specsim.validate import (FORMAT_KEY, MEASURED_KEY, _sha, markdown, read_json,
                                  repo_file, report)
    plan = read_json(_found(plan_path, "plan"), FORMAT_KEY)
    got = read_json(_found(_measured_for(plan_path, measured), "measurements"), MEASURED_KEY)
    trace = None   # the plan's trace, when it is here as it was: answers vs its records
    try:           # as named (plans name it relative to the repository), or in the repository
        trace_file = repo_file(plan["trace"])[0] if plan.get("trace") else None
    except SpecsimError:
        trace_file = None
    if trace_file:
        if _sha(trace_file) == plan.get("trace_sha256"):
            trace = read_trace(trace_file)
        else:
            click.echo(f"note: {plan['trace']} is not the trace the plan was made with; "
                       f"answers are not compared with its records", err=True)
    rep = report(plan, got, trace)
    if md_out:
        write_text_atomic(md_out, markdown(rep, got))
    if as_json:
        click.echo(json.dumps(rep, indent=1))
    else:
        click.echo(markdown(rep, got))


@validate_cmd.command("merge")
@click.argument("parts", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False))
def merge_cmd(parts, out):
    """Join measurements of parts of one plan (--setups/--policies runs) into one file."""
    from specsim.validate import MEASURED_KEY, merge_measured, read_json, write_json
    merged = merge_measured([read_json(p, MEASURED_KEY) for p in parts])
    write_json(out, merged)
    n = sum(len(s["configs"]) for s in merged["setups"])
    click.echo(f"wrote {out}: {n} configurations in {len(merged['setups'])} setups")
