"""Benchmark specsim's kernels on a GPU against the memory limit and against torch peers.

Measures, in one run and for each (head_dim, context): the device-to-device copy bandwidth (the
ceiling), verify attention for q = 1..16 with and without Collect-2-Query, torch SDPA (cuDNN and
flash backends, enable_gqa=True), FlexAttention (block mask) and, where it is installed,
FlashInfer (its paged decode and prefill kernels) on the same shapes, sparse draft attention at
s = 0.07 beside torch gather + SDPA, and each selection policy's time as a fraction of one
verify pass. Bandwidth is the bytes of KV the kernel must read (the selected rows for
sparse drafts) over the median time; every timing replays a CUDA graph of many calls, rotating
over enough KV caches that L2 cannot hold them. Correctness is checked in bf16 against the torch
references first.

    PYTHONPATH=. python benchmarks/bench_kernels.py --head-dims 128 --contexts 131072 \\
        --q-lens 1,8,16 --no-check --budget-s 90     # BENCHMARKS' H200 kernel table
    PYTHONPATH=. python benchmarks/bench_kernels.py --sweep   # tune the launch configurations

Writes ``bench_kernels.json`` under ``$OUT`` (or ``--out``); prints a compact table last.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from specsim.kernels import (new_logits_buffer, plan_sparse, plan_verify, quest_select,
                             sparse_attention, sparse_attention_reference, sparsespec_select,
                             streamingllm_select, vegas_select, verify_attention,
                             verify_attention_reference)
from specsim.kernels.verify_attention import summed_logits

HEADS = {128: (32, 8), 64: (64, 8)}       # head_dim -> (query heads, KV heads)
ROTATE_BYTES = 1.5e9                      # rotate caches until this many bytes: >> L2 (60 MB)
DEVICE = "cuda"
DTYPE = torch.bfloat16
DRY_RUN = False                           # --dry-run: CPU, interpreter, tiny shapes, no timing
FLASHINFER_PAGE = 16                      # tokens per page of the FlashInfer peer's cache


def log(*args):
    print(*args, flush=True)


# -- timing ---------------------------------------------------------------------------------

def time_us(fn, target_ms: float = 25.0, replays: int = 7, graph: bool = True
            ) -> tuple[float, str]:
    """Median µs per call: a CUDA graph of many calls replayed ``replays`` times (events);
    ``graph=False``: back-to-back launches between events."""
    if DRY_RUN:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6, "dry-run"
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 3, 1e-3)
    calls = int(min(200, max(3, target_ms / estimate)))
    try:
        if not graph:
            raise RuntimeError("graph not wanted")
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            for _ in range(calls):
                fn()
        captured.replay()
        torch.cuda.synchronize()
        samples = []
        for _ in range(replays):
            start.record()
            captured.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / calls)
        return statistics.median(samples) * 1e3, "graph"
    except Exception as error:  # not capturable: fall back to back-to-back launches
        if graph is not False:
            log(f"    (no graph: {type(error).__name__}: {str(error)[:80]})")
        torch.cuda.synchronize()
        samples = []
        for _ in range(replays):
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / calls)
        return statistics.median(samples) * 1e3, "events"


def copy_bandwidth() -> dict:
    """Device-to-device copy of 2 GiB, bytes read + written per second (TB/s): ``copy_`` timed
    with events (the ceiling used; inside a CUDA graph a copy becomes a copy-engine memcpy
    node, which is slower), the same captured in a graph, and an elementwise kernel copy."""
    n = 1 << 30 if not DRY_RUN else 1 << 10  # 2 GiB of bf16
    src = torch.randn(n, device=DEVICE, dtype=DTYPE)
    dst = torch.empty_like(src)
    result = {}
    for name, fn, graph in (("copy_ events", lambda: dst.copy_(src), False),
                            ("copy_ graph", lambda: dst.copy_(src), True),
                            ("mul kernel", lambda: torch.mul(src, 1.0, out=dst), False)):
        us, _ = time_us(fn, target_ms=50, graph=graph)
        result[name] = 2 * n * 2 / (us * 1e-6) / 1e12
    return result


class Rotation:
    """Several KV caches of one shape, handed out in turn."""

    def __init__(self, caches):
        self.caches = caches
        self.turn = 0

    @classmethod
    def random(cls, batch, kv_heads, context, head_dim) -> "Rotation":
        """Enough random caches that together they overflow L2 (``ROTATE_BYTES``)."""
        one = 2 * batch * kv_heads * context * head_dim * 2
        copies = max(1, math.ceil(ROTATE_BYTES / one)) if not DRY_RUN else 1
        shape = (batch, kv_heads, context, head_dim)
        return cls([(torch.randn(shape, device=DEVICE, dtype=DTYPE),
                     torch.randn(shape, device=DEVICE, dtype=DTYPE)) for _ in range(copies)])

    def next(self):
        self.turn = (self.turn + 1) % len(self.caches)
        return self.caches[self.turn]

    def mapped(self, layout) -> "Rotation":
        """The same caches with each K and V laid out by ``layout`` (a copy)."""
        return Rotation([(layout(k), layout(v)) for k, v in self.caches])


def relative_error(out, ref) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


# -- one (head_dim, context) ----------------------------------------------------------------

def shape_tag(head_dim, context):
    return f"hd{head_dim} {context // 1024}K" if context >= 1024 else f"hd{head_dim} {context}"


def best_config(best, head_dim, q_len, group, mode="off"):
    """The swept config of ``mode`` whose tile height (group · q rows) is nearest to this q's
    (the collect-off one when ``mode`` was not swept; the plan's defaults when nothing was)."""
    for wanted in (mode, "off"):
        swept = [q for (d, q, m) in best if d == head_dim and m == wanted]
        if swept:
            nearest = min(swept, key=lambda q: abs(math.log2(max(16, group * q))
                                                   - math.log2(max(16, group * q_len))))
            return best[(head_dim, nearest, wanted)]
    return {}


def import_flashinfer():
    """FlashInfer's module, or why it cannot be the peer here (a one-line reason)."""
    try:
        import flashinfer
    except Exception as error:       # not installed, or installed without what it needs
        return None, f"flashinfer not importable ({type(error).__name__}: {str(error)[:120]})"
    return flashinfer, f"flashinfer {getattr(flashinfer, '__version__', '?')}"


def flashinfer_rows(flashinfer, batch, heads, kv_heads, head_dim, context, rot, lengths,
                    record, rows):
    """FlashInfer on the same shapes and KV values, in its own paged cache (pages of
    ``FLASHINFER_PAGE`` tokens, HND: [pages, kv_heads, page, head_dim]): its decode kernel at
    q = 1 and, at q = 8, its decode kernel's multi-token rows and its paged prefill with the
    bottom-right causal mask; each output checked against specsim's verify on the same
    cache. (Ours, [batch, kv_heads, len, head_dim], is its layout with one page per sequence,
    which leaves its scheduler no pages to split.)"""
    page = FLASHINFER_PAGE
    if context % page:
        rows["flashinfer"] = {"error": f"context {context} is not a multiple of {page}"}
        return
    pages = context // page

    paged = rot.mapped(lambda x: x.view(batch, kv_heads, pages, page, head_dim)
                       .transpose(1, 2).reshape(batch * pages, kv_heads, page, head_dim))
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE) * pages
    indices = torch.arange(batch * pages, dtype=torch.int32, device=DEVICE)
    last = lengths - (pages - 1) * page
    workspace = torch.zeros(256 << 20 if not DRY_RUN else 1024, dtype=torch.uint8,
                            device=DEVICE)
    for q_len, kind in ((1, "decode"), (8, "decode"), (8, "prefill")):
        name = f"flashinfer {kind} q={q_len}"
        q = torch.randn(batch, q_len, heads, head_dim, device=DEVICE, dtype=DTYPE)
        q_paged = q.reshape(batch * q_len, heads, head_dim)
        out = torch.empty_like(q_paged)
        try:
            start = time.time()
            if kind == "decode":
                wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    workspace, "HND", use_tensor_cores=True)
                wrapper.plan(indptr, indices, last, heads, kv_heads, head_dim, page,
                             q_data_type=DTYPE, kv_data_type=DTYPE, q_len_per_req=q_len)

                def run(cache):
                    wrapper.run(q_paged, cache, out=out, q_len_per_req=q_len)
            else:
                wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                    workspace, "HND", backend="fa2")
                wrapper.plan(torch.arange(batch + 1, dtype=torch.int32, device=DEVICE) * q_len,
                             indptr, indices, last, heads, kv_heads, head_dim, page,
                             causal=True, q_data_type=DTYPE, kv_data_type=DTYPE)

                def run(cache):
                    wrapper.run(q_paged, cache, out=out)
            run(paged.caches[0])
            if not DRY_RUN:
                torch.cuda.synchronize()
            first_s = time.time() - start
            ours = verify_attention(q, *rot.caches[0], lengths,
                                    plan_verify(batch, heads, kv_heads, head_dim, q_len,
                                                context, collect_rows=()))
            error = relative_error(out.view_as(q), ours)
            us, method = time_us(lambda: run(paged.next()))
        except Exception as failure:
            rows[name] = {"error": f"{type(failure).__name__}: {str(failure)[:200]}"}
            log(f"  {name}: failed ({rows[name]['error'][:100]})")
            continue
        record(name, us, method, extra={"first_call_s": first_s, "error_vs_verify": error})
        if error > 1e-2:
            log(f"  {name}: output differs from specsim's verify (relative error {error:.1e})")


