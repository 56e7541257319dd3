"""Compile the verify kernel for a GPU on this CPU and print what each launch config costs in
registers, spills and instructions: no GPU needed.

Triton compiles for a target without a driver (``triton.compile`` with a ``GPUTarget``), and
its wheel ships ``ptxas`` and ``cuobjdump``. Each config is compiled with the constexprs that
``verify_attention`` would launch it with (from ``plan_verify``) and with Triton's usual
argument specialisation (pointers 16-byte aligned, integer arguments that are multiples of 16
marked so, as for contiguous caches at the given shape): without those marks the loads are
not vectorised and the numbers mean nothing.

What it tells, and what it does not: register pressure, spills (local-memory traffic in the
key loop), the instruction mix (address arithmetic ``LEA``/``IMAD``, asynchronous copies
``LDGSTS``, Hopper tensor-core ``HGMMA``), and whether the loads are pipelined. It does not
time anything: a config with fewer spills can still run slower (bench_kernels, on a GPU).

    python scripts/kernel_resources.py --head-dims 128 --q-lens 8,16 --modes off,sum \\
        --block-n 128
"""
from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"      # compile, not interpret (before the kernels load)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from specsim.kernels.verify_attention import (_verify_kernel, default_collect_rows,  # noqa: E402
                                              launch_constexprs, plan_verify)

HEADS = {128: (32, 8), 64: (64, 8)}          # bench_kernels' shapes: query / KV heads
COUNTED = ("LEA", "IMAD", "LDGSTS", "LDG", "STG", "HGMMA", "HMMA", "LDL", "STL")


def tool(name: str) -> str:
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise SystemExit(f"{path} is missing: this Triton wheel ships no {name}")
    return path


def launch_args(plan, context: int, logits_fp32: bool):
    """The kernel's argument types, integer values and constexprs for ``plan`` at ``context``
    keys (contiguous q [b, q, h, d], caches [b, kv, context, d], out like q)."""
    b, q, h, kv, d = plan.batch, plan.q_len, plan.num_heads, plan.num_kv_heads, plan.head_dim
    ints = {
        "stride_qb": q * h * d, "stride_qt": h * d, "stride_qh": d,
        "stride_kb": kv * context * d, "stride_kh": context * d, "stride_kt": d,
        "stride_vb": kv * context * d, "stride_vh": context * d, "stride_vt": d,
        "stride_ob": q * h * d, "stride_ot": h * d, "stride_oh": d,
        "stride_lb": 0, "stride_lh": 0, "stride_lt": 0,
        "stride_gb": 0, "stride_gh": 0, "stride_gr": 0,
        "split_size": plan.split.split_size, "num_splits": plan.split.num_splits,
    }
    if plan.collect_rows:
        rows = 1 if plan.collect_sum else h
        n_rows = 1 if plan.collect_sum else len(plan.collect_rows)
        ints.update(stride_gb=rows * n_rows * context, stride_gh=n_rows * context,
                    stride_gr=context)
    pointers = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Lengths": "*i32", "Out": "*bf16",
                "Lse": "*bf16", "PartOut": "*fp32", "PartLse": "*fp32",
                "Logits": "*fp32" if logits_fp32 else "*bf16", "Sinks": "*fp32"}
    const = launch_constexprs(plan, write_lse=False)
    return pointers, ints, const


def compile_plan(plan, context: int, arch: int):
    """The compiled kernel (Triton's CompiledKernel) for ``plan``, for sm_``arch``."""
    params = list(inspect.signature(_verify_kernel.fn).parameters)
    pointers, ints, const = launch_args(plan, context, plan.collect_sum)
    signature, attrs = {}, {}
    for i, name in enumerate(params):
        if name in const:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "sm_scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if ints[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(_verify_kernel, signature, attrs=attrs,
                       constexprs={(params.index(k),): v for k, v in const.items()})
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": plan.num_warps,
                                   "num_stages": plan.num_stages})


def resources(kernel, arch: int) -> dict:
    """Registers, spills and stack (ptxas -v) and the SASS instruction counts of a kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx, "w") as handle:
            handle.write(kernel.asm["ptx"])
        gpu = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
        info = subprocess.run([tool("ptxas"), "-v", "--gpu-name", gpu, ptx, "-o", cubin],
                              capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([tool("cuobjdump"), "-sass", cubin], capture_output=True,
                              text=True, check=True).stdout

    def number(pattern):
        found = re.search(pattern, info)
        return int(found.group(1)) if found else 0
    ops = collections.Counter()
    for line in sass.splitlines():
        found = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", line)
        if found:
            ops[found.group(1)] += 1
    return {"registers": number(r"Used (\d+) registers"),
            "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads"),
            "stack": number(r"(\d+) bytes stack frame"),
            "instructions": sum(ops.values()), **{op: ops[op] for op in COUNTED}}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dims", default="128,64")
    parser.add_argument("--q-lens", default="1,8,16")
    parser.add_argument("--modes", default="off,separate,sum",
                        help="off (no collecting), separate / main (Collect-2-Query's rows "
                             "from a second tile or the main one), sum (collect_sum)")
    parser.add_argument("--block-n", default="64,128", help="key blocks to compile")
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--context", type=int, default=131072)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--arch", type=int, default=90, help="compute capability × 10")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = []
    header = (f"{'hd':>3} {'q':>2} {'mode':8} {'bn':>4} {'regs':>4} {'spill':>7} "
              f"{'stack':>5} {'instr':>6} " + " ".join(f"{op:>6}" for op in COUNTED))
    print(header)
    for head_dim in map(int, args.head_dims.split(",")):
        heads, kv_heads = HEADS[head_dim]
        for q_len in map(int, args.q_lens.split(",")):
            for mode in args.modes.split(","):
                if mode not in ("off", "separate", "main", "sum"):
                    raise SystemExit(f"--modes: unknown {mode!r}")
                collect = () if mode == "off" else default_collect_rows(q_len)
                for block_n in map(int, args.block_n.split(",")):
                    plan = plan_verify(
                        args.batch, heads, kv_heads, head_dim, q_len, args.context,
                        device="cpu", collect_rows=collect,
                        collect_separate=None if mode in ("off", "sum") else
                        mode == "separate", collect_sum=mode == "sum", block_n=block_n,
                        num_warps=args.warps, num_stages=args.stages, num_splits=4)
                    got = resources(compile_plan(plan, args.context, args.arch), args.arch)
                    got.update(head_dim=head_dim, q=q_len, mode=mode, block_n=block_n,
                               block_m=plan.block_m)
                    rows.append(got)
                    print(f"{head_dim:>3} {q_len:>2} {mode:8} {block_n:>4} "
                          f"{got['registers']:>4} "
                          f"{got['spill_stores']:>3}/{got['spill_loads']:<3} "
                          f"{got['stack']:>5} {got['instructions']:>6} "
                          + " ".join(f"{got[op]:>6}" for op in COUNTED), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return rows


if __name__ == "__main__":
    main()
