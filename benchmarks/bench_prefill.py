"""The engine's prefill attention of one prompt on each of its paths (causal; a full layer's
attention sinks; a sliding window with sinks), against torch peers in the same run: SDPA's
causal kernel over the same products (the floor the sink path runs on) and FlexAttention
compiled (a block mask; the sinks folded in from its log-sum-exp; on the window path also the
time to build that mask for a new prompt length), at gpt-oss-20b's heads (64 query, 8 KV,
head_dim 64, window 128) and a dense model's (32 / 8 / 128).

Correctness first: every path and peer in bf16 against the fp32 definition on a short prompt.
Then each (heads, path, tokens) timed by CUDA events over a few calls (a call is tens of
milliseconds: no graph needed), with its query-key products and the rate they imply
(4·head_dim FLOPs a product).

    PYTHONPATH=. python3 benchmarks/bench_prefill.py --out $OUT/bench_prefill.json

``--tokens`` sets the prompt lengths (default 4K, 16K, 64K, 128K); ``--dry-run`` runs the
correctness check and one short timing on the CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F

from specsim.costs.prefill import attention_elements
from specsim.engine.attention import fold_sinks, prefill_attention

SHAPES = {"gpt-oss (64/8, d64)": (64, 8, 64), "dense (32/8, d128)": (32, 8, 128)}
WINDOW = 128
try:                            # torch ≥ 2.9 asks for the log-sum-exp this way
    from torch.nn.attention.flex_attention import AuxRequest
    LSE = {"return_aux": AuxRequest(lse=True)}
except ImportError:
    LSE = {"return_lse": True}


def definition(q, k, v, window, sinks):
    """fp32 prefill attention by its definition (row p reads keys p − W < n ≤ p; the sink in
    the denominator only)."""
    t, heads, dim = q.shape[1:]
    rep = heads // k.shape[2]
    keys, values = k[0].float().repeat_interleave(rep, 1), v[0].float().repeat_interleave(rep, 1)
    s = torch.einsum("thd,nhd->htn", q[0].float(), keys) / math.sqrt(dim)
    p = torch.arange(t, device=q.device)[:, None]
    n = torch.arange(t, device=q.device)[None, :]
    s = s.masked_fill(~((n <= p) & ((n > p - window) if window else True)), float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float()[:, None, None].expand(-1, t, 1)], -1)
    return torch.einsum("htn,nhd->thd", torch.softmax(s, -1)[..., :t], values)[None]


def flex_peer(compiled):
    """FlexAttention with a causal or sliding-window block mask; sinks folded in from its
    log-sum-exp (out · σ(lse − sink), exact)."""
    from torch.nn.attention.flex_attention import create_block_mask

    masks = {}

    def build(t, window, device):
        """The block mask of a ``t``-token prompt (what an engine on FlexAttention builds for
        each new prompt length)."""
        def mask(b, h, qi, ki):
            keep = qi >= ki
            return keep & (qi - ki < window) if window else keep
        # compiled on the GPU: built eagerly, a 128K mask's index grids run out of memory
        return create_block_mask(mask, None, None, t, t, device=device,
                                 _compile=device.type == "cuda")

    def run(q, k, v, window, sinks):
        t = q.shape[1]
        if (t, window) not in masks:
            masks[(t, window)] = build(t, window, q.device)
        out, aux = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                            block_mask=masks[(t, window)], enable_gqa=True, **LSE)
        lse = getattr(aux, "lse", aux)
        if sinks is not None:
            out = fold_sinks(out, lse, sinks)
        return out.transpose(1, 2)
    run.build = build
    return run


def timed(fn, repeats: int, cuda: bool) -> list[float]:
    fn()
    out = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="4096,16384,65536,131072")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench_prefill.json")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.dry_run
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    tokens = [64] if args.dry_run else [int(t) for t in args.tokens.split(",")]
    from torch.nn.attention.flex_attention import flex_attention
    flex = flex_peer(torch.compile(flex_attention) if cuda else flex_attention)
    paths = {"causal": (None, False), "sinks": (None, True), "window": (WINDOW, True)}
    gen = torch.Generator(device=device).manual_seed(0)
    checks, rows = [], []
    for shape, (heads, groups, dim) in SHAPES.items():
        t = 300
        q = torch.randn(1, t, heads, dim, device=device, generator=gen)
        k = torch.randn(1, t, groups, dim, device=device, generator=gen)
        v = torch.randn(1, t, groups, dim, device=device, generator=gen)
        sinks = torch.randn(heads, device=device, generator=gen)
        for path, (window, sunk) in paths.items():
            want = definition(q, k, v, window, sinks if sunk else None)
            candidates = {"engine": prefill_attention, "flex": flex}
            for name, fn in candidates.items():
                got = (fn(q.to(dtype), k.to(dtype), v.to(dtype), window=window,
                          sinks=sinks if sunk else None) if name == "engine" else
                       fn(q.to(dtype), k.to(dtype), v.to(dtype), window, sinks if sunk else None))
                err = float((got.float() - want).abs().max())
                checks.append({"shape": shape, "path": path, "impl": name, "max_abs_err": err})
                if err > (3e-2 if cuda else 1e-4):
                    raise SystemExit(f"{shape} {path} {name}: max error {err:.3g}")
        for t in tokens:
            q = torch.randn(1, t, heads, dim, device=device, dtype=dtype)
            k = torch.randn(1, t, groups, dim, device=device, dtype=dtype)
            v = torch.randn(1, t, groups, dim, device=device, dtype=dtype)
            for path, (window, sunk) in paths.items():
                s = sinks if sunk else None
                products = attention_elements(t, 0, window, sunk) * heads
                ideal = heads * (t * (t + 1) / 2 if window is None else
                                 t * window - window * (window - 1) / 2)
                impls = {"engine": lambda: prefill_attention(q, k, v, window=window, sinks=s),
                         "flex": lambda: flex(q, k, v, window, s)}
                if path == "window":        # the mask a new prompt length needs, built
                    impls["flex mask"] = lambda: flex.build(t, window, q.device)
                else:
                    impls["sdpa causal"] = lambda: F.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                        is_causal=True, enable_gqa=True)
                for name, fn in impls.items():
                    try:
                        ms = statistics.median(timed(fn, args.repeats, cuda))
                    except torch.OutOfMemoryError:
                        rows.append({"shape": shape, "path": path, "tokens": t, "impl": name,
                                     "ms": None, "note": "out of memory"})
                        continue
                    finally:
                        if cuda:
                            torch.cuda.empty_cache()
                    work = name != "flex mask"      # building a mask computes no products
                    rows.append({"shape": shape, "path": path, "tokens": t, "impl": name,
                                 "ms": ms, "products": (products if name == "engine" else ideal)
                                 if work else None,
                                 "tflops": 4 * dim * ideal / (ms * 1e-3) / 1e12 if work else None})
            del q, k, v
    env = {"gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(args.out, "w") as fh:
        json.dump({"environment": env, "checks": checks, "rows": rows}, fh, indent=1)
    print(f"{env['gpu']}, torch {env['torch']}, {env['date']}: correctness max |err| "
          f"{max(c['max_abs_err'] for c in checks):.3g}")
    print(f"{'shape':22s} {'path':7s} {'tokens':>7s} {'impl':12s} {'ms':>9s} "
          f"{'TFLOP/s (ideal products)':>24s}")
    for r in rows:
        ms = f"{r['ms']:.2f}" if r["ms"] is not None else r.get("note", "")
        rate = f"{r['tflops']:.0f}" if r.get("tflops") else ""
        print(f"{r['shape']:22s} {r['path']:7s} {r['tokens']:7d} {r['impl']:12s} {ms:>9s} "
              f"{rate:>24s}")


if __name__ == "__main__":
    main()
