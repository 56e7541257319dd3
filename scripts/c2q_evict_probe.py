"""Probe (GPU): is Collect-2-Query's cost the row's DRAM write-back during the KV stream?

Session 15 and round R (session 16) timed every form of Vegas' row at 1.05-1.12x the verify
pass that collects nothing (hd128 128K q8), whatever its bytes: a fp32 row per sequence by
atomic adds (2 MB at batch 4), a fp32 row per KV head by plain stores (16.8 MB), a bf16 one
(8.4 MB). Stores that all land in one L2-resident slot cost nothing (c2q_store_probe rows-l2,
1.000x), so the lead is the written lines leaving L2 while the kernel streams 2 GB of KV.
This times, in one process, with rounds alternating their order (graphs of 8 ms of calls):

    off            production, collecting nothing
    off+fill       off, then a fill of a 16.8 MB buffer (the per-KV-head rows' bytes written
                   outside the kernel; rotating buffers)
    sum            production: one fp32 row per sequence, atomic adds, one buffer
    sum-rot        the same over rotating row buffers (more than L2 holds), as the engine's
                   [layers, batch, 1, 1, n] buffer is walked layer by layer
    kv32           a fp32 row per KV head, plain stores (session 13's form), one buffer
    kv32-el        the same stores with an L2 evict_last hint
    kv32-el-rot    evict_last over rotating buffers
    kv16-el        a bf16 row per KV head, evict_last, one buffer
    kv32-el-2of8   kv32-el with the KV heads' programs storing into 2 rows only (kvh % 2): a
                   quarter of the lines, the same stores (a diagnostic: the row is not checked)
    sum-red        the summed row by an inline-PTX ``red`` instead of ``tl.atomic_add``, issued
                   from the reduced row's own layout by lanes 0-3 of each warp (the separate
                   tile's mma layout holds each column in the 8 lanes of one lane % 4)
    sum-red-el     the same ``red`` with an L2 evict_last cache hint, one buffer
    sum-red-el-rot the same over rotating buffers
    off-sN, sum-sN off and the summed row with each (sequence, KV head)'s keys cut into N chunks
                   (--splits): is the row's cost tied to how long one program streams?

If kv32-el on one buffer runs at off's time and kv32-el-rot does not, the cost is the lines'
write-back, and a row that is consumed while it is still in L2 (one buffer reused layer after
layer, ranked right after each layer's verify) would not pay it.

Found (session 16, BENCHMARKS.md): at 32K, kv32-el on one buffer 1.004-1.023x off and its
rotating twin 1.04-1.06 (Nsight Compute: the hinted lines stay in L2); at 128K the hint does not
hold the lines, even on a quarter of them, and every form costs 1.04-1.10x; the inline red is
slower than tl.atomic_add (1.17x); production's summed row stays.

    PYTHONPATH=. python3 scripts/c2q_evict_probe.py                 # GPU
    PYTHONPATH=. python3 scripts/c2q_evict_probe.py --dry-run       # CPU, interpreter, tiny
"""
import argparse
import json
import os
import statistics
import sys

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"     # before the kernels are defined

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import c2q_sum_ab as ab  # noqa: E402

bk, production = ab.bk, ab.production
ROTATE_ROW_BYTES = 160e6      # rotating row buffers: well past the H200's 60 MB of L2


def red_add(hint: bool) -> str:
    """collect_sum's add as inline PTX: ``red.add.f32`` (with an L2 evict_last policy when
    ``hint``) from lanes 0-3 only, so each element of the replicated row is added once."""
    policy = ("createpolicy.fractional.L2::evict_last.b64 pol, 1.0; " if hint else "")
    red = ("red.relaxed.gpu.global.add.L2::cache_hint.f32 [$1], $2, pol; " if hint else
           "red.relaxed.gpu.global.add.f32 [$1], $2; ")
    return ('tl.inline_asm_elementwise('
            '"{ .reg .pred p, q; .reg .b32 lane; .reg .b64 pol; mov.u32 lane, %laneid; '
            'setp.lt.u32 q, lane, 4; setp.ne.and.b32 p, $3, 0, q; ' + policy + '@p ' + red +
            'mov.b32 $0, 0; }", "=r,l,f,r", [(c_ptrs + keys).to(tl.int64, bitcast=True), row, '
            'ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)')


