"""Decode-shaped linear layers on the GPU: specsim's skinny GEMM (``specsim.kernels.skinny_gemm``)
beside ``torch.nn.functional.linear`` (cuBLAS), measured in the same run, as TB/s on the weight
bytes and µs per call, for the fused projections of the models specsim ships.

    PYTHONPATH=. python3 benchmarks/bench_skinny_gemm.py --models qwen3-8b,smollm2-135m \\
        --rows 1,4,8,16,32,64 --out $OUT/skinny

Method as ``bench_kernels.py``: a CUDA graph of many calls replayed, median of the replays;
each call reads the next of enough weight copies (≥ 1 GB) that L2 (60 MB) cannot hold them.
The skinny kernel is swept over column blocks, K blocks and pipeline stages per shape (the
fastest is reported with its configuration); every configuration's output is checked against
an fp32 reference (bf16, relative error < 1e-2) before it is timed. ``--dry-run`` exercises the
script on the CPU (Triton interpreter, tiny shapes, timings meaningless).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kernels  # noqa: E402  (its timer and copy-bandwidth probe)

from specsim.kernels.skinny_gemm import (default_block_n, skinny_gemm,  # noqa: E402
                                         skinny_gemm_reference)
from specsim.specs import load_model  # noqa: E402

ROTATE_BYTES = 1.0e9


def projections(name: str) -> dict[str, tuple[int, int]]:
    """The engine's fused projections of a catalogue model: name -> (N, K) of the weight."""
    spec = load_model(name)
    h, d = spec.hidden_size, spec.head_dim
    q, kv = spec.num_heads * d, spec.num_kv_heads * d
    inter = spec.intermediate_size
    return {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * inter, h),
            "down": (h, inter), "lm_head": (spec.vocab_size, h)}


def run(args) -> dict:
    dev, dtype = bench_kernels.DEVICE, bench_kernels.DTYPE
    results = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu (dry run)",
               "torch": torch.__version__, "rows": []}
    copies = bench_kernels.copy_bandwidth()
    results["copy_tbps"] = max(copies.values())
    bench_kernels.log(f"{results['device']}; copy {results['copy_tbps']:.2f} TB/s")
    t0 = time.time()
    for model in args.models:
        for proj, (n, k) in projections(model).items():
            if args.dry_run:
                n, k = min(n, 96), min(k, 64)
            widths = args.block_n or sorted({default_block_n(n, dev),
                                             max(16, default_block_n(n, dev) // 2)})
            configs = list(itertools.product(widths, args.block_k, args.stages))
            nbytes = n * k * 2
            copies_n = max(2, int(ROTATE_BYTES // nbytes)) if not args.dry_run else 2
            weights = [torch.randn(n, k, device=dev).to(dtype) / k ** 0.5
                       for _ in range(copies_n)]
            turn = [0]

            def next_weight():
                turn[0] = (turn[0] + 1) % copies_n
                return weights[turn[0]]
            for m in args.rows:
                if time.time() - t0 > args.budget_s:
                    bench_kernels.log(f"time budget spent: skipping {model} {proj} M={m}")
                    continue
                x = torch.randn(m, k, device=dev).to(dtype)
                out = torch.empty(m, n, device=dev, dtype=dtype)
                ref = skinny_gemm_reference(x, weights[0])
                torch_us, _ = bench_kernels.time_us(lambda: F.linear(x, next_weight()))
                best = None
                for block_n, block_k, stages in configs:
                    kw = dict(block_n=block_n, block_k=block_k, num_stages=stages)
                    try:
                        got = skinny_gemm(x, weights[0], out=out, **kw)
                        error = float((got.float() - ref).norm() / ref.norm())
                        if error > 1e-2:
                            raise AssertionError(f"relative error {error:.1e}")
                        us, _ = bench_kernels.time_us(
                            lambda: skinny_gemm(x, next_weight(), out=out, **kw))
                    except Exception as exc:   # a config that does not fit or compile
                        bench_kernels.log(f"    {model} {proj} M={m} {kw}: "
                                          f"{type(exc).__name__}: {str(exc)[:80]}")
                        continue
                    if best is None or us < best[0]:
                        best = (us, kw, error)
                row = {"model": model, "proj": proj, "N": n, "K": k, "M": m,
                       "weight_bytes": nbytes, "torch_us": torch_us,
                       "torch_tbps": nbytes / torch_us / 1e6}
                if best:
                    row.update(skinny_us=best[0], skinny_tbps=nbytes / best[0] / 1e6,
                               skinny_config=best[1], skinny_error=best[2],
                               speedup=torch_us / best[0])
                results["rows"].append(row)
                bench_kernels.log(
                    f"{model:13s} {proj:8s} {n:6d}x{k:<6d} M={m:2d}  cuBLAS {torch_us:8.1f} us "
                    f"{row['torch_tbps']:5.2f} TB/s | skinny "
                    + (f"{best[0]:8.1f} us {row['skinny_tbps']:5.2f} TB/s "
                       f"({row['speedup']:.2f}x) {best[1]}" if best else "failed"))
            weights.clear()
            if dev == "cuda":
                torch.cuda.empty_cache()
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    parser.add_argument("--models", type=lambda s: s.split(","),
                        default=["qwen3-8b", "smollm2-135m"])
    parser.add_argument("--rows", type=ints, default=[1, 4, 16, 64])
    parser.add_argument("--block-n", type=ints, default=None,
                        help="column blocks to sweep (default: the kernel's default for the "
                             "shape and half of it)")
    parser.add_argument("--block-k", type=ints, default=[128, 256])
    parser.add_argument("--stages", type=ints, default=[3, 4])
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"))
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if args.dry_run:
        bench_kernels.DEVICE, bench_kernels.DTYPE, bench_kernels.DRY_RUN = \
            "cpu", torch.float32, True
        args.rows, args.block_k, args.stages = [1, 4], [32], [2]
    elif not torch.cuda.is_available():
        sys.exit("bench_skinny_gemm needs a CUDA GPU (or --dry-run)")
    results = run(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_skinny_gemm.json"), "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
