"""Probe (GPU): production's summed Collect-2-Query against its session-13 form, in one process.

Session 14 made ``collect_sum`` write one fp32 row per sequence by atomic adds across the KV
heads (``verify_attention``). This times, per shape, on production's own plans:

    off          production, collecting nothing
    sum          production, Vegas' summed row (one per sequence, atomic adds; zeroed per call)
    sum-bench    the same call as bench_kernels makes it (buffer from new_logits_buffer, its
                 25 ms graphs): session 14's table read 1.10x off where ``sum`` read 1.03x
    sum-kvhead   session 13's form, one row per KV head stored plainly (a copy of the kernel
                 module with the add turned back into a store)
    probe-seq    c2q_store_probe's sum-seq variant on the probe's plan (its ``probe-off`` beside)

each twice (the smaller median kept), every summed row checked against the reference first.

``--harness`` instead separates the two ways ``sum-bench`` differs from ``sum`` (session 15's
first run: 516 against 497 us at hd128 128K q8, bench_kernels' table 528): the buffer (NaN-filled
``torch.full`` or ``new_logits_buffer``'s ``torch.empty``) and the graph's length (8 or 25 ms of
calls), for ``off`` and ``sum`` alike, plus back-to-back launches without a graph ("events"),
and the plain-store rows per KV head beside them (``sum-kvhead`` in fp32, ``sum-kvhead-half``
in bf16: no atomics), every combination once per round, the rounds alternating the order; the
median over rounds is printed with the spread (max - min) beside it. Session 15 found that the
buffer and the graph length are not the cause: the summed row's time moves from one graph to
the next (1.02-1.34x off) where off repeats to 0.5%.

    PYTHONPATH=. python3 scripts/c2q_sum_ab.py                  # GPU
    PYTHONPATH=. python3 scripts/c2q_sum_ab.py --harness        # GPU: buffer x graph length
    PYTHONPATH=. python3 scripts/c2q_sum_ab.py --dry-run        # CPU, interpreter, tiny
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"     # before the kernels are defined

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
sys.path.insert(0, HERE)
import bench_kernels as bk  # noqa: E402
import c2q_store_probe as probe  # noqa: E402
# the module (``specsim.kernels.verify_attention`` as an attribute is the function)
production = importlib.import_module("specsim.kernels.verify_attention")

ADD = 'tl.atomic_add(c_ptrs + keys, row, mask=ok, sem="relaxed")'
#: an extra edit for ``per_kv_head_module``: the KV heads' programs store into two rows
#: (kvh % 2), a quarter of the lines at 8 KV heads (a diagnostic of the row's footprint: the
#: rows are then not checked)
TWO_ROWS = ("+ kvh * stride_gh", "+ (kvh % 2) * stride_gh")


def per_kv_head_module(store_eviction: str = "", extra_edits=(), tag: str = ""):
    """A copy of ``verify_attention`` whose collect_sum stores one row per KV head (session
    13's form) instead of adding into the sequence's row; ``store_eviction`` ("evict_last",
    ...) is the L2 eviction policy of those stores; ``extra_edits`` more (old, new) edits."""
    hint = f", eviction_policy={store_eviction!r}" if store_eviction else ""
    edits = [(ADD, f"tl.store(c_ptrs + keys, row, mask=ok{hint})"),
             ("c_ptrs = Logits + b * stride_gb          # one row per sequence",
              "c_ptrs = Logits + b * stride_gb + kvh * stride_gh"),
             ("            logits.zero_()          # the KV heads' programs add into it\n", ""),
             ("assert logits.shape[1:3] == (1, 1)", "assert logits.shape[2] == 1"),
             # a half-precision row too (the store casts): half the bytes written
             ("and logits.dtype == torch.float32",
              "and logits.dtype in (torch.float32, torch.bfloat16, torch.float16)")]
    name = "verify_attention_kvhead" + (f"_{store_eviction}" if store_eviction else "") + tag
    return patched_module(name, edits + list(extra_edits))


def patched_module(name, edits):
    """A copy of ``verify_attention`` under ``name`` with each (old, new) text edit made
    (exits when ``old`` is not in the file: production changed under the probe)."""
    text = open(production.__file__).read()
    for old, new in edits:
        if old not in text:
            raise SystemExit(f"verify_attention changed: {old!r} not found")
        text = text.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), name + ".py")
    with open(path, "w") as handle:
        handle.write(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module           # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def check_rows(name, got, want, lengths):
    """Exit unless each sequence's summed row ``got`` matches the reference's ``want``
    ([b, n] per sequence or [b, kv_heads, n] per KV head) to its own length (2e-2)."""
    for b, n in enumerate(lengths.tolist()):
        error = float((got[b].reshape(want.shape[1:-1] + (-1,))[..., :n].float()
                       - want[b, ..., :n]).norm() / want[b, ..., :n].norm())
        if not error <= 2e-2:
            raise SystemExit(f"{name}: summed row off by {error:.1e}")


def shape_inputs(shape, batch, device):
    """One probe shape ("head_dim:context:q"; the dry run: 8 query / 2 KV heads, 300 keys, the
    first sequence 37 shorter) as ``(head_dim, context, q_len, heads, kv_heads, rot, lengths,
    q, out, per_kv, per_seq)``: rotating KV caches, random queries, an output buffer and the
    reference's collected logits summed per KV head [b, kvh, n] and per sequence [b, n] on
    the first cache."""
    head_dim, context, q_len = map(int, shape.split(":"))
    heads, kv_heads = (8, 2) if DRY else bk.HEADS[head_dim]
    context = 300 if DRY else context
    rot = bk.Rotation(batch, kv_heads, context, head_dim)
    lengths = torch.full((batch,), context, dtype=torch.int32, device=device)
    if DRY:
        lengths[0] = context - 37             # ragged, not a block multiple
    q = torch.randn(batch, q_len, heads, head_dim, device=device, dtype=bk.DTYPE)
    out = torch.empty_like(q)
    k0, v0 = rot.caches[0]
    ref = production.verify_attention_reference(q, k0, v0, lengths, collect_rows=(
        production.default_collect_rows(q_len)))[1]
    per_kv = ref.reshape(batch, kv_heads, -1, context).sum(2)          # [b, kvh, n]
    return (head_dim, context, q_len, heads, kv_heads, rot, lengths, q, out, per_kv,
            per_kv.sum(1))


def harness_rounds(calls, rot, rounds, hows):
    """Median and spread over ``rounds`` of each call timed in graphs of 8 or 25 ms ("8ms",
    "25ms") and as back-to-back launches ("events"), as ``hows`` lists, each round in the order
    the last one reversed."""
    timings = [(f"{name} {how}", call, how) for name, call in calls.items() for how in hows]
    samples = {label: [] for label, _, _ in timings}
    for turn in range(rounds):
        for label, call, how in (timings if turn % 2 == 0 else timings[::-1]):
            def fn(call=call):
                k, v = rot.next()
                call(k, v)
            target = 8.0 if how == "8ms" else 25.0
            samples[label].append(bk.time_us(fn, target_ms=target, graph=how != "events")[0])
    return {label: {"median": statistics.median(values), "spread": max(values) - min(values),
                    "samples": values} for label, values in samples.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="128:131072:8,128:32768:8,128:131072:16,64:131072:8",
                        help="head_dim:context:q, comma-separated")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"))
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--harness", action="store_true",
                        help="time off and sum over buffer x graph length (see the docstring)")
    parser.add_argument("--rounds", type=int, default=3, help="--harness: rounds")
    parser.add_argument("--timings", default="8ms,25ms,events",
                        help="--harness: graphs of 8 / 25 ms of calls, back-to-back launches")
    args = parser.parse_args()
    if DRY:
        bk.DEVICE, bk.DTYPE, bk.DRY_RUN = "cpu", torch.float32, True
    device, batch = bk.DEVICE, 2 if DRY else 4
    kvhead = per_kv_head_module()
    results = []
    for shape in args.shapes.split(","):
        (head_dim, context, q_len, heads, kv_heads, rot, lengths, q, out, per_kv,
         per_seq) = shape_inputs(shape, batch, device)
        k0, v0 = rot.caches[0]
        summed = production.plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                        device=device, collect_rows=None, collect_sum=True)
        plain = production.plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                       device=device)
        kplan = kvhead.plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                   device=device, collect_rows=None, collect_sum=True)
        pplan = production.plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                       device=device, collect_rows=(), block_n=64 if DRY else 128,
                                       num_warps=4, num_stages=3, num_splits=4)
        rows = torch.full((batch, 1, 1, context), float("nan"), device=device)
        bench_rows = production.new_logits_buffer(summed, context, device=device)
        kv_rows = torch.full((batch, kv_heads, 1, context), float("nan"), device=device)
        seq_rows = probe.buffer(15, batch, heads, kv_heads, context, device, pplan)
        calls = {
            "off": lambda k, v: production.verify_attention(q, k, v, lengths, plain, out=out),
            "sum": lambda k, v: production.verify_attention(q, k, v, lengths, summed, out=out,
                                                            logits=rows),
            "sum-bench": lambda k, v: production.verify_attention(q, k, v, lengths, summed,
                                                                  out=out, logits=bench_rows),
            "sum-kvhead": lambda k, v: kvhead.verify_attention(q, k, v, lengths, kplan, out=out,
                                                               logits=kv_rows),
            "probe-seq": lambda k, v: (seq_rows.zero_(), probe.run_variant(
                15, pplan, q, k, v, lengths, out, seq_rows)),
            "probe-off": lambda k, v: probe.run_variant(0, pplan, q, k, v, lengths, out,
                                                        seq_rows),
        }
        checks = {"sum": (rows, per_seq), "sum-bench": (bench_rows, per_seq),
                  "sum-kvhead": (kv_rows, per_kv), "probe-seq": (seq_rows, per_seq)}
        if args.harness:
            empty_rows = production.new_logits_buffer(summed, context, device=device)
            # plain stores, one row per KV head: fp32 (session 13's form) and bf16 (fp16 in
            # the dry run: the interpreter has no bf16), no atomics
            half_rows = torch.full((batch, kv_heads, 1, context), float("nan"), device=device,
                                   dtype=torch.float16 if DRY else torch.bfloat16)
            calls = {"off": calls["off"], "sum": calls["sum"],
                     "sum-empty": lambda k, v: production.verify_attention(
                         q, k, v, lengths, summed, out=out, logits=empty_rows),
                     "sum-kvhead": calls["sum-kvhead"],
                     "sum-kvhead-half": lambda k, v: kvhead.verify_attention(
                         q, k, v, lengths, kplan, out=out, logits=half_rows)}
            checks = {"sum": (rows, per_seq), "sum-empty": (empty_rows, per_seq),
                      "sum-kvhead": (kv_rows, per_kv), "sum-kvhead-half": (half_rows, per_kv)}
            print("buffers (address mod 2 MiB): " + ", ".join(
                f"{n} {t.data_ptr() % (2 << 20):#x}" for n, t in
                (("sum", rows), ("sum-empty", empty_rows), ("out", out), ("k", k0))))
        line = {}
        for name, call in calls.items():
            call(k0, v0)
            if name in checks:
                check_rows(f"{shape} {name}", *checks[name], lengths)
            if not args.harness:
                def fn(call=call):
                    k, v = rot.next()
                    call(k, v)
                target = 25.0 if name == "sum-bench" else 8.0
                line[name] = min(bk.time_us(fn, target_ms=target)[0] for _ in range(2))
        if args.harness:
            line = harness_rounds(calls, rot, args.rounds, args.timings.split(","))
        results.append({"shape": shape, **line})
        if args.harness:
            print(f"hd{head_dim} {context // 1024}K q{q_len}: " + "  ".join(
                f"{n} {t['median']:.1f}±{t['spread']:.1f} "
                f"({t['median'] / line['off ' + n.split()[-1]]['median']:.3f})"
                for n, t in line.items()), flush=True)
        else:
            print(f"hd{head_dim} {context // 1024}K q{q_len}: " + "  ".join(
                f"{n} {us:.1f} ({us / line['off']:.3f})" for n, us in line.items()),
                flush=True)
        rot = None
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "c2q_sum_ab.json"), "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
