"""Is Collect-2-Query a good proxy? Run a real model with Vegas' two collected verify rows and
with all k+1 rows, measuring the top-K overlap of the two rankings at every verify and layer.

For each (k, s) both rules draft the same long prompts (``specsim.engine.prompts``; one
prefill, reused): ``vegas`` ranks keys by the head-averaged logits of rows 1 and q − 1 of the
verify pass (first draft token, last token), ``vegas-all`` by all q = k + 1 rows, with the same
budget. Both run with the engine's proxy check on, so every verify also records, per layer,
``|A ∩ B| / K`` for the two top-K sets (recent window left out) split by key distance and
context length. Greedy decoding: both rules emit the same tokens; only the number of drafts
accepted per iteration differs. Writes a small JSON (per run and prompt: sums, not raw
entries) that ``specsim review --proxy FILE`` reads.

    python scripts/review_proxy.py --prompts 8 --ks 4,8,12 --ss 0.03,0.05,0.1 \\
        --max-new-tokens 128 --threads 2     # the shipped file (CPU, ~40 min)

``--model`` takes the models ``specsim models fetch`` knows (``specsim.engine.fetch.MODELS``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from specsim.engine import Engine, build_model
from specsim.engine import prompts as P
from specsim.engine.decode import cache_positions
from specsim.engine.fetch import MODELS, fetch_model
from specsim.engine.selection import DISTANCE_BANDS
from specsim.policies import get_policy
from specsim.review import CONTEXT_BINS, PROXY_VERSION, RULES, proxy_run_summary


def _list(text, kind):
    return [kind(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2",
                        help="a model `specsim models fetch` knows: " + ", ".join(MODELS))
    parser.add_argument("--prompts", type=int, default=6,
                        help="how many prompts of the default set (in its order)")
    parser.add_argument("--max-prompt-tokens", type=int, default=7000)
    parser.add_argument("--ks", default="4,8")
    parser.add_argument("--ss", default="0.03,0.05,0.1")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", default=None,
                        help="default: traces/review-proxy-<model folder>.json, e.g. "
                             "traces/review-proxy-smollm2-135m.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    ks, ss = _list(args.ks, int), _list(args.ss, float)

    folder = fetch_model(args.model, log=lambda m: print(m, file=sys.stderr))
    if args.out is None:
        args.out = os.path.join("traces", f"review-proxy-{folder.name}.json")
    net = build_model(folder, weights="real", dtype=torch.float32, device="cpu")
    tokenizer = P.Tokenizer(folder)
    specs = P.default_specs()[:args.prompts]
    prompts = [P.prompt_tokens(spec, tokenizer, args.max_prompt_tokens) for spec in specs]
    names = [spec.id for spec in specs]
    eos = net.args.eos_token_ids
    max_len = cache_positions(max(len(p) for p in prompts), args.max_new_tokens, max(ks))
    print(f"{len(prompts)} prompts, {min(map(len, prompts))}–{max(map(len, prompts))} tokens",
          file=sys.stderr)

    t0 = time.perf_counter()
    runs, state = [], None
    for k in ks:
        for s in ss:
            outputs = {}
            for rule in RULES:
                engine = Engine(net, batch=len(prompts), max_len=max_len, policy=rule, s=s,
                                k_max=k, proxy_check=True)
                result = engine.generate(prompts, args.max_new_tokens, k=k, eos_token_ids=eos,
                                         prefill=state, keep_prefill=state is None)
                state = state or result.prefill
                outputs[rule] = result.tokens
                for b, trace in enumerate(result.traces):
                    runs.append({
                        "rule": rule, "k": k, "s": s, "prompt": names[b],
                        "prompt_tokens": len(prompts[b]), "iterations": trace.iterations,
                        "accepted": int(trace.m.sum()), "m": trace.m.tolist(),
                        "context": trace.context.tolist(),
                        "proxy": proxy_run_summary(result.proxy, b, net.args.num_layers)})
                print(f"k={k} s={s:g} {rule:9s}: {result.tokens_per_iteration:.3f} tokens/iter, "
                      f"{len(result.proxy)} checks, {time.perf_counter() - t0:.0f} s",
                      file=sys.stderr)
            same = outputs["vegas"] == outputs["vegas-all"]
            for run in runs[-2 * len(prompts):]:
                run["same_output_as_other_rule"] = same
    out = {
        "specsim_proxy": PROXY_VERSION, "model": folder.name, "weights": "real",
        "dtype": "float32", "device": "cpu", "threads": args.threads, "sampling": "greedy",
        "max_new_tokens": args.max_new_tokens, "num_layers": net.args.num_layers,
        "recent": get_policy("vegas").recent, "distance_bands": list(DISTANCE_BANDS),
        "context_bins": list(CONTEXT_BINS),
        "collected_rows": "rows 1 and q-1 of the q = k+1 verify rows (first draft, last token)",
        "prompts": [{"id": n, "tokens": len(p)} for n, p in zip(names, prompts)],
        "command": "python scripts/review_proxy.py " + " ".join(argv or sys.argv[1:]),
        "seconds": round(time.perf_counter() - t0, 1), "runs": runs,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(out, fh, separators=(",", ":"))
        fh.write("\n")
    print(f"wrote {args.out} ({len(runs)} runs)", file=sys.stderr)


if __name__ == "__main__":
    main()
