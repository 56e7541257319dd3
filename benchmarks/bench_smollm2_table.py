"""SmolLM2-135M with its real weights, free-running: self-speculative speedup over plain decoding
for every (k, s) at each batch size, on long prompts (BENCHMARKS.md's SmolLM2 table, batch
32–64, 8K context).

The prompts (token ids, ``traces/smollm2-prompt-ids-long.json``: 41 excerpts of 7.1K–7.9K
tokens, ``specsim trace --prompt-set long --max-prompt-tokens 7900 --export-prompts FILE``) go
through ``batch`` slots as one continuous batch of ``--requests`` answers (cycled), greedy,
128 new tokens each, measured as ``specsim validate`` measures (``specsim.validate.measure``:
one prefill per prompt shared by every configuration, a warm-up per configuration, the steady
window of full-batch iterations and the whole run). Speedup = tokens/s over plain decoding's in
the same process. On a GPU machine without the CLI, with SmolLM2's weights converted to a
folder (``specsim models fetch smollm2`` where the CLI is, then copied):

    PYTHONPATH=. python3 benchmarks/bench_smollm2_table.py --weights /root/smollm2 \\
        --batches 32,64 --out $OUT/smollm2-table.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

from specsim.validate import Setup, measure


def table_setups(prompts: list[tuple[str, list[int]]], batches: list[int], requests: int | None,
                 policy: str, ks: list[int], ss: list[float], max_new_tokens: int,
                 weights: str) -> list[Setup]:
    """One free-running setup per batch size: ``requests`` answers (default twice the slots)
    cycling through the prompts."""
    out = []
    for batch in batches:
        n = max(requests or 2 * batch, batch)
        chosen = [prompts[i % len(prompts)] for i in range(n)]
        out.append(Setup(f"smollm2-b{batch}", "smollm2-135m", "free", batch, [policy], ks, ss,
                         max_new_tokens=max_new_tokens, prompts=[t for _, t in chosen],
                         prompt_ids=[name for name, _ in chosen], weights=weights))
    return out


def speedup_rows(measured: dict) -> list[dict]:
    """Per setup and configuration: tokens/s (steady window, whole run), tokens per iteration
    and the speedups over the same setup's plain decoding."""
    rows = []
    for entry in measured["setups"]:
        plain, plain_whole = (entry["plain_tokens_per_second"],
                              entry["plain_tokens_per_second_whole_run"])
        for c in entry["configs"]:
            rows.append({"setup": entry["name"], "policy": c["policy"], "s": c["s"], "k": c["k"],
                         "tokens_per_second": c["tokens_per_second"],
                         "speedup": c["tokens_per_second"] / plain,
                         "speedup_whole_run": c["tokens_per_second_whole_run"] / plain_whole,
                         "tokens_per_iteration": c["tokens_per_iteration_whole_run"],
                         "plain_tokens_per_second": plain})
    return rows


def markdown(rows: list[dict]) -> str:
    """One table per setup: k down, s across, steady-state speedup (tokens per iteration)."""
    lines = []
    for setup in dict.fromkeys(r["setup"] for r in rows):
        mine = [r for r in rows if r["setup"] == setup]
        ss = sorted({r["s"] for r in mine})
        lines += [f"{setup}: plain {mine[0]['plain_tokens_per_second']:.0f} tokens/s "
                  f"(steady window); speedup (tokens per iteration)", "",
                  "| k | " + " | ".join(f"s = {s}" for s in ss) + " |",
                  "|---|" + "---|" * len(ss)]
        for k in sorted({r["k"] for r in mine}):
            cells = {r["s"]: f"{r['speedup']:.2f}× ({r['tokens_per_iteration']:.2f})"
                     for r in mine if r["k"] == k}
            lines.append(f"| {k} | " + " | ".join(cells.get(s, "–") for s in ss) + " |")
        best = max(mine, key=lambda r: r["speedup"])
        lines += ["", f"best: k = {best['k']}, s = {best['s']}: {best['speedup']:.2f}× "
                      f"(whole run {best['speedup_whole_run']:.2f}×)", ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default=None,
                        help="token ids (specsim trace --export-prompts); default: the shipped "
                             "traces/smollm2-prompt-ids-long.json")
    parser.add_argument("--weights", required=True, help="SmolLM2 safetensors folder")
    parser.add_argument("--batches", default="32,64")
    parser.add_argument("--requests", type=int, default=None,
                        help="answers per batch size (default: twice the slots)")
    parser.add_argument("--policy", default="vegas")
    parser.add_argument("--ks", default="2,4,6,8,10,12")
    parser.add_argument("--ss", default="0.03,0.05,0.07,0.1")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=None, help="only the first N")
    parser.add_argument("--max-prompt-tokens", type=int, default=None,
                        help="keep each prompt's last N tokens (CPU smoke runs)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default="smollm2-table.json")
    args = parser.parse_args(argv)
    if args.prompts is None:
        from specsim.shipped import shipped_path
        args.prompts = str(shipped_path("traces/smollm2-prompt-ids-long.json"))
    doc = json.load(open(args.prompts))
    prompts = [(p["id"], p["tokens"][-args.max_prompt_tokens:] if args.max_prompt_tokens
                else p["tokens"]) for p in doc["prompts"]][:args.num_prompts]
    setups = table_setups(prompts, [int(b) for b in args.batches.split(",")], args.requests,
                          args.policy, [int(k) for k in args.ks.split(",")],
                          [float(s) for s in args.ss.split(",")], args.max_new_tokens,
                          args.weights)
    plan = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "setups": [{"setup": dataclasses.asdict(s),
                        "configs": [{"policy": p, "s": s_, "k": k} for p in s.policies
                                    for s_ in s.ss for k in s.ks]} for s in setups]}
    measured = measure(plan, repeats=args.repeats, device=args.device)
    rows = speedup_rows(measured)
    with open(args.out, "w") as fh:
        json.dump({"prompts": args.prompts, "source": doc.get("source"), "measured": measured,
                   "rows": rows}, fh)
    print(markdown(rows))


if __name__ == "__main__":
    main()