def run_shape(args, head_dim, context, best, results, t0, flashinfer=None):
    heads, kv_heads = HEADS[head_dim]
    batch = args.batch
    group = heads // kv_heads
    tag = shape_tag(head_dim, context)
    rot = Rotation.random(batch, kv_heads, context, head_dim)
    lengths = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    kv_bytes = 2 * batch * kv_heads * context * head_dim * 2
    rows = {}

    def record(name, us, method, nbytes=kv_bytes, extra=None):
        entry = {"us": us, "tbps": nbytes / (us * 1e-6) / 1e12, "bytes": nbytes,
                 "timing": method, **(extra or {})}
        rows[name] = entry
        log(f"  {tag:14s} {name:28s} {us:9.1f} us  {entry['tbps']:5.2f} TB/s")

    # verify, our kernel
    verify_us = {}
    variants = (("", "off", ()), (" +c2q", "c2q-sep", None), (" +c2q main-tile", "c2q-main", None),
                (" +c2q sum", "c2q-sum", None), (" +all", "all", "all"),
                (" +all head-sum", "all-head-sum", "all"))
    for q_len in args.q_lens:
        for suffix, mode, collect in variants:
            if q_len not in ((8, 16) if suffix else (q_len,)):
                continue
            name = f"verify q={q_len}{suffix}"
            try:
                rows_collect = tuple(range(q_len)) if collect == "all" else collect
                config = best_config(best, head_dim, q_len, group,
                                     "off" if mode in ("c2q-sum", "all-head-sum") else mode)
                plan = plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                   collect_rows=rows_collect,
                                   collect_separate={"c2q-sep": True,
                                                     "c2q-main": False}.get(mode),
                                   collect_sum=mode == "c2q-sum",
                                   collect_head_sum=mode == "all-head-sum", **config)
                q = torch.randn(batch, q_len, heads, head_dim, device=DEVICE, dtype=DTYPE)
                out = torch.empty_like(q)
                logits = new_logits_buffer(plan, context, device=DEVICE) \
                    if plan.collect_rows else None

                def fn():
                    k, v = rot.next()
                    verify_attention(q, k, v, lengths, plan, out=out, logits=logits)
                us, method = time_us(fn)
            except Exception as error:
                rows[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
                log(f"  {tag:14s} {name}: failed ({rows[name]['error'][:100]})")
                continue
            extra = {"config": {"block_m": plan.block_m, "block_n": plan.split.block_n,
                                "num_splits": plan.split.num_splits,
                                "num_warps": plan.num_warps, "num_stages": plan.num_stages,
                                "collect_separate": plan.collect_separate}}
            if logits is not None:
                extra["logit_bytes"] = logits.numel() * logits.element_size()
            record(name, us, method, extra=extra)
            verify_us[(q_len, suffix)] = us
            logits = None  # free before the next variant allocates its own

    # torch SDPA peers (uniform lengths: SDPA has no ragged batch)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    for q_len in (1, 8):
        q = torch.randn(batch, heads, q_len, head_dim, device=DEVICE, dtype=DTYPE)
        # flash takes the bottom-right causal mask as a CausalBias; cuDNN an explicit one
        visible = (torch.arange(context, device=DEVICE)[None, :]
                   <= torch.arange(q_len, device=DEVICE)[:, None] + context - q_len)
        additive = torch.zeros(1, 1, q_len, context, device=DEVICE, dtype=DTYPE)
        additive.masked_fill_(~visible, float("-inf"))
        for backend_name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                                      ("flash", SDPBackend.FLASH_ATTENTION)):
            mask = None
            if q_len > 1:
                mask = additive if backend_name == "cudnn" else causal_lower_right(q_len,
                                                                                   context)

            def fn():
                k, v = rot.next()
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                          enable_gqa=True)
            try:
                us, method = time_us(fn)
                record(f"sdpa-{backend_name} q={q_len}", us, method)
            except Exception as error:
                rows[f"sdpa-{backend_name} q={q_len}"] = {"error": str(error)[:200]}
                log(f"  {tag:14s} sdpa-{backend_name} q={q_len}: failed "
                    f"({type(error).__name__}: {str(error)[:100]})")

    # FlexAttention peer (compiles once per shape: only at the contexts asked for)
    if (context in args.flex_contexts and time.time() - t0 < args.budget_s * 0.6
            and not DRY_RUN):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
        for q_len in (1, 8):
            offset = context - q_len

            def causal(b, h, q_idx, kv_idx):
                return kv_idx <= q_idx + offset
            q = torch.randn(batch, heads, q_len, head_dim, device=DEVICE, dtype=DTYPE)
            try:
                block_mask = create_block_mask(causal, None, None, q_len, context, device=DEVICE)

                def fn():
                    k, v = rot.next()
                    return flex(q, k, v, block_mask=block_mask, enable_gqa=True)
                compile_start = time.time()
                fn()
                torch.cuda.synchronize()
                us, method = time_us(fn)
                record(f"flex q={q_len}", us, method,
                       extra={"compile_s": time.time() - compile_start})
            except Exception as error:
                rows[f"flex q={q_len}"] = {"error": str(error)[:200]}
                log(f"  {tag:14s} flex q={q_len}: failed ({type(error).__name__}: "
                    f"{str(error)[:100]})")

    if flashinfer is not None:
        flashinfer_rows(flashinfer, batch, heads, kv_heads, head_dim, context, rot,
                        lengths, record, rows)

    # sparse draft attention at s = 0.07, token-granular random positions
    count = math.ceil(args.sparsity * context)
    capacity = count
    generator = torch.Generator(device=DEVICE)
    generator.manual_seed(0)
    random_keys = torch.rand(batch, kv_heads, context, device=DEVICE, generator=generator)
    per_head = random_keys.topk(count, dim=-1).indices.int()                  # unsorted
    per_head_sorted = per_head.sort(dim=-1).values
    per_seq_sorted = per_head_sorted[:, 0].contiguous()
    per_seq_unsorted = per_head[:, 0].contiguous()
    counts_seq = torch.full((batch,), count, dtype=torch.int32, device=DEVICE)
    counts_head = torch.full((batch, kv_heads), count, dtype=torch.int32, device=DEVICE)
    sparse_bytes = 2 * batch * kv_heads * count * head_dim * 2
    q1 = torch.randn(batch, heads, head_dim, device=DEVICE, dtype=DTYPE)
    out1 = torch.empty_like(q1)
    sparse_config = best.get((head_dim, 1, "sparse"), {})
    splan = plan_sparse(batch, heads, kv_heads, head_dim, capacity, **sparse_config)
    for name, indices, counts in (("sparse s=.07 seq sorted", per_seq_sorted, counts_seq),
                                  ("sparse s=.07 seq unsorted", per_seq_unsorted, counts_seq),
                                  ("sparse s=.07 kvhead sorted", per_head_sorted, counts_head)):
        def fn():
            k, v = rot.next()
            sparse_attention(q1, k, v, indices, counts, splan, out=out1)
        try:
            us, method = time_us(fn)
        except Exception as error:
            rows[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
            continue
        record(name, us, method, nbytes=sparse_bytes,
               extra={"config": {"block_n": splan.split.block_n, "num_splits":
                                 splan.split.num_splits, "num_warps": splan.num_warps,
                                 "num_stages": splan.num_stages}})
    gather_index = per_seq_sorted.long()[:, None, :, None].expand(-1, kv_heads, -1, head_dim)
    q1s = q1[:, :, None]

    def gather_sdpa():
        k, v = rot.next()
        return F.scaled_dot_product_attention(q1s, k.gather(2, gather_index),
                                              v.gather(2, gather_index), enable_gqa=True)
    us, method = time_us(gather_sdpa)
    record("gather+sdpa s=.07", us, method, nbytes=sparse_bytes)

    # selection policies, as a fraction of one verify pass (q = 8, Collect-2-Query on)
    verify_ref = verify_us.get((8, " +c2q")) or min(verify_us.values())
    logits2 = torch.randn(batch, heads, 2, context, device=DEVICE, dtype=DTYPE)
    logits16 = torch.randn(batch, heads, 16, context, device=DEVICE, dtype=DTYPE)
    lse16 = torch.randn(batch, heads, 16, device=DEVICE) + 12.0
    k0 = rot.caches[0][0]
    pages = k0.view(batch, kv_heads, context // 16, 16, head_dim)
    page_min, page_max = pages.amin(3), pages.amax(3)
    # c2q=sum: the verify wrote one fp32 row per sequence (the two rows' sum over every query
    # head); the refresh ranks it as it is
    summed = torch.randn(batch, 1, 1, context, device=DEVICE, dtype=torch.float32)
    selections = {"select streamingllm": lambda: streamingllm_select(lengths, args.sparsity,
                                                                     max_context=context),
                  "select vegas sum": lambda: vegas_select(summed, lengths, args.sparsity)}
    # radix: one program per row; (radix, chunked): each row spread over programs per block
    for suffix, ranking, chunked in (("", "topk", None), (" (radix)", "radix", False),
                                     (" (radix, chunked)", "radix", True)):
        selections.update({
            f"select vegas{suffix}": lambda r=ranking, c=chunked: vegas_select(
                logits2, lengths, args.sparsity, ranking=r, chunked=c),
            f"select sparsespec{suffix}": lambda r=ranking, c=chunked: sparsespec_select(
                logits16, lengths, args.sparsity, kv_heads, lse=lse16, ranking=r, chunked=c),
            f"select quest{suffix}": lambda r=ranking, c=chunked: quest_select(
                q1, page_min, page_max, lengths, args.sparsity, max_context=context,
                ranking=r, chunked=c),
        })
    for name, fn in selections.items():
        try:
            us, method = time_us(fn)
        except Exception as error:
            rows[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
            log(f"  {tag:14s} {name}: failed ({rows[name]['error'][:100]})")
            continue
        rows[name] = {"us": us, "timing": method, "fraction_of_verify": us / verify_ref}
        log(f"  {tag:14s} {name:34s} {us:9.1f} us  {us / verify_ref:5.2f} x verify")
    results[tag] = rows


# -- correctness and sweep ------------------------------------------------------------------

def check_correctness(batch, head_dim, context):
    heads, kv_heads = HEADS[head_dim]
    k = torch.randn(batch, kv_heads, context, head_dim, device=DEVICE, dtype=DTYPE)
    v = torch.randn_like(k)
    lengths = torch.tensor([context - 3 * i for i in range(batch)], dtype=torch.int32,
                           device=DEVICE)
    errors = {}
    # (q, separate tile, summed: "sum" a row per sequence, "heads" a row per collected row,
    # every row collected)
    for q_len, separate, summed in ((1, None, False), (8, True, False), (8, False, False),
                                    (16, True, False), (8, None, "sum"), (16, None, "sum"),
                                    (8, None, "heads")):
        plan = plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                           collect_rows=tuple(range(q_len)) if summed == "heads" else None,
                           collect_separate=separate, collect_sum=summed == "sum",
                           collect_head_sum=summed == "heads")
        q = torch.randn(batch, q_len, heads, head_dim, device=DEVICE, dtype=DTYPE)
        out = torch.full_like(q, float("nan"))
        logits = new_logits_buffer(plan, context, device=DEVICE).fill_(float("nan"))
        verify_attention(q, k, v, lengths, plan, out=out, logits=logits)
        ref, ref_logits, _ = verify_attention_reference(q, k, v, lengths,
                                                        collect_rows=plan.collect_rows)
        if summed:
            ref_logits = summed_logits(ref_logits, rows=summed == "sum")
        written = torch.cat([logits[b, ..., :n] for b, n in enumerate(lengths.tolist())], -1)
        expect = torch.cat([ref_logits[b, ..., :n] for b, n in enumerate(lengths.tolist())], -1)
        tile = {True: " sep", False: " main"}.get(separate, "") + (f" {summed}" if summed else "")
        errors[f"verify q={q_len}{tile}"] = relative_error(out, ref)
        errors[f"logits q={q_len}{tile}"] = relative_error(written, expect)
        assert torch.isfinite(out).all() and torch.isfinite(written).all()
    count = math.ceil(0.07 * context)
    indices = torch.rand(batch, context, device=DEVICE).topk(count, -1).indices.int()
    counts = torch.tensor([count - 5 * i for i in range(batch)], dtype=torch.int32,
                          device=DEVICE)
    q = torch.randn(batch, heads, head_dim, device=DEVICE, dtype=DTYPE)
    ref = sparse_attention_reference(q, k, v, indices, counts)
    out = sparse_attention(q, k, v, indices, counts,
                           plan_sparse(batch, heads, kv_heads, head_dim, count))
    errors["sparse"] = relative_error(out, ref)
    return errors


def sweep(args, head_dim, context, results):
    """Time block/warp/stage/split variants of each kernel (collect off, Collect-2-Query in a
    separate tile, in the main tile) and return the fastest config of each."""
    heads, kv_heads = HEADS[head_dim]
    batch = args.batch
    rot = Rotation.random(batch, kv_heads, context, head_dim)
    lengths = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    kv_bytes = 2 * batch * kv_heads * context * head_dim * 2
    best, table = {}, []

    def consider(key, config, us, nbytes):
        tbps = nbytes / (us * 1e-6) / 1e12
        table.append({"key": "/".join(map(str, key)), **config, "us": us, "tbps": tbps})
        if tbps > best.get(key, ({}, 0.0))[1]:
            best[key] = (config, tbps)

    configs = [(64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3)]
    if head_dim == 64:
        configs = [(64, 4, 3), (128, 4, 3), (128, 8, 3), (256, 8, 3)]
    for q_len in (1, 8, 16):
        q = torch.randn(batch, q_len, heads, head_dim, device=DEVICE, dtype=DTYPE)
        out = torch.empty_like(q)
        modes = ["off"] if q_len == 1 else ["off", "c2q-sep", "c2q-main"]
        for mode in modes:
            logits = None
            for block_n, warps, stages in configs:
                tiles = [None]
                if head_dim == 128 and q_len == 8 and mode == "off":
                    tiles = [None, 64]        # pad 32 rows to 64: wgmma instead of mma
                for block_m in tiles:
                    for per_sm in (1, 2, 4):
                        config = dict(block_n=block_n, num_warps=warps, num_stages=stages,
                                      programs_per_sm=per_sm)
                        if block_m:
                            config["block_m"] = block_m
                        try:
                            plan = plan_verify(
                                batch, heads, kv_heads, head_dim, q_len, context,
                                collect_rows=() if mode == "off" else None,
                                collect_separate=mode == "c2q-sep", **config)
                            if plan.collect_rows and logits is None:
                                logits = new_logits_buffer(plan, context, device=DEVICE)

                            def fn():
                                k, v = rot.next()
                                verify_attention(q, k, v, lengths, plan, out=out,
                                                 logits=logits)
                            us, _ = time_us(fn, target_ms=12, replays=5)
                        except Exception as error:
                            log(f"  sweep hd{head_dim} q={q_len} {mode} {config}: "
                                f"{type(error).__name__}")
                            continue
                        consider((head_dim, q_len, mode), config, us, kv_bytes)
            log(f"  sweep hd{head_dim} q={q_len} {mode}: "
                f"best {best.get((head_dim, q_len, mode))}")
            logits = None
    count = math.ceil(args.sparsity * context)
    indices = torch.rand(batch, context, device=DEVICE).topk(count, -1).indices.int()
    indices = indices.sort(-1).values
    counts = torch.full((batch,), count, dtype=torch.int32, device=DEVICE)
    q = torch.randn(batch, heads, head_dim, device=DEVICE, dtype=DTYPE)
    out = torch.empty_like(q)
    sparse_bytes = 2 * batch * kv_heads * count * head_dim * 2
    sparse_configs = [(64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 4, 4), (128, 8, 3)]
    if head_dim == 64:
        sparse_configs += [(256, 4, 3), (256, 8, 3)]
    for block_n, warps, stages in sparse_configs:
        for per_sm in (2, 4, 8):
            config = dict(block_n=block_n, num_warps=warps, num_stages=stages,
                          programs_per_sm=per_sm)
            try:
                plan = plan_sparse(batch, heads, kv_heads, head_dim, count, **config)

                def fn():
                    k, v = rot.next()
                    sparse_attention(q, k, v, indices, counts, plan, out=out)
                us, _ = time_us(fn, target_ms=12, replays=5)
            except Exception as error:
                log(f"  sweep hd{head_dim} sparse {config}: {type(error).__name__}")
                continue
            consider((head_dim, 1, "sparse"), config, us, sparse_bytes)
    log(f"  sweep hd{head_dim} sparse: best {best[(head_dim, 1, 'sparse')]}")
    results[f"sweep hd{head_dim}"] = table
    return {key: value[0] for key, value in best.items()}


def summary(results, copy_tbps, head_dims, contexts):
    lines = [f"copy bandwidth (read+write): {copy_tbps:.2f} TB/s",
             "each cell: TB/s on the KV bytes read, then µs (selection: time as a multiple "
             "of one verify q=8 +c2q pass)"]
    names = ["verify q=1", "verify q=2", "verify q=4", "verify q=8", "verify q=16",
             "verify q=8 +c2q", "verify q=8 +c2q main-tile", "verify q=8 +c2q sum",
             "verify q=8 +all", "verify q=16 +c2q", "verify q=16 +c2q main-tile",
             "verify q=16 +c2q sum",
             "verify q=16 +all",
             "sdpa-cudnn q=1", "sdpa-flash q=1", "sdpa-cudnn q=8", "sdpa-flash q=8",
             "flex q=1", "flex q=8", "flashinfer decode q=1", "flashinfer decode q=8",
             "flashinfer prefill q=8", "sparse s=.07 seq sorted", "sparse s=.07 seq unsorted",
             "sparse s=.07 kvhead sorted",
             "gather+sdpa s=.07", "select vegas", "select vegas sum", "select vegas (radix)",
             "select vegas (radix, chunked)", "select sparsespec",
             "select sparsespec (radix)", "select sparsespec (radix, chunked)",
             "select streamingllm", "select quest", "select quest (radix)",
             "select quest (radix, chunked)"]
    tags = [shape_tag(d, c) for d in head_dims for c in contexts]
    tags = [t for t in tags if t in results]
    lines.append(f"{'case':34s}" + "".join(f"{t:>15s}" for t in tags))
    for name in names:
        cells = []
        for tag in tags:
            entry = results[tag].get(name)
            if entry is None:
                cells.append(f"{'-':>15s}")
            elif "error" in entry:
                cells.append(f"{'fail':>15s}")
            elif "fraction_of_verify" in entry:
                cells.append(f"{entry['fraction_of_verify']:>14.2f}x")
            else:
                cells.append(f"{entry['tbps']:5.2f} {entry['us']:7.1f}".rjust(15))
        lines.append(f"{name:34s}" + "".join(cells))
    checks = []
    for tag in tags:
        rows = results[tag]
        try:
            q1, q8, q16 = (rows[f"verify q={q}"]["us"] for q in (1, 8, 16))
            c2q = rows["verify q=8 +c2q"]["us"]
            c2q16 = rows["verify q=16 +c2q"]["us"]
            summed = [rows.get(f"verify q={q} +c2q sum", {}).get("us", float("nan")) / ref
                      for q, ref in ((8, q8), (16, q16))]
            sdpa = [rows[n]["tbps"] for n in ("sdpa-cudnn q=1", "sdpa-flash q=1")
                    if "tbps" in rows.get(n, {})]
            checks.append(
                f"{tag}: q8 {rows['verify q=8']['tbps']:.2f} TB/s (>=3.5) | q16/q1 "
                f"{q16 / q1:.2f} (<=1.15) | q1 vs best sdpa "
                f"{rows['verify q=1']['tbps'] / max(sdpa) if sdpa else float('nan'):.2f} "
                f"(>=0.90) | c2q/off q8 {c2q / q8:.3f} q16 {c2q16 / q16:.3f} (sum "
                f"{summed[0]:.3f} / {summed[1]:.3f}) (<=1.05) | sparse "
                f"{rows['sparse s=.07 seq sorted']['tbps']:.2f} TB/s (>=2.5)")
        except (KeyError, ValueError):
            checks.append(f"{tag}: incomplete")
            continue
        peer = {q: min((rows[n]["us"] for n in (f"flashinfer decode q={q}",
                                                 f"flashinfer prefill q={q}")
                        if "us" in rows.get(n, {})), default=None) for q in (1, 8)}
        if all(peer.values()):
            checks.append(f"{tag}: FlashInfer's best time / verify's: q1 "
                          f"{peer[1] / rows['verify q=1']['us']:.2f}, q8 "
                          f"{peer[8] / rows['verify q=8']['us']:.2f} (>=1: verify faster)")
    return "\n".join(lines + ["targets:"] + checks)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--head-dims", type=lambda s: [int(x) for x in s.split(",")],
                        default=[128, 64])
    parser.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")],
                        default=[131072, 32768, 8192])
    parser.add_argument("--flex-contexts", type=lambda s: [int(x) for x in s.split(",")],
                        default=[131072])
    parser.add_argument("--q-lens", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 2, 4, 8, 16])
    parser.add_argument("--sparsity", type=float, default=0.07)
    parser.add_argument("--sweep", action="store_true", help="tune block/warp/split configs "
                        "on the longest context first and use the fastest")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--no-flashinfer", action="store_true",
                        help="leave out the FlashInfer peer even where it is installed (its "
                        "first call per kernel compiles it: minutes)")
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="skip remaining shapes past this many seconds")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"),
                        help="folder to write bench_kernels.json into (default: $OUT, else "
                             "benchmarks/out)")
    parser.add_argument("--dry-run", action="store_true", help="exercise the script on the "
                        "CPU (Triton interpreter, tiny shapes, timings meaningless)")
    args = parser.parse_args(argv)
    global DEVICE, DTYPE, DRY_RUN, HEADS
    if args.dry_run:                       # a quarter of the heads, the same groups
        DEVICE, DTYPE, DRY_RUN = "cpu", torch.float32, True
        HEADS = {d: (heads // 4, kv // 4) for d, (heads, kv) in HEADS.items()}
        args.batch, args.contexts, args.flex_contexts = 2, [256], []
    elif not torch.cuda.is_available():
        sys.exit("bench_kernels needs a CUDA GPU (or --dry-run)")
    t0 = time.time()
    name = torch.cuda.get_device_name(0) if not DRY_RUN else "cpu (dry run)"
    log(f"{name}, torch {torch.__version__}")
    results = {"device": name, "args": {k: v for k, v in vars(args).items()}}
    copies = copy_bandwidth()
    copy_tbps = max(copies["copy_ events"], copies["mul kernel"])
    results["copy_tbps"], results["copy_variants"] = copy_tbps, copies
    log("copy bandwidth (read+write): " + ", ".join(f"{k} {v:.2f} TB/s"
                                                    for k, v in copies.items()))
    if not args.no_check:
        for head_dim in args.head_dims:
            errors = check_correctness(args.batch, head_dim, min(max(args.contexts), 32768))
            results[f"errors hd{head_dim}"] = errors
            log(f"bf16 vs fp32 reference, hd{head_dim}: "
                + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
            assert all(e < 1e-2 for e in errors.values()), "kernel disagrees with reference"
    flashinfer, results["flashinfer"] = (None, "left out (--no-flashinfer)") \
        if args.no_flashinfer else import_flashinfer()
    log(results["flashinfer"])
    best = {}
    if args.sweep:
        for head_dim in args.head_dims:
            best.update(sweep(args, head_dim, max(args.contexts), results))
            torch.cuda.empty_cache()
        results["best"] = {"/".join(map(str, k)): v for k, v in best.items()}
    for context in args.contexts:           # longest first: the headline numbers
        for head_dim in args.head_dims:
            if time.time() - t0 > args.budget_s:
                log(f"time budget spent: skipping hd{head_dim} ctx{context}")
                continue
            run_shape(args, head_dim, context, best, results, t0, flashinfer)
            torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_kernels.json"), "w") as handle:
        json.dump(results, handle, indent=1, default=str)
    log(f"\ntotal {time.time() - t0:.0f} s")
    log(summary(results, copy_tbps, args.head_dims, args.contexts))


if __name__ == "__main__":
    main()
