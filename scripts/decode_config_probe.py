"""Probe (GPU): verify attention's launch configuration at each context, not only at 128K.

``DEFAULT_CONFIGS`` (verify_attention.py) were swept at batch 4, context 131,072. At 8K and
32K the decode step (q = 1) runs 2.76 / 3.92 TB/s where cuDNN's SDPA runs 3.67 / 4.36
(bench_kernels, session 10), and the engine's plain Qwen3-8B step at 32K sits at 85% of its
floor. This times, per (head_dim, context, q, collect mode), every key block × warps × stages
× number of KV chunks (splits) with both combines, checks each output against the default
plan's, and prints the default, the best and cuDNN side by side (achieved TB/s on KV bytes).

    PYTHONPATH=. python3 scripts/decode_config_probe.py --head-dims 128 --contexts 8192,32768,131072 --out DIR
    PYTHONPATH=. python3 scripts/decode_config_probe.py --dry-run     # CPU, interpreter, tiny
"""
import argparse
import itertools
import json
import math
import os
import sys
import time

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"     # before the kernels are defined

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench_kernels as bk  # noqa: E402
from specsim.kernels import split_kv  # noqa: E402
from specsim.kernels.sparse_attention import plan_sparse, sparse_attention  # noqa: E402
from specsim.kernels.verify_attention import (new_logits_buffer, plan_verify,  # noqa: E402
                                              verify_attention)

CASES = {128: [(1, "off"), (8, "off"), (8, "separate")], 64: [(1, "off"), (8, "off")]}


def parse_cases(text: str) -> list[tuple[int, str]]:
    """``"8:separate,8:main,16:main"`` -> [(8, "separate"), ...]: q and collect mode (off: no
    logits; separate / main: Collect-2-Query's default rows, computed in a second small tile
    or stored from the main tile under a row mask)."""
    cases = []
    for item in text.split(","):
        q, _, mode = item.partition(":")
        if mode not in ("off", "separate", "main") or not q.isdigit():
            raise SystemExit(f"--cases: expected q:off|separate|main items, got {item!r}")
        cases.append((int(q), mode))
    return cases


