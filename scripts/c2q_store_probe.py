"""Probe (GPU): where Collect-2-Query's cost goes at q = 8, and which store layout removes it.

Issue #3's bar: verify with Collect-2-Query on at most 5% slower than off (hd128, batch 4,
128K). Session 11's table: the separate tile cost +10%, the main tile +12% (session 12's
``gpu_round_k.sh probe``, best whole-wave configs), though the logits are only 3.1% of the KV
bytes at hd128 q = 8 (2 rows × 4 heads × 2 bytes against 512 bytes of K+V per key and KV head).
This times one verify kernel with its collect step swapped (``VARIANT``), every variant on the
same plan (128-key blocks, 4 warps, 3 stages, the q = 1 tile's whole-wave chunk count: 4 at
batch 4 × 8 KV heads; session 12's runs used it at q = 8, and at q = 16 the "sm" count, 5 / 16
chunks at hd128 / hd64), outputs checked against the production kernel and logits against
the reference (q ≥ 3):

    (prod-off, prod-rows, prod-sum: the production kernel on its own plans, off, per-head
    rows and collect_sum, each ratio to prod-off)
    0 off        no logits (the production kernel's cost floor)
    1 rows       production's separate tile: dot, bf16 [batch, heads, 2, n] (head-major rows)
    2 dot-only   the separate dot and the store, predicated off at run time (no bytes written)
    3 store-only no dot: a [16, block_n] tile made from the key index stored as in 1
    4 keys       transposed dot k·q_cᵀ [block_n, 16], bf16 [batch, kv_heads, n, group·2]
                 (key-major: one block's logits are one contiguous 2 KB run)
    5 late       1 with the store after the value load and the softmax update
    6 sum-main   fp32 Σ over the main tile's collected rows [batch, kv_heads, n]
    7 sum-sep    fp32 Σ over the separate tile's rows [batch, kv_heads, n]
    rows-l2      1 with every block of a program stored into the same [16, block_n] slot of a
                 0.5 MB buffer (wrong logits, no DRAM writes: is the cost the DRAM or the SM's
                 store path?)
    sum-l2       7 with every block of a program stored into one [block_n] fp32 slot (no DRAM
                 writes: is the summed row's cost its bytes or its work?)
    sum-nostore  7 with the store predicated off at run time (the dot and the sum only)
    sum-bf16     7 stored as bf16 (half the bytes)
    sum-seq      7 summed over the KV heads too, by fp32 atomic adds into one row per
                 sequence [batch, n] (an eighth of the bytes; the timed call zeroes it first)

    PYTHONPATH=. python3 scripts/c2q_store_probe.py --out DIR        # GPU
    PYTHONPATH=. python3 scripts/c2q_store_probe.py --dry-run        # CPU, interpreter, tiny
"""
import argparse
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
from specsim.kernels._runtime import tl, triton  # noqa: E402
from specsim.kernels.split_kv import combine, softmax_update, store_partial  # noqa: E402
from specsim.kernels.verify_attention import (new_logits_buffer, plan_verify,  # noqa: E402
                                              verify_attention, verify_attention_reference)

NAMES = ["off", "rows", "dot-only", "store-only", "keys", "late", "sum-main", "sum-sep",
         "prod-off", "prod-rows", "prod-sum", "rows-l2", "sum-l2", "sum-nostore", "sum-bf16",
         "sum-seq"]
PROBED = NAMES[:8] + NAMES[11:16]        # the probe kernel's variants (the rest: production)


@triton.jit
def _store(ptrs, value, mask, STORE: tl.constexpr):
    if STORE == 1:
        tl.store(ptrs, value, mask=mask, cache_modifier=".cs")
    elif STORE == 2:
        tl.store(ptrs, value, mask=mask, eviction_policy="evict_first")
    elif STORE == 3:
        tl.store(ptrs, value, mask=mask, cache_modifier=".wt")
    else:
        tl.store(ptrs, value, mask=mask)


