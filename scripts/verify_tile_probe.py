"""Probe (GPU): verify attention's tile and launch configuration where the calibrations show
steps between neighbouring q.

- SmolLM2 (9 query / 3 KV heads, hd64), batch 32: group × q rows per KV head; q = 6..10 use a
  32-row tile (no hd64 32-row collecting entry in ``DEFAULT_CONFIGS``: the fallback), q ≥ 11 a
  64-row one with the same key block, warps and stages. In the H200 validation runs q = 9 took
  3.64 ms and q = 13 / 16 3.25 / 3.3 ms: more rows, less time.
- Qwen3-8B (32 / 8 heads, hd128), batch 1, 32K (the calibration): Collect-2-Query verify at
  q = 6 / 8 (32-row tile) 9.7 / 9.9 ms against 7.5 at q = 4 and q = 12 / 16; all rows
  collected (last-token, SparseSpec-L) q = 9 / 13 / 16: 10.9 / 13.5 / 10.2 ms — q = 13 and 16
  share their config (64 rows), and q = 13 stores 52 of them under a row mask.

Times each q with the default plan and with variants (tile padded to 64 rows, 64-key blocks,
2 programs per SM), Collect-2-Query rows and all rows collected, and checks that every
variant's output equals the default's; one line per (collect, q).

    PYTHONPATH=. python3 scripts/verify_tile_probe.py [smollm2|qwen3-8b] [BATCH CONTEXT]
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

from specsim.calibrate import _time as calibration_time  # noqa: E402
from specsim.kernels.verify_attention import (new_logits_buffer, plan_verify,  # noqa: E402
                                              verify_attention)

DEVICE = "cpu" if DRY else "cuda"
DTYPE = torch.float32 if DRY else torch.bfloat16
SHAPES = {"smollm2": (9, 3, 64, 32, 4096, (3, 5, 6, 8, 9, 12, 13, 16)),
          "qwen3-8b": (32, 8, 128, 1, 32768, (4, 6, 8, 9, 12, 13, 16))}
VARIANTS = {"default": {}, "64 rows": {"block_m": 64},
            "64 rows, 64 keys": {"block_m": 64, "block_n": 64},
            "2 programs/SM": {"programs_per_sm": 2}}


def _time(fn, repeats, warmup):
    """Seconds per call: CUDA events, as the calibration times (``calibrate._time``); one
    wall-clock call in a dry run."""
    if DRY:
        start = time.perf_counter()
        fn()
        return [time.perf_counter() - start]
    return calibration_time(torch, fn, repeats, warmup)


def main():
    args = [a for a in sys.argv[1:] if a != "--dry-run"]
    name = args.pop(0) if args and args[0] in SHAPES else "smollm2"
    heads, kv, hd, batch, context, q_lens = SHAPES[name]
    if len(args) > 1:
        batch, context = int(args[0]), int(args[1])
    if DRY:
        batch, context, q_lens = 2, 256, (3, 9)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    max_len = context + 32
    k = torch.randn(batch, kv, max_len, hd, device=DEVICE, generator=g).to(DTYPE)
    v = torch.randn(batch, kv, max_len, hd, device=DEVICE, generator=g).to(DTYPE)
    base = torch.randint(context // 2, context + 1, (batch,), device=DEVICE, generator=g)
    print(f"{name}: batch {batch}, contexts {context // 2}..{context}, {heads}/{kv} heads, "
          f"hd{hd}; ms per call (tile rows × key block, splits)")
    for collect in ("c2q", "all"):
        for q_len in q_lens:
            rows = None if collect == "c2q" else tuple(range(q_len))
            lengths = (base + q_len).clamp(max=max_len).int()
            q = torch.randn(batch, q_len, heads, hd, device=DEVICE, generator=g).to(DTYPE)
            cells, ref = [], None
            for label, extra in VARIANTS.items():
                plan = plan_verify(batch, heads, kv, hd, q_len, max_len, collect_rows=rows,
                                   device=DEVICE, **extra)
                logits = new_logits_buffer(plan, max_len, device=DEVICE) \
                    if plan.collect_rows else None
                out = torch.full_like(q, float("nan"))
                call = lambda: verify_attention(q, k, v, lengths, plan, out=out,  # noqa: E731
                                                logits=logits)
                ms = float(np.median(_time(call, 30, 5))) * 1e3
                ref = out.float().clone() if ref is None else ref
                err = float((out.float() - ref).abs().max())
                cells.append(f"{label} {plan.block_m}×{plan.split.block_n}/"
                             f"{plan.split.num_splits} {ms:.3f}"
                             + (f" (differs {err:.0e})" if err > 2e-2 else ""))
            print(f"{collect:>4} q={q_len:>2}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