def grid(head_dim, context, batch_kv, dry):
    if dry:
        return [(64, 4, 2, n) for n in (1, 2)]
    blocks = (32, 64, 128) if head_dim == 128 else (64, 128, 256)
    out = []
    for block_n, warps, stages in itertools.product(blocks, (2, 4, 8), (3, 4)):
        n_blocks = math.ceil(context / block_n)
        for splits in (1, 2, 4, 8, 16, 32, 64, 128):
            # at least 2 blocks per chunk, at most ~16 programs per SM (132 SMs)
            if splits * 2 <= n_blocks and splits * batch_kv <= 16 * 132:
                out.append((block_n, warps, stages, splits))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dims", default="128")
    parser.add_argument("--contexts", default="8192,32768,131072")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", default="", help="query,KV heads (default: bench_kernels' "
                        "32,8 at hd128 and 64,8 at hd64), e.g. 9,3 for SmolLM2")
    parser.add_argument("--sparse", type=float, default=0.0, help="also the sparse draft "
                        "kernel at this fraction of the context (token-granular, sorted)")
    parser.add_argument("--budget-s", type=float, default=400.0)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"))
    parser.add_argument("--no-verify", action="store_true", help="only the sparse kernel")
    parser.add_argument("--cases", default="", help="q:mode list instead of the head dim's "
                        "defaults (modes off, separate, main), e.g. 8:separate,8:main,16:main "
                        "for Collect-2-Query's tile choice")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if DRY:
        bk.DEVICE, bk.DTYPE, bk.DRY_RUN = "cpu", torch.float32, True
    device, dtype = bk.DEVICE, bk.DTYPE
    t0 = time.time()
    rows, results = [], []
    for head_dim in map(int, args.head_dims.split(",")):
        heads, kv_heads = bk.HEADS[head_dim]
        if args.heads:
            heads, kv_heads = map(int, args.heads.split(","))
        if DRY:
            heads, kv_heads = 8, 2
        for context in map(int, args.contexts.split(",")):
            context = 300 if DRY else context
            batch = 2 if DRY else args.batch
            rot = bk.Rotation(batch, kv_heads, context, head_dim)
            lengths = torch.full((batch,), context, dtype=torch.int32, device=device)
            kv_bytes = 2 * batch * kv_heads * context * head_dim * 2
            cases = parse_cases(args.cases) if args.cases else CASES[head_dim]
            for q_len, mode in [] if args.no_verify else cases:
                q = torch.randn(batch, q_len, heads, head_dim, device=device, dtype=dtype)
                collect = () if mode == "off" else None
                tile = {} if mode == "off" else {"collect_separate": mode == "separate"}
                default = plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                      device=device, collect_rows=collect, **tile)
                logits = new_logits_buffer(default, context, device=device) \
                    if default.collect_rows else None
                k0, v0 = rot.caches[0]
                ref = verify_attention(q, k0, v0, lengths, default, logits=logits).float()
                timed = []

                def time_plan(plan, method):
                    split_kv.COMBINE = method
                    out = torch.empty_like(q)

                    def fn():
                        k, v = rot.next()
                        verify_attention(q, k, v, lengths, plan, out=out, logits=logits)
                    out.fill_(float("nan"))
                    verify_attention(q, k0, v0, lengths, plan, out=out, logits=logits)
                    error = float((out.float() - ref).norm() / ref.norm())
                    us, _ = bk.time_us(fn, target_ms=8, replays=5)
                    return us, error

                base_us, _ = time_plan(default, "loop")
                waves = plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                    device=device, collect_rows=collect, splits="waves", **tile)
                waves_us, _ = time_plan(waves, "loop")
                for block_n, warps, stages, splits in grid(head_dim, context, batch * kv_heads,
                                                           DRY):
                    if time.time() - t0 > args.budget_s:
                        break
                    try:
                        plan = plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                           device=device, collect_rows=collect,
                                           block_n=block_n, num_warps=warps,
                                           num_stages=stages, num_splits=splits, **tile)
                        us, error = time_plan(plan, "loop")
                    except Exception as exc:   # out of resources and the like
                        bk.log(f"  hd{head_dim} {context} q{q_len} {mode} "
                               f"{(block_n, warps, stages, splits)}: {type(exc).__name__}")
                        continue
                    timed.append((us, (block_n, warps, stages, splits), error))
                    results.append({"head_dim": head_dim, "context": context, "q": q_len,
                                    "mode": mode, "block_n": block_n, "warps": warps,
                                    "stages": stages, "splits": splits,
                                    "splits_planned": plan.split.num_splits, "combine": "loop",
                                    "us": us, "error": error})
                timed.sort()
                block = []
                for us, config, error in timed[:5]:   # the best five with the block combine
                    block_n, warps, stages, splits = config
                    plan = plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                       device=device, collect_rows=collect, block_n=block_n,
                                       num_warps=warps, num_stages=stages, num_splits=splits,
                                       **tile)
                    b_us, b_error = time_plan(plan, "block")
                    block.append((b_us, config, b_error))
                    results.append({"head_dim": head_dim, "context": context, "q": q_len,
                                    "mode": mode, "block_n": block_n, "warps": warps,
                                    "stages": stages, "splits": splits, "combine": "block",
                                    "us": b_us, "error": b_error})
                split_kv.COMBINE = "loop"
                best = timed[0] if timed else (math.nan, None, math.nan)
                best_block = min(block) if block else (math.nan, None, math.nan)
                worst_error = max([e for _, _, e in timed + block] or [math.nan])
                cudnn = math.nan
                if not DRY and q_len == 1:
                    qt = q.transpose(1, 2)

                    def sdpa():
                        k, v = rot.next()
                        with torch.nn.attention.sdpa_kernel(
                                torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                            torch.nn.functional.scaled_dot_product_attention(
                                qt, k, v, enable_gqa=True)
                    try:
                        cudnn, _ = bk.time_us(sdpa, target_ms=8, replays=5)
                    except Exception as exc:
                        bk.log(f"  cudnn: {type(exc).__name__}")

                def tbps(us):
                    return kv_bytes / (us * 1e-6) / 1e12 if us == us and us > 0 else math.nan
                d = default
                rows.append((f"hd{head_dim} {context // 1024}K q{q_len} {mode}",
                             f"{tbps(base_us):.2f} ({d.split.block_n},{d.num_warps},"
                             f"{d.num_stages},{d.split.num_splits})",
                             f"{tbps(waves_us):.2f} ({waves.split.block_n},{waves.num_warps},"
                             f"{waves.num_stages},{waves.split.num_splits})",
                             f"{tbps(best[0]):.2f} {best[1]}",
                             f"{tbps(best_block[0]):.2f} {best_block[1]}",
                             f"{tbps(cudnn):.2f}", f"{worst_error:.1e}", len(timed)))
                bk.log(" | ".join(map(str, rows[-1])))
            if args.sparse:
                rows.append(probe_sparse(args, rot, batch, heads, kv_heads, head_dim, context,
                                         results, t0))
                bk.log(" | ".join(map(str, rows[-1])))
            rot = None   # free the caches before the next context
            if not DRY:
                torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_config_probe.json"), "w") as handle:
        json.dump(results, handle, indent=1)
    print("\nTB/s on KV bytes; configs (block_n, warps, stages, splits); batch "
          f"{args.batch}; {time.time() - t0:.0f} s")
    print(f"{'case':24} {'default (sm)':22} {'default (waves)':22} {'best (loop combine)':28} "
          f"{'best (block combine)':28} {'cudnn':6} {'max err':8} n")
    for row in rows:
        print(f"{row[0]:24} {row[1]:22} {row[2]:22} {row[3]:28} {row[4]:28} {row[5]:6} "
              f"{row[6]:8} {row[7]}")


def probe_sparse(args, rot, batch, heads, kv_heads, head_dim, context, results, t0):
    """The sparse draft kernel over ``args.sparse · context`` sorted random positions per
    sequence: its default plan, whole-wave chunks, and a grid (TB/s on the selected bytes)."""
    device, dtype = bk.DEVICE, bk.DTYPE
    count = max(1, math.ceil(args.sparse * context))
    indices = torch.rand(batch, context, device=device).topk(count, -1).indices.int()
    indices = indices.sort(-1).values
    counts = torch.full((batch,), count, dtype=torch.int32, device=device)
    q = torch.randn(batch, heads, head_dim, device=device, dtype=dtype)
    nbytes = 2 * batch * kv_heads * count * head_dim * 2
    k0, v0 = rot.caches[0]
    default = plan_sparse(batch, heads, kv_heads, head_dim, count, device=device)
    ref = sparse_attention(q, k0, v0, indices, counts, default).float()

    def time_plan(plan):
        out = torch.full_like(q, float("nan"))
        sparse_attention(q, k0, v0, indices, counts, plan, out=out)
        error = float((out.float() - ref).norm() / ref.norm())

        def fn():
            k, v = rot.next()
            sparse_attention(q, k, v, indices, counts, plan, out=out)
        return bk.time_us(fn, target_ms=8, replays=5)[0], error

    def tbps(us):
        return nbytes / (us * 1e-6) / 1e12
    base_us, _ = time_plan(default)
    waves = plan_sparse(batch, heads, kv_heads, head_dim, count, device=device,
                        programs_per_sm=None)          # plan_splits' whole-wave count
    n_waves = waves.split.num_splits
    waves_us, _ = time_plan(waves)
    timed = []
    configs = [(64, 4, 3, 1)] if DRY else [
        (bn, w, st, n) for bn, w, st in itertools.product((64, 128), (4, 8), (2, 3, 4))
        for n in (1, 2, 4, 8, 12, 16, 24, 32, 64) if n * 2 <= math.ceil(count / bn)]
    for block_n, warps, stages, splits in configs:
        if time.time() - t0 > args.budget_s:
            break
        try:
            plan = plan_sparse(batch, heads, kv_heads, head_dim, count, device=device,
                               block_n=block_n, num_warps=warps, num_stages=stages,
                               num_splits=splits)
            us, error = time_plan(plan)
        except Exception as exc:
            bk.log(f"  sparse {(block_n, warps, stages, splits)}: {type(exc).__name__}")
            continue
        timed.append((us, (block_n, warps, stages, splits), error))
        results.append({"head_dim": head_dim, "context": context, "q": 1,
                        "mode": f"sparse {args.sparse:g}", "block_n": block_n, "warps": warps,
                        "stages": stages, "splits": splits,
                        "splits_planned": plan.split.num_splits, "us": us, "error": error})
    timed.sort()
    best = timed[0] if timed else (math.nan, None, math.nan)
    d = default
    return (f"hd{head_dim} {context // 1024}K sparse {args.sparse:g}",
            f"{tbps(base_us):.2f} ({d.split.block_n},{d.num_warps},{d.num_stages},"
            f"{d.split.num_splits})",
            f"{tbps(waves_us):.2f} (.., {n_waves})", f"{tbps(best[0]):.2f} {best[1]}", "-", "-",
            f"{max([e for _, _, e in timed] or [math.nan]):.1e}", len(timed))


if __name__ == "__main__":
    main()
