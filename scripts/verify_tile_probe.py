"""Probe (GPU): does padding hd64's 32-row verify tile to 64 rows make it faster?

SmolLM2's verify (9 query / 3 KV heads, hd64) packs group × q rows per KV head: q = 6..10 give
18–30 rows, a 32-row tile (``DEFAULT_CONFIGS`` has no hd64 32-row collecting entry: the
fallback), q ≥ 11 a 64-row one with the same key block, warps and stages. In the H200
validation runs (batch 32, 2K–6.5K) q = 9 took 3.64 ms and q = 13 / 16 3.25 / 3.3 ms: more
rows, less time. hd128 showed the same (32 → 64 rows moves the dots onto wgmma: 3.80 → 4.22
TB/s). This times each q with the default tile and with ``block_m=64``, Collect-2-Query rows
and all rows collected, and checks the outputs agree; it prints one line per (q, collect).

    PYTHONPATH=. python3 scripts/verify_tile_probe.py [BATCH CONTEXT]
    PYTHONPATH=. python3 scripts/verify_tile_probe.py --dry-run   # CPU, interpreter, tiny
"""
import os
import sys
import time

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"     # before the kernels are defined

import numpy as np  # noqa: E402
import torch  # noqa: E402

from specsim.kernels.verify_attention import (new_logits_buffer, plan_verify,  # noqa: E402
                                              verify_attention)

DEVICE = "cpu" if DRY else "cuda"
DTYPE = torch.float32 if DRY else torch.bfloat16


def _time(fn, repeats, warmup):
    if DRY:
        repeats, warmup = 1, 0
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        if DRY:
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
            continue
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def main():
    args = [a for a in sys.argv[1:] if a != "--dry-run"]
    batch, context = (int(args[0]), int(args[1])) if len(args) > 1 else \
        (2, 256) if DRY else (32, 4096)
    heads, kv, hd = 9, 3, 64
    g = torch.Generator(device=DEVICE).manual_seed(0)
    max_len = context + 32
    k = torch.randn(batch, kv, max_len, hd, device=DEVICE, generator=g).to(DTYPE)
    v = torch.randn(batch, kv, max_len, hd, device=DEVICE, generator=g).to(DTYPE)
    base = torch.randint(context // 2, context, (batch,), device=DEVICE, generator=g)
    print(f"batch {batch}, contexts {context // 2}..{context}, 9/3 heads, hd64; ms per call")
    for collect in ("c2q", "all"):
        for q_len in (3, 9) if DRY else (3, 5, 6, 8, 9, 12, 13, 16):
            rows = None if collect == "c2q" else tuple(range(q_len))
            lengths = (base + q_len).int()
            q = torch.randn(batch, q_len, heads, hd, device=DEVICE, generator=g).to(DTYPE)
            times, outs, tiles = [], [], []
            for block_m in (None, 64):
                plan = plan_verify(batch, heads, kv, hd, q_len, max_len, collect_rows=rows,
                                   block_m=block_m, device=DEVICE)
                logits = new_logits_buffer(plan, max_len, device=DEVICE) if plan.collect_rows else None
                out = torch.full_like(q, float("nan"))
                call = lambda: verify_attention(q, k, v, lengths, plan, out=out,  # noqa: E731
                                                logits=logits)
                times.append(float(np.median(_time(call, 30, 5))) * 1e3)
                outs.append(out.float().clone())
                tiles.append(plan.block_m)
            err = float((outs[0] - outs[1]).abs().max())
            print(f"{collect:>4} q={q_len:>2}: tile {tiles[0]:>2} rows {times[0]:.3f}  "
                  f"tile {tiles[1]:>2} rows {times[1]:.3f}  ({times[1] / times[0] - 1:+.1%}; "
                  f"outputs differ by {err:.1e})")


if __name__ == "__main__":
    main()
