"""Probe (GPU, under Nsight Compute): what the summed Collect-2-Query row costs in DRAM bytes.

Session 15 found the summed row's time moving from one CUDA graph to the next (hd128 128K q8:
497-617 us, off 474-510, c2q_sum_ab --harness), and staggering the KV heads' walks did not
steady it. Lead: the row's lines, touched by the eight KV heads' programs of a sequence, leave
L2 between touches, so each add can cost a DRAM read and write-back. This launches, eagerly
and ``--repeats`` times each, production's verify kernel collecting nothing ("off"), adding
into the per-sequence row ("sum") and session 13's plain per-KV-head store ("sum-kvhead", a
module copy from c2q_sum_ab), each checked against the reference first, so that

    ncu --clock-control none --cache-control none -k regex:_verify_kernel \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \\
        python3 scripts/c2q_counters.py

reads each launch's DRAM traffic (the row itself is 2 MB at batch 4, 128K: 16.8 MB per KV
head row). Without ncu it prints event-timed µs per launch.

    PYTHONPATH=. python3 scripts/c2q_counters.py --dry-run       # CPU, interpreter, tiny
"""
import argparse
import os
import sys

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"     # before the kernels are defined

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import c2q_sum_ab as ab  # noqa: E402

bk, production = ab.bk, ab.production


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="128:131072:8", help="head_dim:context:q")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if DRY:
        bk.DEVICE, bk.DTYPE, bk.DRY_RUN = "cpu", torch.float32, True
    device, batch = bk.DEVICE, 2 if DRY else 4
    head_dim, context, q_len = map(int, args.shape.split(":"))
    heads, kv_heads = (8, 2) if DRY else bk.HEADS[head_dim]
    context = 300 if DRY else context
    k, v = bk.Rotation(batch, kv_heads, context, head_dim).caches[0]
    lengths = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, q_len, heads, head_dim, device=device, dtype=bk.DTYPE)
    out = torch.empty_like(q)
    ref = production.verify_attention_reference(q, k, v, lengths, collect_rows=(
        production.default_collect_rows(q_len)))[1]
    per_kv = ref.reshape(batch, kv_heads, -1, context).sum(2)
    kvhead = ab.per_kv_head_module()
    # session 16: the same stores with an L2 evict_last hint, on the whole row and on a quarter
    # of its lines (the KV heads' programs store into 2 rows, kvh % 2; not checked): do the
    # hinted lines stay in L2 at 128K (DRAM writes near off's) yet the kernel still run 1.06x?
    kvhead_el = ab.per_kv_head_module("evict_last")
    kvhead_el_2of8 = ab.per_kv_head_module("evict_last", extra_edits=[ab.TWO_ROWS],
                                             tag="_2of8")

    def kv_rows():
        return torch.full((batch, kv_heads, 1, context), float("nan"), device=device)
    plans = {
        "off": (production, production.plan_verify(batch, heads, kv_heads, head_dim, q_len,
                                                   context, device=device), None, None),
        "sum": (production, production.plan_verify(
            batch, heads, kv_heads, head_dim, q_len, context, device=device, collect_rows=None,
            collect_sum=True), torch.full((batch, 1, 1, context), float("nan"), device=device),
            per_kv.sum(1)),
        "sum-kvhead": (kvhead, kvhead.plan_verify(
            batch, heads, kv_heads, head_dim, q_len, context, device=device, collect_rows=None,
            collect_sum=True), kv_rows(), per_kv),
        "sum-kvhead-el": (kvhead_el, kvhead_el.plan_verify(
            batch, heads, kv_heads, head_dim, q_len, context, device=device, collect_rows=None,
            collect_sum=True), kv_rows(), per_kv),
        "sum-kvhead-el-2of8": (kvhead_el_2of8, kvhead_el_2of8.plan_verify(
            batch, heads, kv_heads, head_dim, q_len, context, device=device, collect_rows=None,
            collect_sum=True), kv_rows(), None),
    }
    for name, (module, plan, rows, want) in plans.items():
        module.verify_attention(q, k, v, lengths, plan, out=out, logits=rows)
        if want is not None:
            ab.check_rows(name, rows, want, lengths)
        times = []
        for _ in range(args.repeats):
            if DRY:
                module.verify_attention(q, k, v, lengths, plan, out=out, logits=rows)
                times.append(0.0)
                continue
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            module.verify_attention(q, k, v, lengths, plan, out=out, logits=rows)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        print(f"{name}: " + " ".join(f"{t:.1f}" for t in times) + " us", flush=True)


if __name__ == "__main__":
    main()
