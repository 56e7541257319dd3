"""Benchmark the engine at real scale on a GPU: plain decoding against its roofline floor, and
self-speculative decoding replaying a trace's acceptance (forced m), as a speedup table.

Plain decoding: random weights of a catalogue model (default Qwen3-8B shapes, bf16), batch B,
every sequence at context C (random cache contents, no prefill), tokens/s and the time of a
step against the floor ``(weight bytes + Σ_b C_b · KV bytes per token) / copy bandwidth``
measured in the same run. Self-speculative: for each k and s, the trace's requests of that
policy and s (``traces/`` file, recorded at k_rec ≥ k) are replayed at k as ``specsim predict``
replays them (``truncate_trace``: token by token through each recorded answer); speedup =
tokens/s over plain tokens/s at the same batch and context.

    python benchmarks/bench_engine.py --contexts 32768,131072 --batch 4 \\
        --trace traces/<file>.jsonl --ks 2,4,6,8,10,12 --ss 0.03,0.05,0.07,0.1 --out bench.json

The engine runs with the default settings (``specsim.settings``: fused projections, compiled
layers, ...) changed by ``--setting name=value``; ``--c2q rows,sum`` runs each speculative
configuration once per Collect-2-Query mode in one process (one compile). ``--peer hf`` times
the Hugging Face peer's plain decoding at every context in the same process, beside the
engine's (``hf_peer.py``: a StaticCache, the step compiled and captured in a CUDA graph;
random weights of the same shapes).

``--phases`` adds, at every context, each policy's forced run (``--ks``' and ``--ss``' first
values, every iteration accepting k/2) split by phase: time per draft step, per verify pass,
per iteration for selection and the loop's fixed cost, the bytes each moves (weights and the
KV rows it reads) and the fraction of its floor, each floor measured in the same run: the
copy bandwidth for streamed bytes (weights, whole-cache reads) and, for a draft's selected
rows, a read-only Triton gather of a sorted random s-fraction of token rows (one KV head's
row size) out of as many as the cache holds over every layer (at most 2^24). A refresh's
bytes, and what a draft reads besides its rows (Quest's page bounds), are the roofline's. Each
phase's share of the iteration is printed beside it, and the loop's host time an iteration
(its wall time less its waits for the GPU: it overlaps the GPU's work).

    python benchmarks/bench_engine.py --contexts 2048,32768,131072 --batch 4 --phases --peer hf

``--batch`` takes several sizes (every batch at every context; a cell that does not fit in
memory is skipped with a note); the output is rewritten after every cell (``--resume`` goes
on with a run cut short, or adds cells to its file), and the run ends with its Markdown
tables, which ``--table OUT.json [...]`` prints again from saved outputs (several runs'
outputs into one table: a model, batch or context per run; a later output's rows replace an
earlier one's of the same cell and kind, as after re-running some policies).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time

import torch

from specsim.atomic import atomic_writer
from specsim.engine import Engine, build_model
from specsim.engine.decode import cache_positions, forced_prompts, truncate_trace
from specsim.settings import RETIRED, EngineSettings, engine_provenance, retired_settings
from specsim.shipped import catalog_file
from specsim.traces.format import read_trace


def median_seconds(fn, device, runs: int = 10) -> float:
    """Median wall time of ``fn`` over ``runs`` calls after two warm-up calls, each between
    two device synchronisations."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(runs + 2):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times[2:])[runs // 2]


def copy_bandwidth(device, gib: float = 4.0) -> float:
    """Bytes/s of a device-to-device copy (read + write), median of 10."""
    a = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    return 2 * a.numel() * a.element_size() / median_seconds(lambda: b.copy_(a), device)