@triton.jit
def _collect(s, k, q_c, keys, key_ok, c_rows, c_ok, crow, Logits, length, sm_scale,
             VARIANT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
             STORE: tl.constexpr):
    if VARIANT == 11:      # the same slot every block: the bytes stay in L2
        s_c = tl.dot(q_c, tl.trans(k))
        _store(c_rows[:, None] + (keys % BLOCK_N)[None, :], (s_c * sm_scale).to(tl.bfloat16),
               c_ok[:, None] & key_ok[None, :], STORE)
    elif VARIANT == 1 or VARIANT == 5:
        s_c = tl.dot(q_c, tl.trans(k))
        _store(c_rows[:, None] + keys[None, :], (s_c * sm_scale).to(tl.bfloat16),
               c_ok[:, None] & key_ok[None, :], STORE)
    elif VARIANT == 2:
        s_c = tl.dot(q_c, tl.trans(k))
        _store(c_rows[:, None] + keys[None, :], (s_c * sm_scale).to(tl.bfloat16),
               c_ok[:, None] & key_ok[None, :] & (length < 0), STORE)
    elif VARIANT == 3:
        fake = (keys[None, :] + crow[:, None]).to(tl.float32)
        _store(c_rows[:, None] + keys[None, :], fake.to(tl.bfloat16),
               c_ok[:, None] & key_ok[None, :], STORE)
    elif VARIANT == 6:
        _store(c_rows + keys, tl.sum(tl.where(c_ok[:, None], s, 0.0), 0) * sm_scale,
               key_ok, STORE)
    elif VARIANT == 7 or VARIANT >= 12:
        s_c = tl.dot(q_c, tl.trans(k))
        row = tl.sum(tl.where(c_ok[:, None], s_c, 0.0), 0) * sm_scale
        if VARIANT == 12:
            _store(c_rows + keys % BLOCK_N, row, key_ok, STORE)
        elif VARIANT == 13:
            _store(c_rows + keys, row, key_ok & (length < 0), STORE)
        elif VARIANT == 14:
            _store(c_rows + keys, row.to(tl.bfloat16), key_ok, STORE)
        elif VARIANT == 15:
            tl.atomic_add(c_rows + keys, row, mask=key_ok, sem="relaxed")
        else:
            _store(c_rows + keys, row, key_ok, STORE)


