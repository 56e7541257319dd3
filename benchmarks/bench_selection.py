"""Benchmark each policy's selection refresh at the shape the engine ranks it, by every ranking
path: torch.topk, the radix kernel one program per row, the radix kernel spread over programs
per block of each row (chunked), and the path ``ranking="best"`` takes; Quest's rows also
ranked in registers by one program a row ("one block", where its pages fit one), its "one
program" in blocks of at most 1,024 pages, as longer rows are.

The engine refreshes every layer's lists at once after a verify (``DraftSelection.refresh``:
the layers folded into the batch), so a row count is layers × batch for Vegas' and
last-token's summed rows (fp32), layers × batch × KV heads for SparseSpec-L (the attention
mass of 3 bf16 rows per query head, k = 2, then its ranking; the mass pass is also timed
alone), while Quest ranks one layer's pages at every draft step (one row per KV head). A
row is as wide as the engine's cache for the context plus ``--room`` positions (generated
tokens and drafts; the cache is padded to whole pages and to 128 positions), its sequence
``context + room / 2`` long (halfway through filling the room, as the engine's sequences
are while they decode): a 2K context ranks rows of 2,176 tokens, 136 pages, 2,080 of them
(130 pages) in the sequence.
Random scores (SparseSpec-L's logits N(0, ``--logit-std``²): how peaked the mass is sets
how many candidates its ranking's first pass leaves, so its time); every path's lists are
checked against torch.topk's (Quest: against the one-program kernel's, as its torch path
scores pages in bf16 matmuls, the kernels in fp32). Times are the median of CUDA-graph
replays. Prints a Markdown table last and writes the rows to
``--out``.

    PYTHONPATH=. python benchmarks/bench_selection.py --contexts 131072,32768 --room 0

(the BENCHMARKS table's command).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time

import torch

from specsim.engine.decode import cache_length
from specsim.kernels import quest_select, sparsespec_select, vegas_select
from specsim.kernels.selection import attention_mass
from specsim.specs import load_model

import bench_kernels                   # its CUDA-graph timing (a sibling, as run from here)

#: (label, ranking, chunked): the paths timed; ``best`` is what the engine's default takes.
PATHS = (("topk", "topk", None), ("one program", "radix", False),
         ("chunked", "radix", True), ("best", "best", None))
#: Quest's one program per row with the row's keys in registers
#: (``topk_select.QUEST_ONE_BLOCK_MAX``), a column of its own for rows of at most
#: ``ONE_BLOCK_PAGES`` pages.
ONE_BLOCK = "one block"
ONE_BLOCK_PAGES = 8192


def same_lists(a, b) -> bool:
    """The same counts and the same positions within them (padding aside)."""
    (got, counts), (ref, ref_counts) = a, b
    if not torch.equal(counts, ref_counts):
        return False
    kept = torch.arange(got.shape[-1], device=got.device) < counts[..., None]
    return torch.equal(torch.where(kept, got, 0), torch.where(kept, ref, 0))


def median_us(fn) -> float:
    """Median µs per call of ``fn`` replayed from CUDA graphs (``bench_kernels.time_us``)."""
    return bench_kernels.time_us(fn)[0]


def time_paths(select, reference: str = "topk", extra: dict | None = None) -> dict:
    """Each path's µs and whether its lists equal the ``reference`` path's (a dry run times
    the one call that gives its lists); ``extra``: more paths, label -> (ranking, chunked,
    keyword arguments of ``select``)."""
    def run(ranking, chunked, **kw):
        start = time.perf_counter()
        lists = select(ranking, chunked, **kw)
        us = ((time.perf_counter() - start) * 1e6 if bench_kernels.DRY_RUN
              else median_us(lambda: select(ranking, chunked, **kw)))
        return lists, us
    ref = run(*next((r, c) for label, r, c in PATHS if label == reference))
    out = {}
    paths = [(label, ranking, chunked, {}) for label, ranking, chunked in PATHS]
    for label, (ranking, chunked, kw) in (extra or {}).items():
        paths.append((label, ranking, chunked, kw))
    for label, ranking, chunked, kw in paths:
        try:
            lists, us = ref if label == reference else run(ranking, chunked, **kw)
        except Exception as error:           # one path failing leaves the others' rows
            out[label] = {"error": f"{type(error).__name__}: {str(error)[:160]}"}
            continue
        out[label] = {"us": us, "same_lists": same_lists(lists, ref[0])}
    return out


def run_cell(spec, batch: int, context: int, s: float, device: str, generator,
             room: int = 0, logit_std: float = 1.0) -> list[dict]:
    """Every policy's rows of one (model, context, s): sequences of ``context + room // 2``
    tokens in rows as wide as the engine's cache for ``context + room`` positions;
    SparseSpec-L's logits of std ``logit_std``."""
    layers, heads, kv_heads = spec.full_layers, spec.num_heads, spec.num_kv_heads
    width = cache_length(context + room, spec.max_context or 2**31)
    length = context + room // 2
    lengths = torch.full((batch,), length, dtype=torch.int32, device=device)
    folded = lengths.repeat(layers)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=device, generator=generator).to(dtype)
    rows = []

    def add(policy, count, items, paths, **extra):
        rows.append({"model": spec.name, "batch": batch, "context": context,
                     "length": length, "s": s, "policy": policy, "rows": count,
                     "items": items, "paths": paths, **extra})

    summed = rand(layers * batch, 1, 1, width)
    add("vegas", layers * batch, width, time_paths(
        lambda r, c: vegas_select(summed, folded, s, ranking=r, chunked=c)))
    del summed
    logits = (rand(layers * batch, heads, 3, width) * logit_std).to(dtype)
    lse = torch.logsumexp(logits.float(), -1)
    mass_us = median_us(lambda: attention_mass(logits, lse, folded, kv_heads))
    add("sparsespec", layers * batch * kv_heads, width, time_paths(
        lambda r, c: sparsespec_select(logits, folded, s, kv_heads, lse=lse, ranking=r,
                                       chunked=c)),
        mass_us=mass_us, logit_bytes=logits.numel() * logits.element_size(),
        logit_std=logit_std)
    del logits, lse
    page = 16
    pages = math.ceil(width / page)
    q = rand(batch, heads, spec.head_dim, dtype=dtype)
    bounds = rand(batch, kv_heads, pages, page, spec.head_dim, dtype=dtype)
    low, high = bounds.amin(3), bounds.amax(3)
    del bounds

    def quest(ranking, chunked, one_block=False):   # "best": the engine's own choice
        return quest_select(q, low, high, lengths, s, max_context=width, ranking=ranking,
                            chunked=chunked, one_block=None if ranking == "best" else one_block)
    fits = pages <= ONE_BLOCK_PAGES
    add("quest", batch * kv_heads, pages, time_paths(
        quest, reference="one program",
        extra={ONE_BLOCK: ("radix", False, {"one_block": True})} if fits else None))
    return rows


