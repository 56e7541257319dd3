"""Another GPU's operator table scaled to the GPU asked about, where that GPU has none.

Each point's time ``t`` on the measured GPU (the *source*) is split into a fixed part ``o``,
the in-graph time of one kernel that does nothing (the table's ``graph`` points: launch and
scheduling latency, taken to be the same on both GPUs), and the rest, which is scaled by the
ratio of the operator's floor on the two GPUs::

    t' = o + (t − o) · floor_target / floor_source

- a GEMM's floor is its roofline, ``max(bytes / bandwidth, FLOPs / matmul rate)``;
- attention (verify, sparse draft), the K/V append, element-wise kernels and the selection
  refreshes are bound by memory: the bandwidth ratio, and for the attention kernels the
  whole-wave fill of ``batch·KV heads`` programs (each split into chunks) over each GPU's
  multiprocessors (:func:`wave_fill`);
- a CUDA graph's replay with the host's wait is host time: unscaled.

The source's ceilings are its table's probe; the target's are its hardware file's measured
ceilings, else its datasheet figures times the fraction of the datasheet the source's probe
reached (the same efficiency assumed). Every note carries :data:`PRIOR_UNCERTAINTY`, the
stated error of a GPU none of whose operators were measured; what the validation runs measured
of scaled answers is each answer's validation line (:mod:`specsim.costs.validated`).
"""
from __future__ import annotations

import math

from specsim.costs.operator_file import OperatorTable, Point
from specsim.specs import HardwareSpec

#: The error a scaled table is stated with (not measured: a prior).
PRIOR_UNCERTAINTY = 0.25
#: Operators bound by memory bandwidth.
MEMORY_BOUND = ("verify", "sparse", "kv_append", "elementwise", "selection")
#: Keys of the attention kernels' blocks, for the chunks a program's keys are cut into.
BLOCK_KEYS, MIN_BLOCKS_PER_CHUNK = 64, 4


def wave_fill(programs: int, multiprocessors: int, keys: float) -> float:
    """The busiest fill of whole waves that ``programs`` (sequence, KV head) pairs reach on
    ``multiprocessors`` when each may be cut into up to ``keys / (BLOCK_KEYS·4)`` chunks:
    ``max_n p·n / (ceil(p·n / SMs)·SMs)`` (1.0: every wave full)."""
    p = max(1, int(programs))
    longest = max(1, int(keys // (BLOCK_KEYS * MIN_BLOCKS_PER_CHUNK)))
    best = 0.0
    for n in range(1, min(longest, 64) + 1):
        waves = math.ceil(p * n / multiprocessors)
        best = max(best, p * n / (waves * multiprocessors))
    return best


def target_ceilings(source: HardwareSpec, probe: dict, target: HardwareSpec
                    ) -> tuple[float, float, str]:
    """(bandwidth B/s, matmul FLOP/s, how they were found) of ``target``."""
    if target.measured_bandwidth and target.measured_bf16_flops:
        return target.measured_bandwidth, target.measured_bf16_flops, "measured ceilings"
    bw_eff = float(probe["copy_bandwidth_Bps"]) / source.memory_bandwidth
    mm_eff = float(probe["bf16_matmul_flops"]) / source.bf16_flops
    return (target.measured_bandwidth or target.memory_bandwidth * bw_eff,
            target.measured_bf16_flops or target.bf16_flops * mm_eff,
            f"datasheet x the source's achieved fraction ({bw_eff:.2f} of its bandwidth, "
            f"{mm_eff:.2f} of its matmul rate)")


def kernel_latency_ms(table: OperatorTable) -> float:
    """In-graph time of one minimal kernel: the slope of the table's graph points (0 where
    the table has fewer than two)."""
    graph = sorted((p.at["kernels"], p.median_ms) for p in table.points if p.op == "graph")
    if len(graph) < 2 or graph[-1][0] == graph[0][0]:
        return 0.0
    (k0, t0), (k1, t1) = graph[0], graph[-1]
    return max(0.0, (t1 - t0) / (k1 - k0))


def scaled_table(table: OperatorTable, source: HardwareSpec, target: HardwareSpec
                 ) -> tuple[OperatorTable, list[str]]:
    """``table`` (measured on ``source``) as ``target`` would read it, with notes saying how."""
    bw_s, mm_s = float(table.probe["copy_bandwidth_Bps"]), float(table.probe["bf16_matmul_flops"])
    bw_t, mm_t, how = target_ceilings(source, table.probe, target)
    sms_s = table.provenance.get("multiprocessors")
    sms_t = target.multiprocessors
    latency = kernel_latency_ms(table)
    notes = [f"operators measured on {table.provenance.get('gpu')} scaled to {target.name} "
             f"(bandwidth x{bw_t / bw_s:.2f}, matmul rate x{mm_t / mm_s:.2f}: {how}); "
             f"no operator measured on this GPU: prior uncertainty +/-{PRIOR_UNCERTAINTY:.0%}"]
    if not (sms_s and sms_t):
        notes.append("multiprocessor counts unknown: attention waves not re-planned")

    def ratio(p: Point) -> float:
        if p.op == "gemm":
            m, n, k = p.at["m"], p.key["n"], p.key["k"]
            moved, flops = 2 * (n * k + m * k + m * n), 2 * m * n * k
            return max(moved / bw_t, flops / mm_t) / max(moved / bw_s, flops / mm_s)
        if p.op not in MEMORY_BOUND:
            return 1.0
        r = bw_s / bw_t
        if p.op in ("verify", "sparse") and sms_s and sms_t:
            keys = p.at.get("context") or p.at.get("selected")
            programs = int(p.at["batch_kv_heads"])
            r *= wave_fill(programs, sms_s, keys) / wave_fill(programs, sms_t, keys)
        return r

    points = []
    for p in table.points:
        r = ratio(p)
        fixed = min(latency, min(p.samples_ms)) if r != 1.0 else 0.0
        points.append(Point(p.op, dict(p.key), dict(p.at),
                            [fixed + (t - fixed) * r for t in p.samples_ms]))
    provenance = dict(table.provenance, scaled_to=target.name, scaled_from=table.path)
    probe = dict(table.probe, copy_bandwidth_Bps=bw_t, bf16_matmul_flops=mm_t)
    return OperatorTable(provenance, probe, points, table.path,
                         retired_prefill_points=table.retired_prefill_points), notes


__all__ = ["PRIOR_UNCERTAINTY", "kernel_latency_ms", "scaled_table", "target_ceilings",
           "wave_fill"]