def gather_bandwidth(device, row_bytes: int, rows: int, fraction: float = 0.05) -> float:
    """Bytes/s read by gathering a sorted random ``fraction`` of ``rows`` rows of ``row_bytes``
    each: the access a sparse draft step makes of its selected KV rows. On a GPU a Triton
    kernel reads the rows and sums them (nothing written back but one row per program), the
    best of a few tilings, median of 10 each; elsewhere ``index_select`` (a dry run)."""
    cache = torch.randn(rows, row_bytes // 2, device=device).to(torch.bfloat16)
    picked = torch.randperm(rows, device=device)[:max(1, int(rows * fraction))].sort().values
    moved = picked.numel() * row_bytes
    if device.type != "cuda":
        return 2 * moved / median_seconds(lambda: torch.index_select(cache, 0, picked), device)
    import triton

    kernel, width = _gather_sum_kernel(), cache.shape[1]
    want = cache.index_select(0, picked).float().sum(0)
    best = 0.0
    for block, iters in ((32, 4), (32, 16), (64, 8), (128, 4)):
        programs = triton.cdiv(picked.numel(), block * iters)
        out = torch.empty(programs, width, dtype=torch.float32, device=device)

        def run():
            kernel[(programs,)](cache, picked, out, picked.numel(), width, block, iters)
        run()
        if not torch.allclose(out.sum(0), want, rtol=1e-3, atol=1e-2 * want.abs().max().item()):
            raise RuntimeError("the gather probe's kernel sums the wrong rows")
        best = max(best, moved / median_seconds(run, device))
    return best


def _gather_sum_kernel():
    """Triton kernel: program p sums the rows ``src[idx[j]]`` of its ``BLOCK·ITERS`` indices
    into ``out[p]`` (fp32): a read-only gather of whole rows."""
    import triton
    import triton.language as tl

    @triton.jit
    def gather_sum(src, idx, out, n, D: tl.constexpr, BLOCK: tl.constexpr,
                   ITERS: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, D)
        acc = tl.zeros([BLOCK, D], dtype=tl.float32)
        for it in range(ITERS):
            offs = (pid * ITERS + it) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            rows = tl.load(idx + offs, mask=mask, other=0).to(tl.int64)
            acc += tl.load(src + rows[:, None] * D + cols[None, :], mask=mask[:, None],
                           other=0.0).to(tl.float32)
        tl.store(out + pid * D + cols, tl.sum(acc, axis=0))

    return gather_sum


POLICIES = ("vegas", "sparsespec", "streamingllm", "quest", "last-token")


def phase_rows(model, args, settings, batch: int, context: int, stream: float,
               gather: float) -> list:
    """Each policy's forced run at ``context`` split by phase against its floors (module
    doc); prints one table and returns its rows."""
    import numpy as np

    from specsim.costs.roofline import RooflineCostModel
    from specsim.policies import get_policy
    from specsim.specs import load_hardware, load_model
    from specsim.traces.format import RequestTrace

    roof = RooflineCostModel(load_model(args.model), load_hardware("h200"))

    k, s = int(args.ks.split(",")[0]), float(args.ss.split(",")[0])
    m, n = k // 2, args.iterations
    print(f"  phases at {context}, batch {batch}, k={k} (m={m} accepted), s={s}; floors: "
          f"stream {stream / 1e12:.2f} TB/s, gather {gather / 1e12:.2f} TB/s")
    print(f"  {'policy':>12} {'phase':>9} {'ms':>8} {'MB':>9} {'floor ms':>9} {'floor/time':>10}"
          f" {'share':>6}")
    rows = []
    for policy in args.policies.split(","):
        rescored = get_policy(policy).rescore_every_draft
        traces = [RequestTrace(str(b), policy, s, context + np.arange(n) * (m + 1),
                               np.full(n, k), np.full(n, m)) for b in range(batch)]
        ids = forced_prompts(traces, model.args.vocab_size, length=context)
        warm = [RequestTrace(t.id, policy, s, t.context[:3], t.k[:3], t.m[:3])
                for t in traces]
        try:
            engine = Engine(model, batch=batch, policy=policy, s=s, k_max=k,
                            max_len=cache_positions(context, n * (m + 1) + 1, k),
                            beyond_max_position=True, settings=settings)
            engine.generate(ids, 1, forced=warm, prefill="random")     # compile, capture
            run = engine.generate(ids, 1, forced=traces, prefill="random")
        except torch.OutOfMemoryError:
            engine = None
            release_memory()
            print(f"  {policy:>12} out of memory, skipped")
            rows.append({"batch": batch, "context": context, "mode": "phase", "policy": policy,
                         "note": "out of memory"})
            continue
        weights = engine.weight_bytes
        units = {"draft": run.forwards.get("draft", 0), "verify": run.forwards.get("verify", 0),
                 "selection": run.iterations, "other": run.iterations}
        total = run.decode_seconds
        for phase, count in units.items():
            seconds = run.timing.get(phase, 0.0)
            if not count or not seconds:
                continue
            moved = run.bytes_moved.get(phase, 0.0) / count
            scoring = roof.selection([context] * batch, s, policy, k).bytes
            if phase == "selection":       # what the refresh moves (the engine counts none;
                # Quest's scoring is in its drafts, the collected logits' writes in verify)
                moved = roof.refresh_bytes([context] * batch, s, policy, k)
            if phase == "draft":          # weights streamed, the selected rows gathered,
                # and what the policy reads besides, streamed: Quest's page bounds, which it
                # scores at every draft step (the roofline counts them with its selection)
                extra = roof.draft_step([context] * batch, s, policy).other_bytes \
                    + (scoring / k if rescored else 0.0)
                moved += extra
                floor = weights / stream + max(moved - extra - weights, 0.0) / gather \
                    + extra / stream
            else:
                floor = moved / stream
            row = {"batch": batch, "context": context, "mode": "phase", "policy": policy,
                   "phase": phase, "k": k, "s": s, "seconds": seconds / count, "bytes": moved,
                   "floor_seconds": floor, "share": seconds / total,
                   "gather_bandwidth": gather}
            rows.append(row)
            fraction = f"{floor * count / seconds:10.0%}" if moved else f"{'–':>10}"
            print(f"  {policy:>12} {phase:>9} {1e3 * seconds / count:8.3f} {moved / 1e6:9.1f} "
                  f"{1e3 * floor:9.3f} {fraction} {seconds / total:6.1%}")
        host = run.host_seconds / max(run.iterations, 1)      # overlaps the GPU: no share
        rows.append({"batch": batch, "context": context, "mode": "phase", "policy": policy,
                     "phase": "host",
                     "k": k, "s": s, "seconds": host, "bytes": 0.0, "floor_seconds": 0.0,
                     "share": None, "gather_bandwidth": gather})
        print(f"  {policy:>12} {'host':>9} {1e3 * host:8.3f}   (the loop's own CPU time an "
              f"iteration, beside the GPU's)")
        del engine, run
        release_memory()
    return rows


def release_memory() -> None:
    """Free what nothing references any more (graphs and compiled steps hold tensors in
    cycles) and hand the allocator's cache back, so the next engine's cache fits."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-8b",
                        help="catalogue model whose shapes run with random bf16 weights")
    parser.add_argument("--batch", default="4",
                        help="batch sizes (comma-separated): every batch at every context; a "
                             "cell that does not fit in memory is skipped with a note")
    parser.add_argument("--contexts", default="32768,131072",
                        help="tokens already in every sequence's cache (comma-separated)")
    parser.add_argument("--new-tokens", type=int, default=64,
                        help="tokens each timed plain run (the engine's and the peer's) decodes")
    parser.add_argument("--trace", default=None, help="specsim trace to replay (forced m)")
    parser.add_argument("--policy", default="vegas", help="the policy --trace replays")
    parser.add_argument("--ks", default="2,4,6,8,10,12",
                        help="draft lengths (comma-separated; --phases runs the first)")
    parser.add_argument("--ss", default="0.03,0.05,0.07,0.1",
                        help="sparsities (comma-separated; --phases runs the first)")
    parser.add_argument("--out", default="engine-benchmark.json",
                        help="JSON of every row (render it with --table), rewritten after "
                             "every cell; an existing file is continued with --resume, "
                             "never overwritten")
    parser.add_argument("--resume", action="store_true",
                        help="keep the cells --out already holds (a run cut short, or other "
                             "batches and contexts of the same model and settings) and "
                             "measure only the others")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script only")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="engine setting (repeatable): " + ", ".join(
                            f"{f}={'|'.join(map(str, c)).lower()}" for f, c in
                            EngineSettings.choices().items()))
    parser.add_argument("--peer", choices=["hf"], default=None,
                        help="also time the Hugging Face static-cache peer's plain step")
    parser.add_argument("--phases", action="store_true",
                        help="also split each policy's forced run by phase against its floors")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="policies of --phases (comma-separated)")
    parser.add_argument("--iterations", type=int, default=16,
                        help="forced iterations a --phases run times")
    parser.add_argument("--c2q", default=None,
                        help="each speculative configuration once per Collect-2-Query mode in "
                             "this list (rows,sum: the c2q setting's values), alternating in "
                             "one process (one compile); default: the settings' own")
    parser.add_argument("--table", nargs="+", metavar="JSON", default=None,
                        help="print the Markdown tables of these runs' outputs and stop (no "
                             "GPU); a later file's rows replace an earlier file's of the same "
                             "model, batch, context and kind (plain, peer, a policy's phases)")
    args = parser.parse_args(argv)
    if args.table:
        print(render_tables([json.loads(open(path).read()) for path in args.table]))
        return
    device = torch.device(args.device)
    settings = EngineSettings.parse(args.setting)
    rows, done = resumed(parser, args, settings)
    config = json.loads(catalog_file(f"{args.model}/config.json").read_text())
    model = build_model(config, weights="random", dtype=torch.bfloat16, device=device)
    model.prepare(settings)
    bandwidth = copy_bandwidth(device, 4.0 if device.type == "cuda" else 0.25)
    print(f"{args.model}, random bf16 weights; copy bandwidth {bandwidth / 1e12:.2f} TB/s; "
          f"engine settings {settings.to_json()}")
    cells = [(int(b), int(c)) for b in args.batch.split(",") for c in args.contexts.split(",")]
    if done:
        print(f"resuming {args.out}: {len(done)} cells already measured")
    ks = [int(k) for k in args.ks.split(",")]
    ss = [float(s) for s in args.ss.split(",")]
    c2qs = args.c2q.split(",") if args.c2q else [settings.c2q]
    trace = read_trace(args.trace) if args.trace else None
    for batch, context in cells:
        if (batch, context) in done:
            continue
        try:
            cell_rows(model, config, args, settings, batch, context, bandwidth, ks, ss, c2qs,
                      trace, rows)
        except torch.OutOfMemoryError:
            print(f"batch {batch}, context {context}: out of memory, the rest skipped")
            rows.append({"batch": batch, "context": context, "mode": "note",
                         "note": "out of memory"})
        release_memory()
        if device.type == "cuda":
            print(f"  held between cells: {torch.cuda.memory_allocated(device) / 2**30:.1f} GiB")
        done.append((batch, context))
        # after every cell, whole or not at all: a run cut short keeps what it measured, and
        # --resume goes on
        with atomic_writer(args.out) as fh:
            json.dump({"model": args.model, "batches": sorted({b for b, _ in done}),
                       "copy_bandwidth": bandwidth, "settings": settings.to_json(),
                       "engine": engine_provenance(settings), "arguments": cell_arguments(args),
                       "cells_done": sorted(done), "rows": rows}, fh, indent=2)
    print(f"wrote {args.out}")
    print(render_tables([json.loads(open(args.out).read())]))


#: The arguments that change what a cell measures: a resumed file's must be this run's.
CELL_ARGUMENTS = ("new_tokens", "ks", "ss", "phases", "policies", "iterations", "peer", "c2q",
                  "trace", "policy")


def cell_arguments(args) -> dict:
    return {name: getattr(args, name) for name in CELL_ARGUMENTS}


def resumed(parser, args, settings) -> tuple[list, list]:
    """The rows and (batch, context) cells ``--out`` already holds when ``--resume`` continues
    it (same model, settings and cell arguments), else none; an existing file without
    ``--resume`` is an error (one line), so no run overwrites another's rows. A file that
    records no cells or arguments (an older output) counts the cells of its rows."""
    if not os.path.exists(args.out):
        return [], []
    if not args.resume:
        parser.error(f"{args.out} exists: --resume to measure only the cells it lacks, or "
                     f"give another --out")
    try:
        prior = json.loads(open(args.out).read())
        rows = list(prior["rows"])
        cells = prior.get("cells_done") or sorted({(r["batch"], r["context"]) for r in rows})
        cells = [(int(b), int(c)) for b, c in cells]
    except (OSError, ValueError, KeyError, TypeError) as err:
        parser.error(f"--resume: {args.out} is not a bench_engine output "
                     f"({err.__class__.__name__}: {err})")
    recorded = dict(prior.get("settings") or {})
    # the retired settings as the file's engine ran them (its engine record, else what its
    # settings name) are the engine's now, or the file timed another engine
    engine = prior.get("engine") or {"settings": recorded}
    same = prior.get("model") == args.model and not retired_settings(engine) \
        and {k: v for k, v in recorded.items() if k not in RETIRED} == settings.to_json()
    if not same:
        parser.error(f"--resume: {args.out} holds {prior.get('model')} with settings "
                     f"{prior.get('settings')}, not {args.model} with {settings.to_json()}; "
                     f"give another --out")
    differ = {k: v for k, v in (prior.get("arguments") or {}).items()
              if cell_arguments(args).get(k) != v}
    if differ:
        parser.error(f"--resume: {args.out} was measured with "
                     + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in differ.items())
                     + "; give those or another --out")
    return rows, cells


def _pct(x) -> str:
    return "–" if x is None else f"{x:.0%}"


def render_tables(docs: list[dict]) -> str:
    """Markdown tables of one or more runs' JSON: the plain step against its floor beside the
    Hugging Face peer's, then per cell a column per policy: its draft step's and its verify's
    fractions of their floors and its selection's share of the iteration (the milliseconds,
    the fixed cost and the host time are in the JSON). A later run's rows replace an earlier
    one's of the same model, batch, context and kind (plain, peer, or a policy's phases): a
    re-run after a change."""
    groups: dict = {}                 # (model, batch, context) -> {kind: rows}
    for doc in docs:
        fresh: dict = {}
        for r in doc["rows"]:
            kind = ("phase", r["policy"]) if r["mode"] == "phase" else r["mode"]
            fresh.setdefault((doc["model"], r.get("batch"), r["context"]), {}) \
                .setdefault(kind, []).append(r)
        for cell, kinds in fresh.items():
            groups.setdefault(cell, {}).update(kinds)
    order = list(dict.fromkeys(doc["model"] for doc in docs))
    cells = sorted(groups.items(), key=lambda g: (order.index(g[0][0]), g[0][1] or 0, g[0][2]))
    policies = list(dict.fromkeys(kind[1] for _, kinds in cells for kind in kinds
                                  if isinstance(kind, tuple)))
    plain = ["| model | batch | context | engine ms/step | floor ms | floor/time | HF peer "
             "ms/step | engine/HF |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    phases = ["| model | batch | context | " + " | ".join(policies) + " |",
              "|---|---:|---:|" + "---:|" * len(policies)]
    for (model, batch, context), kinds in cells:
        head = f"| {model} | {batch} | {context} |"
        eng = (kinds.get("plain") or kinds.get("note") or [None])[0]
        hf = (kinds.get("hf-plain") or [None])[0]
        if eng is not None and "step_seconds" in eng:
            peer = "–" if hf is None else hf.get("note") or f"{1e3 * hf['step_seconds']:.2f}"
            ratio = "–" if hf is None or "step_seconds" not in hf else \
                f"{eng['step_seconds'] / hf['step_seconds']:.2f}"
            plain.append(f"{head} {1e3 * eng['step_seconds']:.2f} | "
                         f"{1e3 * eng['floor_seconds']:.2f} | "
                         f"{_pct(eng['floor_seconds'] / eng['step_seconds'])} | {peer} | "
                         f"{ratio} |")
        elif eng is not None:
            plain.append(f"{head} {eng['note']} | | | | |")
        if any(("phase", p) in kinds for p in policies):
            phases.append(head + "".join(f" {_phase_cell(kinds.get(('phase', p)))} |"
                                         for p in policies))
    return "\n".join(plain + ([""] + phases if policies else []))


def _phase_cell(rows) -> str:
    """"draft / verify / selection" of one policy at one cell: the first two as fractions of
    their floors, the last as its share of the iteration; a note where the run had one."""
    if not rows:
        return "–"
    note = next((r["note"] for r in rows if "note" in r), None)
    if note:
        return note
    mine = {r["phase"]: r for r in rows}

    def floor(name):
        row = mine.get(name)
        if row is None or not row["seconds"] or not row["bytes"]:
            return "–"
        return _pct(row["floor_seconds"] / row["seconds"])
    selection = mine.get("selection")
    share = "–" if selection is None or not selection["seconds"] else \
        f"{selection['share']:.1%}"
    return f"{floor('draft')} / {floor('verify')} / {share}"


def cell_rows(model, config, args, settings, batch: int, context: int, bandwidth: float, ks,
              ss, c2qs, trace, rows: list) -> None:
    """Everything asked for at one (batch, context), appended to ``rows`` as it is measured:
    the plain step against its floor, each policy's phases, the peer's plain step (its model
    built for the cell and freed after it), the trace's speculative replays."""
    device = model.lm_head.weight.device
    prompts = [[0] * context] * batch
    max_len = context + args.new_tokens * (max(ks) + 1) + max(ks) + 2
    engine = Engine(model, batch=batch, max_len=max_len, policy="full", k_max=1,
                    beyond_max_position=True, settings=settings)
    engine.generate(prompts, 4, speculative=False, prefill="random")  # warm-up, graphs
    plain = engine.generate(prompts, args.new_tokens, speculative=False, prefill="random")
    step = plain.decode_seconds / plain.iterations
    floor = (engine.weight_bytes + batch * (context + args.new_tokens / 2)
             * engine.kv_bytes_per_token) / bandwidth
    print(f"batch {batch}, context {context}: plain {plain.tokens_per_second:.0f} tokens/s, "
          f"{1e3 * step:.2f} ms/step, floor {1e3 * floor:.2f} ms ({floor / step:.0%})")
    rows.append({"batch": batch, "context": context, "mode": "plain",
                 "tokens_per_second": plain.tokens_per_second, "step_seconds": step,
                 "floor_seconds": floor, "timing": plain.timing})
    del engine
    if args.phases:           # before the peer: its model and graphs need memory besides
        # the gather floor: one draft step's selected rows of every layer's K and V as one
        # gather (what a single kernel would reach; per-layer gathers at a short context
        # are launch-bound, which is not the bandwidth floor)
        row_bytes = model.args.head_dim * 2
        cached = batch * context * model.args.num_kv_heads * 2 * model.args.num_layers
        gather = gather_bandwidth(device, row_bytes, min(cached, 1 << 24),
                                  fraction=float(args.ss.split(",")[0]))
        rows += phase_rows(model, args, settings, batch, context, bandwidth, gather)
    if args.peer == "hf":
        from hf_peer import hf_model
        peer = hf_model(config, device, torch.bfloat16 if device.type == "cuda"
                        else torch.float32)
        rows.append(hf_row(peer, args, batch, context, device, step, floor))
        del peer
        release_memory()
    if trace is None:
        return
    for s in ss:
        requests = [r for r in trace.requests if r.policy == args.policy and r.s == s]
        if not requests:
            print(f"  s={s}: no {args.policy} requests in the trace")
            continue
        for k, c2q in [(k, c) for k in ks for c in c2qs]:
            chosen = [truncate_trace(requests[b % len(requests)], k) for b in range(batch)]
            ids = forced_prompts(chosen, model.args.vocab_size, length=context)
            need = cache_positions(context, max(t.tokens for t in chosen) + 1, k)
            spec_engine = Engine(model, batch=batch, max_len=need, policy=args.policy, s=s,
                                 k_max=k, beyond_max_position=True,
                                 settings=settings.replace(c2q=c2q))
            warm = [truncate_trace(t, k) for t in chosen]
            for t in warm:   # a short replay first: compiles kernels, captures graphs
                t.k, t.m, t.context = t.k[:3], t.m[:3], t.context[:3]
            spec_engine.generate(ids, 1, forced=warm, prefill="random")
            result = spec_engine.generate(ids, 1, forced=chosen, prefill="random")
            speedup = result.tokens_per_second / plain.tokens_per_second
            print(f"  s={s} k={k} c2q {c2q}: {result.tokens_per_second:.0f} tokens/s, "
                  f"{result.tokens_per_iteration:.2f} tokens/iteration, "
                  f"speedup {speedup:.2f}x, split "
                  + ", ".join(f"{p} {v:.3f}s" for p, v in result.timing.items()))
            rows.append({"batch": batch, "context": context, "mode": args.policy, "s": s,
                         "k": k, "c2q": c2q, "tokens_per_second": result.tokens_per_second,
                         "tokens_per_iteration": result.tokens_per_iteration,
                         "speedup": speedup, "timing": result.timing})
            del spec_engine


def hf_row(peer, args, batch: int, context: int, device, engine_step: float,
           floor: float) -> dict:
    """The Hugging Face peer's plain step at ``context``: ``peer`` is (its model, config)."""
    from hf_peer import StaticDecoder, time_steps

    model, hf_config = peer
    try:
        decoder = StaticDecoder(model, hf_config, batch, context + args.new_tokens + 8,
                                graph=device.type == "cuda")
        decoder.fill(context)
        step = time_steps(decoder, args.new_tokens)
    except torch.OutOfMemoryError:
        print(f"batch {batch}, context {context}: hf static cache: out of memory")
        return {"batch": batch, "context": context, "mode": "hf-plain", "note": "out of memory"}
    finally:
        decoder = None
        release_memory()      # the captured graph and compiled step hold the static cache
    print(f"batch {batch}, context {context}: hf static cache {batch / step:.0f} tokens/s, "
          f"{1e3 * step:.2f} ms/step, floor {floor / step:.0%}; engine/hf step "
          f"{engine_step / step:.2f}")
    return {"batch": batch, "context": context, "mode": "hf-plain",
            "tokens_per_second": batch / step,
            "step_seconds": step, "floor_seconds": floor}


if __name__ == "__main__":
    main()