def table(rows: list[dict]) -> str:
    """The Markdown table: a row per (model, context, s, policy), µs per path (* where its
    lists differ from the reference's)."""
    labels = [label for label, _, _ in PATHS] + [ONE_BLOCK]
    lines = ["| model | context | s | policy | rows × items | " + " | ".join(labels)
             + " | mass pass |", "|---|---:|---:|---|---|" + "---:|" * (len(labels) + 1)]
    for row in rows:
        cells = []
        for label in labels:
            path = row["paths"].get(label)
            cells.append("" if path is None else "fail" if "error" in path else
                         f"{path['us']:,.0f}{'' if path['same_lists'] else '*'}")
        mass = f"{row['mass_us']:,.0f}" if "mass_us" in row else ""
        lines.append(f"| {row['model']} | {row['context']:,} | {row['s']} | {row['policy']} | "
                     f"{row['rows']:,} × {row['items']:,} | " + " | ".join(cells)
                     + f" | {mass} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen3-8b,llama-3.2-3b",
                        help="catalogue models whose layer and head counts shape the rows")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--contexts", default="131072,32768,8192,2048",
                        help="tokens per sequence, comma-separated")
    parser.add_argument("--ss", default="0.03,0.1", help="sparsities, comma-separated")
    parser.add_argument("--room", type=int, default=64,
                        help="cache positions past the context (generated tokens and drafts), "
                        "half of them in the sequences; 0: rows exactly as wide as the "
                        "context, but for the page and 128-position padding")
    parser.add_argument("--logit-std", type=float, default=1.0,
                        help="spread of SparseSpec-L's random logits (1: about what random "
                        "weights give; real attention is more peaked, which leaves its "
                        "ranking fewer candidates)")
    parser.add_argument("--out", default="bench_selection.json", help="JSON of every row")
    parser.add_argument("--dry-run", action="store_true", help="exercise the script on the "
                        "CPU (Triton interpreter, 2-layer stand-ins, tiny contexts, timings "
                        "meaningless)")
    args = parser.parse_args(argv)
    if not args.logit_std > 0:
        parser.error(f"--logit-std must be positive, got {args.logit_std}")
    device = "cpu" if args.dry_run else "cuda"
    bench_kernels.DRY_RUN = args.dry_run   # one timed call on the CPU
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --dry-run)")
    contexts = [int(c) for c in args.contexts.split(",")] if not args.dry_run else [600]
    ss = [float(s) for s in args.ss.split(",")]
    generator = torch.Generator(device=device)
    generator.manual_seed(0)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)"
    print(f"{name}, torch {torch.__version__}", flush=True)
    rows = []
    for model in args.models.split(","):
        spec = load_model(model)
        if args.dry_run:                      # two layers of the model's heads
            spec = dataclasses.replace(spec, num_layers=2,
                                       layer_types=spec.layer_types[:1] * 2)
        for context in contexts:
            for s in ss:
                cell = run_cell(spec, args.batch, context, s, device, generator,
                                room=args.room, logit_std=args.logit_std)
                rows += cell
                for row in cell:
                    print(f"  {row['model']} {row['context']} s={row['s']} "
                          f"{row['policy']}: " + ", ".join(
                              f"{k} {v.get('us', float('nan')):.0f}" for k, v in
                              row["paths"].items()), flush=True)
                if device == "cuda":
                    torch.cuda.empty_cache()
    with open(args.out, "w") as handle:
        json.dump({"device": name, "args": vars(args), "rows": rows}, handle, indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
