"""Acceptance traces over a prompt set and a grid of (policy, k, s): the core of
``specsim trace``, importable without the CLI (the GPU machine has torch, not click or simpy).

On a machine without the CLI, with the prompt token ids exported where the CLI is
(``specsim trace --export-prompts prompts.json``, so both sides decode the same tokens):

    PYTHONPATH=. python3 -m specsim.engine.record prompts.json traces/out.jsonl \\
        --weights /root/smollm2 --k 12 --s 0.03,0.05,0.07,0.1 --max-new-tokens 128 --batch 8 \\
        [--setting name=value]

One request record per (prompt, policy, k, s), id ``PROMPT|POLICY|kK|sS``. The file is
rewritten atomically after each finished batch, so an interrupted run loses at most the batch in
flight and a rerun with the same settings continues where it stopped.

Batching: by default the prompts go in chunks of ``--batch`` (static batches; the last chunk
is smaller). ``--continuous`` runs all prompts of a configuration through ``--batch`` slots
as one continuous batch (a finished answer's slot takes the next prompt), as a server — and
``specsim validate``'s free-running runs — do. In bf16 a kernel's reduction order depends on
the batch shape, so a prompt decoded in a smaller last chunk can reach a near-tie the other
way and answer with another text: recorded in chunks of 32, the 16 prompts of the last chunk
of the 48-prompt SmolLM2 set answered differently from the batch-32 validation runs (all 32
of the first chunk answered identically).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Iterable

from specsim.errors import SpecsimError
from specsim.settings import DEFAULT, EngineSettings


def trace_model_name(weights: str) -> str:
    """The model name a trace records for a weights folder: the catalogue name when the folder
    is a fetchable model's (``/root/smollm2`` → ``smollm2-135m``, which ``specsim predict``
    costs the trace on), else the folder's name."""
    from specsim.engine.fetch import MODELS

    base = os.path.basename(os.path.normpath(weights))
    release = MODELS.get(base.lower())
    return release.folder if release else base


def trace_header(name: str, weights: str, greedy: bool, max_new_tokens: int,
                 prompt_source: str, settings: dict) -> dict:
    from specsim.traces.format import make_header
    return make_header(
        source="specsim trace (specsim.engine, real execution)", model=name,
        synthetic=weights == "random",
        description=(f"Recorded by the engine: {name} with {weights} weights, "
                     f"{'greedy' if greedy else 'sampled'} decoding, "
                     f"{max_new_tokens} new tokens per prompt, prompts: {prompt_source}. "
                     f"context = KV entries at iteration start; accept_prob = "
                     f"{'1/0 (draft == argmax p)' if greedy else 'min(1, p/q)'}."),
        engine=settings)


def run_settings(settings: EngineSettings, **run) -> dict:
    """A trace header's ``engine`` entry: the run's own settings (model, weights, sampling,
    prompts, ...) and the engine settings with their hash; a file is resumed only by a run
    whose entry is equal."""
    return {**run, "engine_settings": settings.to_json(),
            "engine_settings_hash": settings.stable_hash()}


def record_traces(net, prompt_ids: list[list[int]], prompt_names: list[str], *, header: dict,
                  sampling, max_new_tokens: int, policies: list[str], ks: list[int],
                  ss: list[float], batch: int, out: str, seed: int = 0,
                  progress: Callable[[list, str], Iterable] | None = None,
                  continuous: bool = False, settings: EngineSettings = DEFAULT
                  ) -> tuple[int, int]:
    """Record every missing (prompt, policy, k, s) into ``out`` (resumed when it exists with
    the same ``header["engine"]`` settings) → (records in the file, records added now).
    ``continuous``: each configuration's prompts through ``batch`` slots as one continuous
    batch, instead of static chunks of ``batch``. The engine runs with ``settings`` (which
    ``header["engine"]`` should record: :func:`run_settings`)."""
    from specsim.engine import Engine
    from specsim.engine.decode import cache_positions
    from specsim.traces.format import read_trace, write_trace

    records = []
    if os.path.exists(out):
        existing = read_trace(out)
        there = existing.header.get("engine") or {}
        here = json.loads(json.dumps(header["engine"]))
        if there != here:
            differ = sorted(k for k in set(there) | set(here) if there.get(k) != here.get(k))
            raise SpecsimError(f"{out} was recorded with other settings ({', '.join(differ)} "
                               f"differ); choose another out file or delete it")
        records = existing.requests
    done = {r.id for r in records}
    configs = [(policy, k, s) for policy in policies for k in ks for s in ss]
    chunks = [list(range(len(prompt_ids)))] if continuous else \
        [list(range(i, min(i + batch, len(prompt_ids)))) for i in range(0, len(prompt_ids), batch)]
    units = []  # prompt chunks outermost: each chunk is prefilled once for every config
    for c, chunk in enumerate(chunks):
        for policy, k, s in configs:
            todo = [i for i in chunk if f"{prompt_names[i]}|{policy}|k{k}|s{s:g}" not in done]
            if todo:
                units.append((c, policy, k, s, todo))
    before = len(records)
    if not units:
        return before, 0
    max_len = cache_positions(max(len(p) for p in prompt_ids), max_new_tokens, max(ks))
    prefilled: tuple = (None, None)
    for c, policy, k, s, todo in (progress or _plain_progress)(
            units, f"recording {len(units)} batches"):
        if prefilled[0] != c:
            prefilled = (c, None)
        engine = Engine(net, batch=min(batch, len(todo)), max_len=max_len, policy=policy, s=s,
                        k_max=k, settings=settings)
        chunk = chunks[c]
        state = None if prefilled[1] is None else prefilled[1].subset(
            [chunk.index(i) for i in todo])
        result = engine.generate(
            [prompt_ids[i] for i in todo], max_new_tokens, k=k, sampling=sampling, seed=seed,
            request_ids=[f"{prompt_names[i]}|{policy}|k{k}|s{s:g}" for i in todo],
            prefill=state, keep_prefill=state is None and len(todo) == len(chunk))
        if result.prefill is not None:
            prefilled = (c, result.prefill)
        names = {f"{prompt_names[i]}|{policy}|k{k}|s{s:g}": prompt_names[i] for i in todo}
        for rec in result.traces:   # same prompt under every configuration (by id: a prompt
            rec.prompt_id = rec.prompt_id or names[rec.id]   # with no iteration has no record)
        records.extend(result.traces)
        write_trace(out, header, records)
        del engine
    return len(records), len(records) - before