@triton.jit
def _probe_kernel(Q, K, V, Lengths, PartOut, PartLse, Logits,
                  stride_qb, stride_qt, stride_qh, stride_kb, stride_kh, stride_kt,
                  stride_gb, stride_gh, stride_gr, stride_gn,
                  split_size, num_splits, sm_scale,
                  NUM_KV_HEADS: tl.constexpr, Q_LEN: tl.constexpr, GROUP: tl.constexpr,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_C: tl.constexpr, ROW_A: tl.constexpr, ROW_B: tl.constexpr,
                  VARIANT: tl.constexpr, STORE: tl.constexpr, SPLIT_LOOPS: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = (pid // NUM_KV_HEADS).to(tl.int64)
    kvh = (pid % NUM_KV_HEADS).to(tl.int64)
    length = tl.load(Lengths + b)
    start = split * split_size
    end = tl.minimum(start + split_size, length)
    rows = tl.arange(0, BLOCK_M)
    head = kvh * GROUP + rows // Q_LEN
    tok = rows % Q_LEN
    row_ok = rows < GROUP * Q_LEN
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + tok[:, None] * stride_qt + head[:, None] * stride_qh
                + dims[None, :], mask=row_ok[:, None], other=0.0)
    q_pos = length - Q_LEN + tok
    qk_scale = sm_scale * 1.4426950408889634

    # the separate tile: row c = (head c // 2, collected token c % 2)
    crow = tl.arange(0, BLOCK_C)
    c_tok = tl.where(crow % 2 == 0, ROW_A, ROW_B)
    c_head = kvh * GROUP + crow // 2
    c_ok = crow < GROUP * 2
    q_c = tl.load(Q + b * stride_qb + c_tok[:, None] * stride_qt + c_head[:, None] * stride_qh
                  + dims[None, :], mask=c_ok[:, None], other=0.0)
    if VARIANT == 4:      # [b, kvh, n, c]: c = crow, keys along stride_gn
        c_rows = Logits + b * stride_gb + kvh * stride_gh + crow
    elif VARIANT == 12:   # one [BLOCK_N] fp32 slot per program
        c_rows = Logits + (pid * num_splits + split) * BLOCK_N
    elif VARIANT == 15:   # one row per sequence
        c_rows = Logits + b * stride_gb
    elif VARIANT == 6 or VARIANT == 7 or VARIANT == 13 or VARIANT == 14:
        c_rows = Logits + b * stride_gb + kvh * stride_gh
    elif VARIANT == 11:   # one [BLOCK_C, BLOCK_N] slot per program
        c_rows = Logits + ((pid * num_splits + split) * BLOCK_C + crow) * BLOCK_N
    else:                 # [b, h, i, n]
        c_rows = Logits + b * stride_gb + c_head * stride_gh + (crow % 2) * stride_gr
    if VARIANT == 6:
        c_ok = ((tok == ROW_A) | (tok == ROW_B)) & row_ok

    k_base = K + b * stride_kb + kvh * stride_kh
    v_base = V + b * stride_kb + kvh * stride_kh
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # whole blocks every row sees need no masks (as in production), then the tail
    open_end = tl.minimum(end, length - Q_LEN + 1)
    full_end = start + tl.maximum(open_end - start, 0) // BLOCK_N * BLOCK_N
    if not SPLIT_LOOPS:
        full_end = start
    for n0 in range(start, full_end, BLOCK_N):
        keys = n0 + offs_n
        key_ok = offs_n < BLOCK_N
        k = tl.load(k_base + keys[:, None] * stride_kt + dims[None, :])
        s = tl.dot(q, tl.trans(k))
        if VARIANT == 4:
            s_t = tl.dot(k, tl.trans(q_c))
            _store(c_rows[None, :] + keys[:, None] * stride_gn,
                   (s_t * sm_scale).to(tl.bfloat16), c_ok[None, :], STORE)
        elif VARIANT != 0 and VARIANT != 5:
            _collect(s, k, q_c, keys, key_ok, c_rows, c_ok, crow, Logits, length, sm_scale,
                     VARIANT, BLOCK_N, BLOCK_C, STORE)
        v = tl.load(v_base + keys[:, None] * stride_kt + dims[None, :])
        acc, m_i, l_i = softmax_update(acc, m_i, l_i, s, qk_scale, v)
        if VARIANT == 5:
            _collect(s, k, q_c, keys, key_ok, c_rows, c_ok, crow, Logits, length, sm_scale,
                     VARIANT, BLOCK_N, BLOCK_C, STORE)
    for n0 in range(full_end, end, BLOCK_N):
        keys = n0 + offs_n
        key_ok = keys < end
        k = tl.load(k_base + keys[:, None] * stride_kt + dims[None, :], mask=key_ok[:, None],
                    other=0.0)
        s = tl.dot(q, tl.trans(k))
        if VARIANT == 4:
            s_t = tl.dot(k, tl.trans(q_c))
            _store(c_rows[None, :] + keys[:, None] * stride_gn,
                   (s_t * sm_scale).to(tl.bfloat16), c_ok[None, :] & key_ok[:, None], STORE)
        elif VARIANT != 0 and VARIANT != 5:
            _collect(s, k, q_c, keys, key_ok, c_rows, c_ok, crow, Logits, length, sm_scale,
                     VARIANT, BLOCK_N, BLOCK_C, STORE)
        visible = (keys[None, :] <= q_pos[:, None]) & key_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        v = tl.load(v_base + keys[:, None] * stride_kt + dims[None, :], mask=key_ok[:, None],
                    other=0.0)
        acc, m_i, l_i = softmax_update(acc, m_i, l_i, s, qk_scale, v)
        if VARIANT == 5:
            _collect(s, k, q_c, keys, key_ok, c_rows, c_ok, crow, Logits, length, sm_scale,
                     VARIANT, BLOCK_N, BLOCK_C, STORE)
    if start < length:
        store_partial(PartOut, PartLse, pid * num_splits + split, acc, m_i, l_i,
                      BLOCK_M, HEAD_DIM)


def run_variant(variant, plan, q, k, v, lengths, out, logits, store=0, split_loops=True):
    """One probe launch on ``plan``'s split (chunks) and the combine, like verify_attention."""
    batch, q_len, heads, head_dim = q.shape
    split = plan.split
    if logits.dim() == 3:            # sums [b, kvh, n]
        strides = (logits.stride(0), logits.stride(1), 0, 1)
    elif variant == 4:               # key-major [b, kvh, n, c]
        strides = (logits.stride(0), logits.stride(1), 0, logits.stride(2))
    else:                            # head-major rows [b, h, 2, n]
        strides = logits.stride()
    grid = (batch * plan.num_kv_heads, split.num_splits)
    _probe_kernel[grid](
        q, k, v, lengths, plan.partial_out, plan.partial_lse, logits,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        *strides, split.split_size, split.num_splits, 1.0 / math.sqrt(head_dim),
        NUM_KV_HEADS=plan.num_kv_heads, Q_LEN=q_len, GROUP=plan.group, HEAD_DIM=head_dim,
        BLOCK_M=plan.block_m, BLOCK_N=split.block_n, BLOCK_C=max(16, plan.group * 2),
        ROW_A=1, ROW_B=q_len - 1, VARIANT=variant, STORE=store, SPLIT_LOOPS=split_loops,
        num_warps=plan.num_warps, num_stages=plan.num_stages)
    combine(plan.partial_out, plan.partial_lse, lengths, False, out, None, split,
            num_kv_heads=plan.num_kv_heads, q_len=q_len, group=plan.group)


def buffer(variant, batch, heads, kv_heads, n, device, plan=None):
    dtype = torch.float32 if DRY else torch.bfloat16
    if variant == 11:                # a slot per program (0.5 MB at batch 4 x 8 KV heads)
        programs = batch * kv_heads * plan.split.num_splits
        return torch.empty(programs, max(16, heads // kv_heads * 2), plan.split.block_n,
                           dtype=dtype, device=device)
    if variant == 12:                # a [block_n] fp32 slot per program
        programs = batch * kv_heads * plan.split.num_splits
        return torch.empty(programs, 1, plan.split.block_n, dtype=torch.float32, device=device)
    if variant == 15:                # one row per sequence
        return torch.empty(batch, 1, n, dtype=torch.float32, device=device)
    if variant in (6, 7, 13, 14):
        return torch.empty(batch, kv_heads, n, device=device,
                           dtype=dtype if variant == 14 else torch.float32)
    if variant == 4:
        return torch.empty(batch, kv_heads, n, heads // kv_heads * 2, dtype=dtype,
                           device=device)
    return torch.empty(batch, heads, 2, n, dtype=dtype, device=device)


def check_logits(variant, logits, ref_rows, kv_heads, lengths):
    """The worst relative error, over the sequences (each up to its own length), of a
    variant's logits against the reference rows [b, h, 2, n]; None where the variant writes
    no real logits. Variants 9 / 10 are production's rows / collect_sum (per sequence)
    buffers."""
    batch, heads, _, _ = ref_rows.shape
    if variant not in (1, 4, 5, 6, 7, 9, 10, 14, 15):
        return None
    worst = 0.0
    for b, length in enumerate(lengths.tolist()):
        ref = ref_rows[b, ..., :length].float()                       # [h, 2, n]
        if variant in (1, 5, 9):
            got = logits[b, ..., :length].float()
        elif variant == 4:
            got = logits[b, :, :length].float().reshape(kv_heads, length, heads // kv_heads, 2)
            got = got.permute(0, 2, 3, 1).reshape(heads, 2, length)
        elif variant in (10, 15):                # one sum per sequence, [1, n]
            got = logits[b].reshape(-1)[:length].float()
            ref = ref.reshape(-1, length).sum(0)
        else:                                    # sums per KV head, [kvh, n] or [kvh, 1, n]
            got = logits[b].reshape(kv_heads, -1)[:, :length].float()
            ref = ref.reshape(kv_heads, -1, length).sum(1)
        worst = max(worst, float((got - ref).norm() / ref.norm()))
    return worst


def wrong(error, logits_error) -> bool:
    """A NaN (an output or logit never written: the buffers start as NaN) counts as wrong."""
    return not error <= 2e-2 or (logits_error is not None and not logits_error <= 2e-2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dims", default="128,64")
    parser.add_argument("--contexts", default="131072,32768,8192")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--q-lens", default="8,16")
    parser.add_argument("--variants", default="off,rows,dot-only,store-only,keys,late,sum-main,"
                        "sum-sep", help="variant names, each optionally with suffixes: .cs "
                        ".ef .wt (store cache modifier / evict_first), .w8 (8 warps), .s4 "
                        "(4 stages), .masked (every block under key masks, one loop)")
    parser.add_argument("--block-n", type=int, default=128)
    parser.add_argument("--sum-configs", default="", help="also the production collect_sum "
                        "kernel on these block_n:warps:stages:splits plans, e.g. "
                        "128:4:3:4,64:4:3:8")
    parser.add_argument("--off-configs", default="", help="also the production kernel with "
                        "collecting off on these block_n:warps:stages:splits plans")
    parser.add_argument("--shared-kv", action="store_true", help="production's plans address "
                        "V with K's offsets (shared_kv_strides; the probe kernel always does)")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"))
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    shared = True if args.shared_kv else None
    if DRY:
        bk.DEVICE, bk.DTYPE, bk.DRY_RUN = "cpu", torch.float32, True
    device, dtype = bk.DEVICE, bk.DTYPE
    if min(map(int, args.q_lens.split(","))) < 3:
        raise SystemExit("--q-lens: the probe collects rows 1 and q - 1, so q >= 3")
    specs = args.variants.split(",")
    for spec in specs:
        if spec.split(".")[0] not in PROBED or not set(spec.split(".")[1:]) <= {
                "cs", "ef", "wt", "w8", "s4", "masked"}:
            raise SystemExit(f"--variants: unknown {spec!r} (names: {', '.join(PROBED)})")
    t0 = time.time()
    results, table = [], []
    for head_dim in map(int, args.head_dims.split(",")):
        heads, kv_heads = (8, 2) if DRY else bk.HEADS[head_dim]
        for context in map(int, args.contexts.split(",")):
            context = 300 if DRY else context
            batch = 2 if DRY else args.batch
            rot = bk.Rotation(batch, kv_heads, context, head_dim)
            k0, v0 = rot.caches[0]
            lengths = torch.full((batch,), context, dtype=torch.int32, device=device)
            if DRY:
                lengths[0] = context - 37             # ragged, not a block multiple
            kv_bytes = 2 * batch * kv_heads * context * head_dim * 2
            for q_len in map(int, args.q_lens.split(",")):
                q = torch.randn(batch, q_len, heads, head_dim, device=device, dtype=dtype)
                block_n = 64 if DRY else args.block_n
                # the q = 1 tile's whole-wave chunks (a WAVE_CONFIGS tile at both head dims),
                # at least 2: the probe kernel always writes partials
                chunks = plan_verify(batch, heads, kv_heads, head_dim, 1, context,
                                     device=device, collect_rows=(), splits="waves",
                                     block_n=block_n, num_warps=4, num_stages=3,
                                     ).split.num_splits
                plan = plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                   device=device, collect_rows=(), block_n=block_n,
                                   num_warps=4, num_stages=3, num_splits=max(2, chunks))
                ref_out = verify_attention(q, k0, v0, lengths, plan).float()
                rows = (1, q_len - 1)
                ref_rows = verify_attention_reference(q, k0, v0, lengths,
                                                      collect_rows=rows)[1]
                # the production kernel's own plans (whole waves), off and collecting
                prod = {8: (plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                        device=device, collect_rows=(),
                                        shared_kv_strides=shared), None)}
                cplan = plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                    device=device, collect_rows=rows, shared_kv_strides=shared)
                prod[9] = (cplan, new_logits_buffer(cplan, context, device=device))
                splan = plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                    device=device, collect_rows=rows, collect_sum=True,
                                    shared_kv_strides=shared)
                prod[10] = (splan, new_logits_buffer(splan, context, device=device))
                extra_specs = []
                for kind, configs in (("sum", args.sum_configs), ("off", args.off_configs)):
                    for text in filter(None, configs.split(",")):
                        bn, w, st, n = map(int, text.split(":"))
                        name = f"{kind} {text}"
                        NAMES.append(name) if name not in NAMES else None
                        try:
                            xplan = plan_verify(
                                batch, heads, kv_heads, head_dim, q_len, context,
                                device=device, collect_rows=rows if kind == "sum" else (),
                                collect_sum=kind == "sum", block_n=bn, num_warps=w,
                                num_stages=st, num_splits=min(n, -(-context // bn)),
                                shared_kv_strides=shared)
                        except Exception as exc:
                            bk.log(f"{name}: {type(exc).__name__}")
                            continue
                        prod[NAMES.index(name)] = (xplan, new_logits_buffer(
                            xplan, context, device=device) if kind == "sum" else None)
                        extra_specs.append(name)
                line = {}
                for spec in specs + ["prod-off", "prod-rows", "prod-sum"] + extra_specs:
                    variant = NAMES.index(spec.split(".")[0])
                    if variant in prod:
                        pplan, plog = prod[variant]
                        out = torch.full_like(q, float("nan"))
                        if plog is not None:
                            plog.fill_(float("nan"))
                        try:
                            verify_attention(q, k0, v0, lengths, pplan, out=out, logits=plog)
                        except Exception as exc:      # out of shared memory and the like
                            bk.log(f"{spec}: {type(exc).__name__}")
                            line[spec] = math.nan
                            continue
                        error = float((out.float() - ref_out).norm() / ref_out.norm())
                        lerr = None if plog is None else check_logits(
                            10 if pplan.collect_sum else 9, plog, ref_rows, kv_heads, lengths)
                        if wrong(error, lerr):
                            raise SystemExit(f"{spec} is wrong: output {error:.1e}, "
                                             f"logits {lerr}")

                        def fn():
                            k, v = rot.next()
                            verify_attention(q, k, v, lengths, pplan, out=out, logits=plog)
                        us, _ = bk.time_us(fn, target_ms=8, replays=7)
                        line[spec] = us
                        results.append({"head_dim": head_dim, "context": context, "q": q_len,
                                        "variant": spec, "us": us,
                                        "out_error": error, "logits_error": lerr,
                                        "shared_kv_strides": pplan.shared_kv_strides,
                                        "plan": [pplan.split.block_n, pplan.num_warps,
                                                 pplan.num_stages, pplan.split.num_splits,
                                                 pplan.collect_separate]})
                        bk.log(f"hd{head_dim} {context} q{q_len} {spec:10} "
                               f"{us:9.1f} us  out err {error:.1e}  logits err {lerr}")
                        continue
                    mods = set(spec.split(".")[1:])
                    store = 1 if "cs" in mods else 2 if "ef" in mods else 3 if "wt" in mods \
                        else 0
                    vplan = plan
                    if mods & {"w8", "s4"}:
                        vplan = plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                            device=device, collect_rows=(),
                                            block_n=plan.split.block_n,
                                            num_warps=8 if "w8" in mods else 4,
                                            num_stages=4 if "s4" in mods else 3,
                                            num_splits=plan.split.num_splits)
                    extra = {"store": store, "split_loops": "masked" not in mods}
                    out = torch.full_like(q, float("nan"))
                    logits = buffer(variant, batch, heads, kv_heads, context, device, vplan)
                    logits.fill_(float("nan"))
                    if variant == 15:        # atomic adds: start from zero (timed too)
                        logits.zero_()
                    try:
                        run_variant(variant, vplan, q, k0, v0, lengths, out, logits, **extra)
                    except Exception as exc:      # out of shared memory and the like
                        bk.log(f"hd{head_dim} {context} q{q_len} {spec}: "
                               f"{type(exc).__name__}")
                        line[spec] = math.nan
                        continue
                    error = float((out.float() - ref_out).norm() / ref_out.norm())
                    lerr = check_logits(variant, logits, ref_rows, kv_heads, lengths)

                    def fn():
                        k, v = rot.next()
                        if variant == 15:
                            logits.zero_()
                        run_variant(variant, vplan, q, k, v, lengths, out, logits, **extra)
                    us, _ = bk.time_us(fn, target_ms=8, replays=7)
                    line[spec] = us
                    results.append({"head_dim": head_dim, "context": context, "q": q_len,
                                    "variant": spec, "us": us,
                                    "tbps": kv_bytes / (us * 1e-6) / 1e12,
                                    "out_error": error, "logits_error": lerr,
                                    "plan": [vplan.split.block_n, vplan.num_warps,
                                             vplan.num_stages, vplan.split.num_splits]})
                    bk.log(f"hd{head_dim} {context} q{q_len} {spec:10} {us:9.1f} us"
                           f"  out err {error:.1e}  logits err {lerr}")
                    if wrong(error, lerr):
                        raise SystemExit(f"variant {spec} is wrong")
                table.append((f"hd{head_dim} {context // 1024}K q{q_len}", line))
            rot = None
            if not DRY:
                torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "c2q_store_probe.json"), "w") as handle:
        json.dump(results, handle, indent=1)
    print(f"\nµs per verify call and ratio to off; {time.time() - t0:.0f} s")
    shown = specs + ["prod-off", "prod-rows", "prod-sum"] + [
        f"sum {t}" for t in filter(None, args.sum_configs.split(","))] + [
        f"off {t}" for t in filter(None, args.off_configs.split(","))]
    print("ratio: each variant to the probe's off on the same loop structure and plan, "
          "prod-rows to prod-off")
    print(f"{'case':18}" + "".join(f"{v:>18}" for v in shown))
    for case, line in table:
        def ratio(v):
            base = "prod-off" if v.startswith(("prod-", "sum ", "off ")) else \
                "off.masked" if v.endswith(".masked") and "off.masked" in line else "off"
            return line.get(v, math.nan) / line.get(base, math.nan)
        print(f"{case:18}" + "".join(f"{line.get(v, math.nan):9.1f} ({ratio(v):5.3f})"
                                     for v in shown))


if __name__ == "__main__":
    main()