class Buffers:
    """Row buffers of one shape handed out in turn, enough of them to pass ``total`` bytes."""

    def __init__(self, shape, dtype, device, total):
        one = torch.empty(shape, dtype=dtype).element_size() * torch.Size(shape).numel()
        count = 1 if total == 0 else max(2, int(total // one) + 1)
        self.buffers = [torch.full(shape, float("nan"), dtype=dtype, device=device)
                        for _ in range(count)]
        self.turn = 0

    def next(self):
        self.turn = (self.turn + 1) % len(self.buffers)
        return self.buffers[self.turn]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="128:131072:8,128:131072:16,128:32768:8",
                        help="head_dim:context:q, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"))
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--splits", default="",
                        help="comma-separated chunk counts for the off-sN / sum-sN variants")
    parser.add_argument("--only", default="",
                        help="comma-separated variants to time (off always); default all")
    args = parser.parse_args()
    if DRY:
        bk.DEVICE, bk.DTYPE, bk.DRY_RUN = "cpu", torch.float32, True
    device, batch = bk.DEVICE, 2 if DRY else 4
    half = torch.float16 if DRY else torch.bfloat16      # the interpreter has no bf16
    kvhead = ab.per_kv_head_module()
    kvhead_el = ab.per_kv_head_module("evict_last")
    kvhead_el_2of8 = ab.per_kv_head_module("evict_last", extra_edits=[ab.TWO_ROWS],
                                             tag="_2of8")
    # the interpreter runs no inline PTX: the dry run times production's add in their place
    red = ab.patched_module("verify_attention_red", [] if DRY else [(ab.ADD, red_add(False))])
    red_el = ab.patched_module("verify_attention_red_el",
                               [] if DRY else [(ab.ADD, red_add(True))])
    rotate = 0 if DRY else ROTATE_ROW_BYTES
    results = []
    for shape in args.shapes.split(","):
        (head_dim, context, q_len, heads, kv_heads, rot, lengths, q, out, per_kv,
         per_seq) = ab.shape_inputs(shape, batch, device)
        k0, v0 = rot.caches[0]
        plain = production.plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                       device=device)

        def summed_plan(module, **options):
            """``module``'s collect_sum plan at this shape."""
            return module.plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                      device=device, collect_rows=None, collect_sum=True,
                                      **options)
        summed, kplan, eplan = (summed_plan(m) for m in (production, kvhead, kvhead_el))
        rplan, replan, e2plan = (summed_plan(m) for m in (red, red_el, kvhead_el_2of8))
        seq_shape, kv_shape = (batch, 1, 1, context), (batch, kv_heads, 1, context)
        seq_one = Buffers(seq_shape, torch.float32, device, 0)
        seq_rot = Buffers(seq_shape, torch.float32, device, rotate)
        kv_one = Buffers(kv_shape, torch.float32, device, 0)
        kv_el_one = Buffers(kv_shape, torch.float32, device, 0)
        kv_el_rot = Buffers(kv_shape, torch.float32, device, rotate)
        kv16_one = Buffers(kv_shape, half, device, 0)
        kv_2of8_one = Buffers(kv_shape, torch.float32, device, 0)
        red_one = Buffers(seq_shape, torch.float32, device, 0)
        red_el_one = Buffers(seq_shape, torch.float32, device, 0)
        red_el_rot = Buffers(seq_shape, torch.float32, device, rotate)
        fills = Buffers(kv_shape, torch.float32, device, rotate)

        def off(k, v):
            production.verify_attention(q, k, v, lengths, plain, out=out)

        def off_fill(k, v):
            off(k, v)
            fills.next().fill_(0.0)

        def stored(module, plan, buffers):
            return lambda k, v: module.verify_attention(q, k, v, lengths, plan, out=out,
                                                        logits=buffers.next())
        calls = {"off": (off, None), "off+fill": (off_fill, None),
                 "sum": (stored(production, summed, seq_one), (seq_one, per_seq)),
                 "sum-rot": (stored(production, summed, seq_rot), (seq_rot, per_seq)),
                 "kv32": (stored(kvhead, kplan, kv_one), (kv_one, per_kv)),
                 "kv32-el": (stored(kvhead_el, eplan, kv_el_one), (kv_el_one, per_kv)),
                 "kv32-el-rot": (stored(kvhead_el, eplan, kv_el_rot), (kv_el_rot, per_kv)),
                 "kv16-el": (stored(kvhead_el, eplan, kv16_one), (kv16_one, per_kv)),
                 "kv32-el-2of8": (stored(kvhead_el_2of8, e2plan, kv_2of8_one), None),
                 "sum-red": (stored(red, rplan, red_one), (red_one, per_seq)),
                 "sum-red-el": (stored(red_el, replan, red_el_one), (red_el_one, per_seq)),
                 "sum-red-el-rot": (stored(red_el, replan, red_el_rot),
                                    (red_el_rot, per_seq))}
        for count in filter(None, args.splits.split(",")):
            count = int(count)
            off_n = production.plan_verify(batch, heads, kv_heads, head_dim, q_len, context,
                                           device=device, num_splits=count)
            sum_n = summed_plan(production, num_splits=count)
            calls[f"off-s{count}"] = (lambda k, v, p=off_n: production.verify_attention(
                q, k, v, lengths, p, out=out), None)
            calls[f"sum-s{count}"] = (stored(production, sum_n, seq_one), (seq_one, per_seq))
        if args.only:
            wanted = {"off", *args.only.split(",")}
            unknown = wanted - set(calls)
            if unknown:
                raise SystemExit(f"--only: no variant {sorted(unknown)}")
            calls = {name: call for name, call in calls.items() if name in wanted}
        for name, (call, check) in calls.items():
            call(k0, v0)
            if check is not None:
                buffers, want = check
                ab.check_rows(f"{shape} {name}", buffers.buffers[buffers.turn], want, lengths)
        order = list(calls)
        samples = {name: [] for name in order}
        for turn in range(args.rounds):
            for name in (order if turn % 2 == 0 else order[::-1]):
                def fn(call=calls[name][0]):
                    k, v = rot.next()
                    call(k, v)
                samples[name].append(bk.time_us(fn, target_ms=8.0)[0])
        off_median = statistics.median(samples["off"])
        line = {name: {"median": statistics.median(values), "min": min(values),
                       "max": max(values), "samples": values}
                for name, values in samples.items()}
        results.append({"shape": shape, **line})
        print(f"hd{head_dim} {context // 1024}K q{q_len}: " + "  ".join(
            f"{name} {t['median']:.1f} [{t['min']:.0f}-{t['max']:.0f}] "
            f"({t['median'] / off_median:.3f})" for name, t in line.items()), flush=True)
        rot = None
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "c2q_evict_probe.json"), "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