def _plain_progress(units: list, label: str):
    start = time.perf_counter()
    print(label, file=sys.stderr, flush=True)
    for n, unit in enumerate(units):
        yield unit
        done = time.perf_counter() - start
        print(f"  {n + 1}/{len(units)} {unit[1]} k={unit[2]} s={unit[3]:g} (elapsed {done:.0f} "
              f"s, ETA {done / (n + 1) * (len(units) - n - 1):.0f} s)", file=sys.stderr,
              flush=True)


def write_prompt_ids(path: str, names: list[str], ids: list[list[int]], source: str) -> None:
    """The prompt set as token ids (JSON), for ``main`` on a machine without the tokenizer's
    sources."""
    from specsim.atomic import write_text_atomic
    write_text_atomic(path, json.dumps({"specsim_prompt_ids": 1, "source": source,
                                        "prompts": [{"id": n, "tokens": t}
                                                    for n, t in zip(names, ids)]}))


def read_prompt_ids(path: str) -> tuple[list[str], list[list[int]], str]:
    from specsim import atomic
    doc = atomic.read_json(path, "prompt-id file")
    if not isinstance(doc, dict) or doc.get("specsim_prompt_ids") != 1:
        raise SpecsimError(f"{path}: not a prompt-id file (specsim trace --export-prompts)")
    prompts = doc.get("prompts") or []
    if not prompts or any(not p.get("tokens") for p in prompts):
        raise SpecsimError(f"{path}: no prompts, or an empty one")
    return [p["id"] for p in prompts], [list(map(int, p["tokens"])) for p in prompts], \
        doc.get("source", path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m specsim.engine.record",
        description="Record acceptance traces (specsim trace without the CLI).")
    parser.add_argument("prompts", help="prompt-id file (specsim trace --export-prompts)")
    parser.add_argument("out", help="trace file (specsim JSONL); resumed when it exists")
    parser.add_argument("--weights", required=True,
                        help="model folder: config.json + safetensors (real weights)")
    parser.add_argument("--name", default=None,
                        help="model name in the trace (default: the catalogue name of a "
                             "fetchable model's folder, e.g. smollm2 -> smollm2-135m; else "
                             "the folder name)")
    parser.add_argument("--dtype", default="auto",
                        choices=["auto", "bfloat16", "float16", "float32"],
                        help="auto: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--policies", default="vegas,sparsespec,streamingllm,quest,last-token")
    parser.add_argument("--k", default="12", help="comma-separated draft lengths")
    parser.add_argument("--s", default="0.03,0.05,0.07,0.1", help="comma-separated sparsities")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--continuous", action="store_true",
                        help="each configuration's prompts through --batch slots as one "
                             "continuous batch (as served; as specsim validate runs them), "
                             "not in static chunks of --batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="engine setting (repeatable; specsim trace --help lists them); "
                             "e.g. fuse_projections=false compile_layers=false to run the "
                             "model as loaded")
    args = parser.parse_args(argv)
    settings = EngineSettings.parse(args.setting)

    import torch

    from specsim.engine import build_model
    from specsim.engine.sampling import GREEDY
    from specsim.policies import get_policy

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" \
        else args.device
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16,
             "float32": torch.float32}.get(args.dtype) or (
        torch.bfloat16 if device.startswith("cuda") else torch.float32)
    names, ids, source = read_prompt_ids(args.prompts)
    policies = [p for p in args.policies.replace(" ", "").split(",") if p]
    for p in policies:
        get_policy(p)
    ks = [int(x) for x in args.k.split(",") if x]
    ss = [float(x) for x in args.s.split(",") if x]
    net = build_model(args.weights, weights="real", dtype=dtype, device=device)
    name = args.name or trace_model_name(args.weights)
    run = {"model": name, "weights": "real", "sampling": GREEDY.__dict__,
           "max_new_tokens": args.max_new_tokens, "seed": args.seed, "prompts": source,
           "dtype": str(dtype).replace("torch.", ""), "device": device}
    if args.continuous:
        run["batching"] = f"continuous, {args.batch} slots"
    if device.startswith("cuda"):
        run["gpu"] = torch.cuda.get_device_name(0)
    header = trace_header(name, "real", True, args.max_new_tokens, source,
                          run_settings(settings, **run))
    with torch.inference_mode():
        n, added = record_traces(net, ids, names, header=header, sampling=GREEDY,
                                 max_new_tokens=args.max_new_tokens, policies=policies, ks=ks,
                                 ss=ss, batch=args.batch, out=args.out, seed=args.seed,
                                 continuous=args.continuous, settings=settings)
    print(f"{args.out}: {n} records ({added} new)", flush=True)


if __name__ == "__main__":
    main()
