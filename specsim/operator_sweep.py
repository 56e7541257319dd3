"""`specsim calibrate --gpu --operators`: time the engine's operators on this GPU at a
model-agnostic grid, for the operator cost model (:mod:`specsim.costs.operators`).

GPU side (torch, triton and the engine's kernels; no simpy/plotly). Each operator of
:data:`specsim.costs.operator_file.OPERATORS` is timed as the engine runs it:

- ``gemm``: a bf16 ``nn.Linear`` (cuBLAS, the engine's projections) of ``m`` rows at each
  (n, k) of the grid whose weight fits ``max_weight_bytes``;
- ``grouped_gemm``: the MoE layers' grouped GEMM (``specsim.engine.model.grouped_mm``) of
  ``rows`` token-expert pairs spread evenly over ``groups`` experts, every expert given rows
  (``grouped_rows_per_expert`` each: a routed layer reads the weights of the experts its pairs
  touch, and only theirs), at each (n, k);
- ``moe_routing``: an MoE layer around its GEMMs (routing from the router's logits, dispatch of
  the token-expert pairs by expert, the weighted combine) for each (experts, top, hidden);
- ``verify``: ``specsim.kernels.verify_attention`` with its planner's launch (``plan_verify``:
  whole waves and splits over this GPU's multiprocessors) for each head_dim, GQA group, q and
  collection (off; Vegas' summed row; every row per head; every row summed over the heads, as
  last-token's verify writes it), at ``batch·KV heads`` rows and contexts;
- ``sparse``: ``sparse_attention`` with ``plan_sparse`` over lists of ``selected`` random
  positions, one list per sequence or per KV head;
- ``kv_append``: the cache's fused one-position append (with Quest's page bounds or not);
- ``elementwise``: a compiled RMSNorm pass (the engine's layers compile their element-wise work)
  moving a given number of bytes;
- ``selection``: each policy's refresh of every list through ``specsim.kernels.selection``
  (Vegas and last-token from the collected logits, SparseSpec-L's attention mass and per-KV-head
  ranking, Quest's page scoring and ranking of one layer's draft query; last-token's pick of
  each list's last accepted row from its head-summed rows first), at each s of
  ``selection_s``, and on both sides of the radix ranking's path switch (:func:`selection_axes`);
- ``prefill_attention``: the engine's prefill attention of one prompt of ``prefill_tokens``
  (``specsim.engine.attention.prefill_attention``, 8 KV heads) on each of its kernels
  (:data:`specsim.costs.prefill.OPERATOR_PATHS`: causal, which a full layer's sinks run on
  too; a window of ``prefill_window`` with sinks), at the query-key products it computes
  (:func:`specsim.costs.prefill.attention_elements` over the query heads);
- ``graph``: the replay of a CUDA graph of ``kernels`` minimal kernels with the host's wait.

A point's samples are ``repeats`` replays of a CUDA graph of ``graph_inner`` calls between two
CUDA events, divided by ``graph_inner`` (the engine replays its steps as CUDA graphs: no host
launch time between a step's kernels), the calls cycling through copies of their inputs that
together exceed the L2 cache (``ROTATE_BYTES``: a model's layers each read their own weights and
KV); a call that cannot be captured is timed eagerly and named in ``provenance.timed_eagerly``.
The graph point is timed on the host clock. The run writes the table after every group (an
operator and key), with the seconds each group took (``provenance.group_seconds``), and the same
command resumes a table it finds (same GPU, software, kernels, settings and timing method: a
grid that adds groups resumes), measuring only the groups it lacks; after ``time_budget_s`` no
new group starts. Off CUDA the same code runs on the CPU (fp32, the Triton interpreter, the
wall clock): with :meth:`OperatorGrid.tiny` it proves the harness and the file, not the CPU's
speed.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass, field

from specsim.costs.operator_file import OperatorTable, Point, read_operator_table
from specsim.costs.prefill import OPERATOR_PATHS
from specsim.errors import SpecsimError
from specsim.settings import DEFAULT, EngineSettings, engine_provenance

#: Provenance that must match for a table to be resumed.
RESUME_FIELDS = ("gpu", "driver", "cuda", "torch", "triton", "kernel_config_hash", "engine",
                 "method")
#: The grid's fields that say how a point is timed (``method`` in the provenance): a table
#: resumes under a grid that measures more or other groups, never one that times otherwise.
METHOD_FIELDS = ("repeats", "warmup", "inner", "graph_inner")


@dataclass
class OperatorGrid:
    """What ``--operators`` measures (defaults: the H200 grid, about 15 minutes)."""

    gemm_m: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512,
                                                       1024, 2048])
    gemm_n: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096, 8192, 16384,
                                                       32768, 131072])
    gemm_k: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096, 8192, 16384])
    max_weight_bytes: float = 3e9
    head_dims: list[int] = field(default_factory=lambda: [128, 64])
    groups: list[int] = field(default_factory=lambda: [3, 4, 5, 8])
    qs: list[int] = field(default_factory=lambda: [1, 3, 5, 9, 16])
    collects: list[str] = field(default_factory=lambda: ["off", "sum", "all", "rows"])
    batch_kv_heads: list[int] = field(default_factory=lambda: [4, 16, 64, 256])
    contexts: list[int] = field(default_factory=lambda: [1024, 4096, 16384, 65536, 131072])
    selected: list[int] = field(default_factory=lambda: [256, 1024, 4096, 16384])
    elementwise_bytes: list[int] = field(default_factory=lambda: [2**k for k in range(12, 31, 3)])
    selection_policies: list[str] = field(default_factory=lambda: ["vegas", "last-token",
                                                                   "sparsespec", "quest"])
    selection_lists: list[int] = field(default_factory=lambda: [32, 128, 512, 2048])
    selection_contexts: list[int] = field(default_factory=lambda: [1024, 4096, 16384, 65536,
                                                                   131072])
    selection_rows: list[int] = field(default_factory=lambda: [3, 9, 16])
    #: fractions s each selection keeps (its winners are sorted: the time grows with s)
    selection_s: list[float] = field(default_factory=lambda: [0.03, 0.1])
    graph_kernels: list[int] = field(default_factory=lambda: [1, 64, 512])
    grouped_widths: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096, 8192])
    #: pairs per expert: a draft step's few (1–16), a verify's, a prefill's thousands
    grouped_rows_per_expert: list[int] = field(
        default_factory=lambda: [1, 2, 4, 16, 64, 256, 1024, 4096])
    grouped_groups: list[int] = field(default_factory=lambda: [2, 8, 32, 128])
    moe_experts: list[int] = field(default_factory=lambda: [8, 32, 128])
    moe_tops: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    moe_hidden: list[int] = field(default_factory=lambda: [1024, 4096])
    #: tokens a routed layer takes at once: a decode step's few, a prefill's tens of thousands
    moe_tokens: list[int] = field(
        default_factory=lambda: [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536])
    prefill_tokens: list[int] = field(default_factory=lambda: [256, 1024, 4096, 16384])
    prefill_window: int = 128
    max_cache_bytes: float = 24e9
    repeats: int = 5
    warmup: int = 2
    inner: int = 3
    graph_inner: int = 16
    time_budget_s: float | None = 900.0

    @classmethod
    def tiny(cls) -> "OperatorGrid":
        """A grid the CPU runs in seconds (the harness's test)."""
        return cls(gemm_m=[1, 4], gemm_n=[64, 128], gemm_k=[64, 128], head_dims=[64],
                   groups=[2, 4], qs=[1, 3], collects=["off", "sum"], batch_kv_heads=[2, 4],
                   contexts=[64, 128], selected=[16, 64], elementwise_bytes=[4096, 65536],
                   selection_policies=["vegas", "sparsespec", "quest"], selection_lists=[2, 4],
                   selection_contexts=[64, 128], selection_rows=[3], graph_kernels=[1, 8],
                   grouped_widths=[64, 128], grouped_rows_per_expert=[1, 4], grouped_groups=[2, 4],
                   moe_experts=[4], moe_tops=[1, 2], moe_hidden=[64], moe_tokens=[1, 8],
                   prefill_tokens=[16, 48], prefill_window=8,
                   repeats=2, warmup=1, inner=1, graph_inner=2, time_budget_s=None)

    def grid_json(self) -> dict:
        out = dataclasses.asdict(self)
        out.pop("time_budget_s")
        return out

    def method_json(self) -> dict:
        """How each point is timed (what a resumed table must share)."""
        return {name: getattr(self, name) for name in METHOD_FIELDS}


#: Bytes of distinct inputs a timed sequence of calls cycles through (several times the H200's
#: 60 MB L2), so that back-to-back calls read memory, as a model's layers do, not the cache.
ROTATE_BYTES = 256 * 2**20


def copies(footprint: float, grid: "OperatorGrid") -> int:
    """How many copies of inputs of ``footprint`` bytes a timed sequence cycles through."""
    return max(1, min(grid.graph_inner, math.ceil(ROTATE_BYTES / max(footprint, 1.0))))


class _Timer:
    """Milliseconds per call of an operator, as the engine runs it.

    On CUDA with ``cuda_graphs`` (the engine's default) ``graph_inner`` calls are captured
    into one CUDA graph, cycling through the given calls (each on its own copy of the inputs),
    and each sample is one replay between two CUDA events over ``graph_inner``: no host launch
    time, as in the engine's graphed steps. A call that cannot be captured is timed eagerly
    (``inner`` back-to-back calls between two events) and counted in ``eager``. Off CUDA:
    the wall clock."""

    def __init__(self, torch, device, settings: EngineSettings = DEFAULT):
        self.torch, self.cuda = torch, device.type == "cuda"
        self.graphs = self.cuda and settings.cuda_graphs
        self.eager: list[str] = []
        self.label = ""

    def __call__(self, fns, grid: OperatorGrid, inner: int | None = None) -> list[float]:
        fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
        if self.graphs:
            try:
                return self._graphed(fns, grid)
            except Exception as exc:     # not capturable: timed eagerly, and said
                self.eager.append(f"{self.label}: {type(exc).__name__}")
                self.torch.cuda.synchronize()
        return self._eager(fns, grid, inner or grid.inner)

    def _graphed(self, fns, grid) -> list[float]:
        torch, n = self.torch, grid.graph_inner
        for _ in range(grid.warmup):
            for fn in fns:
                fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(n):
                fns[i % len(fns)]()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out = []
        for _ in range(grid.repeats):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / n)
        del graph
        return out

    def _eager(self, fns, grid, inner) -> list[float]:
        torch = self.torch
        for _ in range(grid.warmup):
            for fn in fns:
                fn()
        out = []
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(grid.repeats):
                start.record()
                for i in range(inner):
                    fns[i % len(fns)]()
                end.record()
                end.synchronize()
                out.append(start.elapsed_time(end) / inner)
        else:
            for _ in range(grid.repeats):
                started = time.perf_counter()
                for i in range(inner):
                    fns[i % len(fns)]()
                out.append((time.perf_counter() - started) * 1e3 / inner)
        return out


def _groups(grid: OperatorGrid):
    """(operator, key, [at ...]) in the order measured: what every model needs first."""
    out = []
    for n in grid.gemm_n:
        for k in grid.gemm_k:
            if n * k * 2 <= grid.max_weight_bytes:
                out.append(("gemm", {"n": n, "k": k}, [{"m": m} for m in grid.gemm_m]))
    out.append(("elementwise", {}, [{"bytes": b} for b in grid.elementwise_bytes]))
    for n in grid.grouped_widths:
        for k in grid.grouped_widths:
            at = [{"rows": r * g, "groups": g} for g in grid.grouped_groups
                  for r in grid.grouped_rows_per_expert if g * n * k * 2 <= grid.max_weight_bytes]
            if at:
                out.append(("grouped_gemm", {"n": n, "k": k}, at))
    for e in grid.moe_experts:
        for top in grid.moe_tops:
            if top <= e:
                for h in grid.moe_hidden:
                    out.append(("moe_routing", {"experts": e, "top": top, "hidden": h},
                                [{"tokens": t} for t in grid.moe_tokens]))
    out.append(("graph", {}, [{"kernels": n} for n in grid.graph_kernels]))
    for hd in grid.head_dims:
        for g in grid.groups:
            for path in OPERATOR_PATHS:
                out.append(("prefill_attention", {"head_dim": hd, "group": g, "path": path},
                            [{"tokens": t} for t in grid.prefill_tokens]))
    for hd in grid.head_dims:
        for paged in (False, True):
            out.append(("kv_append", {"head_dim": hd, "paged": paged},
                        [{"batch_kv_heads": b} for b in grid.batch_kv_heads]))
    attention_at = [{"batch_kv_heads": b, "context": c} for b in grid.batch_kv_heads
                    for c in grid.contexts
                    if b * c * 128 * 4 <= grid.max_cache_bytes]
    sparse_at = [{"batch_kv_heads": b, "selected": n} for b in grid.batch_kv_heads
                 for n in grid.selected]
    for collect in grid.collects:
        for hd in grid.head_dims:
            for g in grid.groups:
                for q in grid.qs:
                    if collect != "off" and q == 1 or q * g > 128:
                        continue
                    out.append(("verify", {"head_dim": hd, "group": g, "q": q,
                                           "collect": collect}, attention_at))
            if collect == "off":
                for g in grid.groups:
                    for per in (False, True):
                        out.append(("sparse", {"head_dim": hd, "group": g, "per_kv_head": per},
                                    sparse_at))
        if collect == "off":
            for policy in grid.selection_policies:
                out += _selection_groups(grid, policy)
    return out


#: Lists a sweep's selection point holds come in sequences of this many KV heads (its
#: SparseSpec-L and Quest points lay them out so): a list count's nearest neighbour.
LIST_STEP = 8


def selection_axes(grid, policy: str) -> tuple[list[int], list[int]]:
    """The lists and contexts ``policy``'s selection is timed at: the grid's, and both sides
    of each switch of the radix ranking's path inside their range (few rows of many items are
    ranked over blocks of each row, ``topk_select.chunked_path``; Quest's items are pages), so
    that no interpolation between neighbouring points crosses a switch: time is linear within
    a path, not across one (Qwen3-8B's 576 summed rows at 128K, one program per row, were priced
    37-51% high between 512 rows, chunked, and 2,048)."""
    from specsim.kernels.topk_select import CHUNKED_FROM, CHUNKED_ROWS
    from specsim.policies import get_policy

    lists, contexts = sorted(set(grid.selection_lists)), sorted(set(grid.selection_contexts))
    if CHUNKED_FROM is None:
        return lists, contexts
    unit = get_policy(policy).page_size       # Quest ranks pages, the others tokens

    def inside(values, sides):
        return sorted(set(values) | {v for v in sides if values[0] < v < values[-1]})

    return (inside(lists, (CHUNKED_ROWS, CHUNKED_ROWS + LIST_STEP)),
            inside(contexts, (CHUNKED_FROM * unit, (CHUNKED_FROM + 1) * unit)))


def _selection_groups(grid, policy):
    lists, contexts = selection_axes(grid, policy)
    at = [{"lists": n, "context": c} for n in lists for c in contexts]
    if policy in ("vegas", "last-token"):
        keys = [(0, 0, 0)]
    elif policy == "sparsespec":
        keys = [(g, r, 0) for g in grid.groups for r in grid.selection_rows]
    elif policy == "quest":       # its page scoring reads bounds of the model's head dim
        keys = [(g, 0, hd) for hd in grid.head_dims for g in grid.groups]
    else:
        raise SpecsimError(f"no selection operator for policy '{policy}'")
    return [("selection", {"policy": policy, "group": g, "rows": r, "s": s, "head_dim": hd}, at)
            for s in grid.selection_s for g, r, hd in keys]


def _kernel_hash() -> str:
    from specsim.calibrate import kernel_config_hash
    return kernel_config_hash()


def provenance(grid: OperatorGrid, settings: EngineSettings, device) -> dict:
    from specsim.costs.calibration_file import collect_provenance
    from specsim.specs import ModelSpec

    placeholder = ModelSpec("operators", "none", 1, 1, 1, 1, 1, 1, 1)
    prov = collect_provenance(placeholder, _kernel_hash())
    for name in ("model", "model_spec_hash"):
        prov.pop(name, None)
    import torch
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        prov["multiprocessors"] = p.multi_processor_count
        prov["clock_mhz"] = _clocks()
    prov["engine"] = engine_provenance(settings)
    prov["grid"] = grid.grid_json()
    prov["method"] = dict(grid.method_json(), rotate_bytes=ROTATE_BYTES)
    prov["timing"] = (("cuda graph replay" if settings.cuda_graphs else "eager launches")
                      if device.type == "cuda" else "wall clock")
    return prov


def _clocks() -> dict | None:
    import subprocess
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,clocks.max.sm",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=10).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    if not text:
        return None
    try:
        sm, mem, sm_max = (float(x) for x in text[0].split(","))
    except ValueError:
        return None
    return {"sm": sm, "memory": mem, "sm_max": sm_max}


def probe(torch, device, timer: _Timer, grid: OperatorGrid) -> dict:
    """Copy bandwidth and bf16 matmul rate of this device (fp32 off CUDA)."""
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    n = 2**29 if cuda else 2**20
    a = torch.empty(n, dtype=dtype, device=device)
    b = torch.empty_like(a)
    copy = timer._eager([lambda: b.copy_(a)], grid, 10)
    size = 8192 if cuda else 256
    x = torch.randn(size, size, dtype=dtype, device=device)
    mm = timer._eager([lambda: x @ x], grid, 10)
    del a, b, x
    median = sorted(copy)[len(copy) // 2] / 1e3
    return {"copy_bandwidth_Bps": 2 * n * a_element(dtype) / median,
            "bf16_matmul_flops": 2 * size**3 / (sorted(mm)[len(mm) // 2] / 1e3),
            "copy_samples_ms": copy, "matmul_samples_ms": mm}


def a_element(dtype) -> int:
    import torch
    return torch.empty((), dtype=dtype).element_size()


def resumable(path: str, prov: dict, only: tuple[str, ...] = ()) -> OperatorTable | None:
    """The table in ``path`` when this run may resume it, None when there is none; a table
    measured otherwise is refused with what differs (one line), never overwritten. A run that
    re-measures ``only`` some operators may follow a change to the kernels' source (the
    operators that change names are the ones it re-measures; the provenance keeps both
    hashes)."""
    if not os.path.exists(path):
        return None
    have = read_operator_table(path)
    fields = [f for f in RESUME_FIELDS if not (only and f == "kernel_config_hash")]
    differ = [f for f in fields if _resumed_as(f, have.provenance, only)
              != _resumed_as(f, prov, only)]
    if differ:
        raise SpecsimError(f"{path} holds an operator table measured otherwise "
                           f"({', '.join(differ)}): not resuming it and not overwriting it; "
                           f"remove it or write to another file")
    return have


def _resumed_as(name: str, prov: dict, only: tuple[str, ...] = ()):
    """Provenance field ``name`` as a resume compares it: an older table's ``method`` named the
    one s its selections were timed at, which its points now carry in their keys; what
    ``ranking=best`` resolves to (``engine.best_ranking``, older tables: the legacy one) counts
    unless the run re-measures the selections it ranks."""
    value = prov.get(name)
    if name == "method" and isinstance(value, dict):
        value = {k: v for k, v in value.items() if k != "selection_s"}
    if name == "engine" and isinstance(value, dict):
        from specsim.policies import recorded_best_ranking
        value = {**value, "best_ranking": recorded_best_ranking(value)}
        if "selection" in only:
            value.pop("best_ranking")
    return value


def measure_operators(grid: OperatorGrid, out: str, *, settings: EngineSettings = DEFAULT,
                      progress: bool = True, device: str | None = None,
                      only: tuple[str, ...] = ()) -> OperatorTable:
    """Measure ``grid`` on ``device`` (default: this machine's GPU, else its CPU) into
    ``out`` (module doc). ``only``: measure these operators alone, anew: a resumed table drops
    their points first (after a change to how they are timed, to their grid's axes, which a
    resume does not revisit, or to their kernels) and keeps every other operator's as it
    is."""
    unknown = [op for op in only if op not in MEASURES]
    if unknown:
        raise SpecsimError(f"unknown operator(s) {', '.join(unknown)}: the operators are "
                           f"{', '.join(MEASURES)}")
    import torch

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    timer = _Timer(torch, device, settings)
    prov = provenance(grid, settings, device)
    prior = resumable(out, prov, only)
    if prior is not None:
        points = [p for p in prior.points if p.op not in only]
        ceilings = prior.probe
        prov["resumed"] = list(prior.provenance.get("resumed", [])) + [
            prior.provenance.get("date")]
        done = {(p.op, p.key_tuple) for p in points}
        timer.eager = list(prior.provenance.get("timed_eagerly", []))
        seconds = [g for g in prior.provenance.get("group_seconds", []) if g[0] not in only]
        again = {"operators": list(only), "date": prov.get("date")}
        if prior.provenance.get("kernel_config_hash") != prov.get("kernel_config_hash"):
            again["kernel_config_hash_before"] = prior.provenance.get("kernel_config_hash")
        prov["remeasured"] = list(prior.provenance.get("remeasured", [])) + (
            [again] if only else [])
    else:
        points, ceilings, done = [], probe(torch, device, timer, grid), set()
        seconds = []
    groups = _groups(grid)
    todo = [g for g in groups
            if (g[0], Point(g[0], g[1], {}).key_tuple) not in done]
    started = time.perf_counter()

    failed: list[dict] = []

    def table(left: int) -> OperatorTable:
        return OperatorTable(dict(prov, complete=left == 0 and not failed, groups_left=left,
                                  groups_failed=failed, timed_eagerly=list(timer.eager),
                                  group_seconds=list(seconds)),
                             ceilings, list(points))

    left = len(todo)
    for i, (op, key, ats) in enumerate(g for g in todo if not only or g[0] in only):
        if grid.time_budget_s and time.perf_counter() - started > grid.time_budget_s:
            print(f"time budget reached: {left} groups left unmeasured", file=sys.stderr)
            break
        if progress:
            print(f"[{len(groups) - left + 1}/{len(groups)}] {op} {key} "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
        timer.label = f"{op} {key}"
        group_started = time.perf_counter()
        try:
            with torch.inference_mode():
                points += _measure_group(torch, device, timer, grid, settings, op, key, ats)
        except torch.OutOfMemoryError:
            print(f"  out of memory: {op} {key} skipped", file=sys.stderr, flush=True)
            failed.append({"op": op, "key": key, "error": "out of memory"})
        except Exception as exc:   # one operator's failure leaves the others' measurements
            print(f"  {op} {key} failed: {type(exc).__name__}: {exc}", file=sys.stderr,
                  flush=True)
            failed.append({"op": op, "key": key,
                           "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        if device.type == "cuda":
            torch.cuda.empty_cache()
        seconds.append([op, key, round(time.perf_counter() - group_started, 3)])
        left -= 1
        table(left).write(out)
    result = table(left)
    result.write(out)
    result.path = out
    return result


def _measure_group(torch, device, timer, grid, settings, op, key, ats) -> list[Point]:
    return [Point(op, dict(key), dict(at), ms)
            for at, ms in MEASURES[op](torch, device, timer, grid, settings, key, ats)]


def _dtype(torch, device):
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _gemm(torch, device, timer, grid, settings, key, ats):
    dtype = _dtype(torch, device)
    layers = [torch.nn.Linear(key["k"], key["n"], bias=False, device=device, dtype=dtype)
              for _ in range(copies(key["n"] * key["k"] * a_element(dtype), grid))]
    for at in ats:
        x = torch.randn(at["m"], key["k"], device=device, dtype=dtype)
        yield at, timer([lambda layer=layer: layer(x) for layer in layers], grid)


def _grouped_gemm(torch, device, timer, grid, settings, key, ats):
    """The engine's MoE grouped GEMM (``specsim.engine.model.grouped_mm``) over ``rows``
    token-expert pairs spread evenly over ``groups`` experts' weights."""
    from specsim.engine.model import grouped_mm

    dtype = _dtype(torch, device)
    for at in ats:
        rows, groups = int(at["rows"]), int(at["groups"])
        weights = [torch.randn(groups, key["k"], key["n"], device=device, dtype=dtype)
                   for _ in range(copies(groups * key["n"] * key["k"] * a_element(dtype), grid))]
        x = torch.randn(rows, key["k"], device=device, dtype=dtype)
        per = torch.full((groups,), rows // groups, dtype=torch.int32)
        per[: rows % groups] += 1
        ends = torch.cumsum(per, 0, dtype=torch.int32).to(device)
        yield at, timer([lambda w=w: grouped_mm(x, w, ends) for w in weights], grid)


def _moe_routing(torch, device, timer, grid, settings, key, ats):
    """An MoE layer around its GEMMs, as the engine runs it (``specsim.engine.model``):
    routing from the router's logits, the dispatch of the token-expert pairs by expert and the
    weighted combine back to the tokens (the router GEMM and the grouped GEMMs are operators of
    their own)."""
    from specsim.engine.model import combine, dispatch, route

    dtype = _dtype(torch, device)
    e, top, h = int(key["experts"]), int(key["top"]), int(key["hidden"])
    for at in ats:
        t = int(at["tokens"])
        moved = t * h * a_element(dtype) * (1 + 3 * top)
        inputs = [(torch.randn(t, e, device=device), torch.randn(t, h, device=device,
                                                                 dtype=dtype))
                  for _ in range(copies(moved, grid))]

        def layer(logits, x2):
            pairs = dispatch(x2, *route(logits, top, True), e)
            return combine(pairs.rows, pairs)

        yield at, timer([lambda i=i: layer(*i) for i in inputs], grid)


#: KV heads of the measured prefill attention (its time scales with the query heads).
PREFILL_KV_HEADS = 8


def _prefill_attention(torch, device, timer, grid, settings, key, ats):
    """One prompt's prefill attention in one layer, as the engine runs it; the point's axis is
    the query-key products over the query heads (the tokens say only which prompt)."""
    from specsim.costs.prefill import attention_elements
    from specsim.engine.attention import prefill_attention

    dtype = _dtype(torch, device)
    hd, group, path = int(key["head_dim"]), int(key["group"]), key["path"]
    heads = PREFILL_KV_HEADS * group
    window = grid.prefill_window if path == "window" else None
    sinks = torch.randn(heads, device=device) if path != "causal" else None
    for at in ats:
        t = int(at["tokens"])
        footprint = t * (heads + 2 * PREFILL_KV_HEADS) * hd * a_element(dtype)
        inputs = [(torch.randn(1, t, heads, hd, device=device, dtype=dtype),
                   torch.randn(1, t, PREFILL_KV_HEADS, hd, device=device, dtype=dtype),
                   torch.randn(1, t, PREFILL_KV_HEADS, hd, device=device, dtype=dtype))
                  for _ in range(copies(footprint, grid))]
        elements = attention_elements(t, 0, window, sinks is not None) * heads
        yield {"elements": elements}, timer(
            [lambda i=i: prefill_attention(*i, window=window, sinks=sinks) for i in inputs],
            grid)
        del inputs


def _elementwise(torch, device, timer, grid, settings, key, ats):
    """A compiled RMSNorm over rows of 4096 (what the compiled layers emit around the
    matmuls), moving ``bytes``: read and written once."""
    from specsim.engine.model import RMSNorm

    dtype = _dtype(torch, device)
    width = 4096
    norm = RMSNorm(width, 1e-6).to(device=device, dtype=dtype)
    fn = torch.compile(norm, dynamic=True) if device.type == "cuda" and \
        settings.compile_layers else norm
    element = a_element(dtype)
    for at in ats:
        rows = max(1, int(at["bytes"] // (2 * width * element)))
        moved = 2 * rows * width * element
        xs = [torch.randn(rows, width, device=device, dtype=dtype)
              for _ in range(copies(moved, grid))]
        yield {"bytes": moved}, timer([lambda x=x: fn(x) for x in xs], grid)


def _graph(torch, device, timer, grid, settings, key, ats):
    """A graph of ``kernels`` one-element adds replayed, with the host's wait: wall clock."""
    x = torch.zeros(1, device=device)
    for at in ats:
        n = int(at["kernels"])

        def body():
            for _ in range(n):
                x.add_(1.0)

        if device.type == "cuda" and settings.cuda_graphs:
            body()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                body()

            def run():
                graph.replay()
                torch.cuda.synchronize()
        else:
            run = body
        samples = []
        for _ in range(grid.warmup):
            run()
        for _ in range(grid.repeats):
            started = time.perf_counter()
            run()
            samples.append((time.perf_counter() - started) * 1e3)
        yield at, samples


def _cache(torch, device, bkv, length, hd):
    kv_heads = min(4, bkv)
    batch = max(1, bkv // kv_heads)
    dtype = _dtype(torch, device)
    k = torch.randn(batch, kv_heads, length, hd, device=device, dtype=dtype)
    v = torch.randn_like(k)
    return batch, kv_heads, k, v


def _kv_append(torch, device, timer, grid, settings, key, ats):
    from specsim.kernels import KVCache

    hd = key["head_dim"]
    for at in ats:
        bkv = int(at["batch_kv_heads"])
        kv_heads = min(4, bkv)
        batch = max(1, bkv // kv_heads)
        cache = KVCache(batch, kv_heads, 64, hd, device=device, dtype=_dtype(torch, device),
                        page_size=16 if key["paged"] else None,
                        fused_append=device.type == "cuda")
        cache.extend(8)
        k_new = torch.randn(batch, kv_heads, 1, hd, device=device, dtype=_dtype(torch, device))
        yield {"batch_kv_heads": batch * kv_heads}, timer(lambda: cache.write(0, k_new, k_new),
                                                           grid)


def _verify(torch, device, timer, grid, settings, key, ats):
    from specsim.kernels.verify_attention import (default_collect_rows, new_logits_buffer,
                                                  plan_verify, verify_attention)

    hd, group, q, collect = key["head_dim"], key["group"], key["q"], key["collect"]
    for at in ats:
        context = int(at["context"])
        batch, kv_heads, k, v = _cache(torch, device, int(at["batch_kv_heads"]), context, hd)
        caches = [(k, v)] + [(torch.randn_like(k), torch.randn_like(v)) for _ in
                             range(copies(2 * k.numel() * k.element_size(), grid) - 1)]
        heads = kv_heads * group
        rows = () if collect == "off" else tuple(range(q)) if collect in ("all", "rows") \
            else default_collect_rows(q)
        plan = plan_verify(batch, heads, kv_heads, hd, q, context, device=device,
                           collect_rows=rows, element_size=k.element_size(),
                           collect_sum=collect == "sum", collect_head_sum=collect == "rows")
        query = torch.randn(batch, q, heads, hd, device=device, dtype=k.dtype)
        lengths = torch.full((batch,), context, dtype=torch.int32, device=device)
        logits = new_logits_buffer(plan, context, device=device) if rows else None
        lse = torch.empty(batch, heads, q, device=device) if collect == "all" else None
        yield {"batch_kv_heads": batch * kv_heads, "context": context}, timer(
            [lambda k=k, v=v: verify_attention(query, k, v, lengths, plan, logits=logits,
                                               lse=lse) for k, v in caches], grid)
        del k, v, logits, caches


def _sparse(torch, device, timer, grid, settings, key, ats):
    from specsim.kernels.sparse_attention import plan_sparse, sparse_attention

    hd, group, per = key["head_dim"], key["group"], key["per_kv_head"]
    for at in ats:
        selected = int(at["selected"])
        length = max(4 * selected, 1024) if device.type == "cuda" else 2 * selected
        batch, kv_heads, k, v = _cache(torch, device, int(at["batch_kv_heads"]), length, hd)
        gathered = 2 * batch * kv_heads * selected * hd * k.element_size()
        caches = [(k, v)] + [(torch.randn_like(k), torch.randn_like(v)) for _ in
                             range(copies(gathered, grid) - 1)]
        heads = kv_heads * group
        shape = (batch, kv_heads, selected) if per else (batch, selected)
        indices = torch.sort(torch.randint(0, length, shape, device=device), dim=-1)[0] \
            .to(torch.int32).contiguous()
        counts = torch.full(shape[:-1], selected, dtype=torch.int32, device=device)
        plan = plan_sparse(batch, heads, kv_heads, hd, selected, device=device,
                           element_size=k.element_size())
        query = torch.randn(batch, heads, hd, device=device, dtype=k.dtype)
        yield {"batch_kv_heads": batch * kv_heads, "selected": selected}, timer(
            [lambda k=k, v=v: sparse_attention(query, k, v, indices, counts, plan)
             for k, v in caches], grid)
        del k, v, caches


def _selection_bytes(policy: str, key: dict, lists: int, context: int) -> float:
    """Bytes of the largest input one selection point allocates (its collected logits, or
    Quest's page bounds)."""
    if policy == "vegas":
        return 4.0 * lists * context
    if policy == "last-token":
        return 4.0 * lists * LAST_TOKEN_ROWS * context
    if policy == "sparsespec":
        return 2.0 * lists * key["group"] * key["rows"] * context
    from specsim.policies import get_policy                # quest: min and max per page
    return 2.0 * 2 * lists * key["head_dim"] * math.ceil(context / get_policy(policy).page_size)


def _selection(torch, device, timer, grid, settings, key, ats):
    from specsim.kernels import selection as S
    from specsim.policies import get_policy

    policy = get_policy(key["policy"])
    s = key["s"]
    for at in ats:
        lists, context = int(at["lists"]), int(at["context"])
        if _selection_bytes(policy.name, key, lists, context) > grid.max_cache_bytes:
            continue                # more collected logits than any model's refresh holds
        if policy.name in ("vegas", "last-token"):
            lengths = torch.full((lists,), context, dtype=torch.int32, device=device)
            if policy.name == "last-token":
                # the verify pass wrote each collected row summed over the heads (fp32
                # [lists, 1, rows, n]); the refresh picks each list's last accepted row
                logits = torch.randn(lists, 1, LAST_TOKEN_ROWS, context, device=device)
                pick = torch.randint(0, LAST_TOKEN_ROWS, (lists,), device=device)

                def select(x):
                    return S.vegas_select(S.picked_row_sum(x, pick, lengths, context),
                                          lengths, s, max_context=context, policy=policy,
                                          ranking=settings.ranking)
            else:
                if settings.c2q == "sum":
                    logits = torch.randn(lists, 1, 1, context, device=device)
                else:
                    logits = torch.randn(lists, ROWS_HEADS, 2, context, device=device,
                                         dtype=_dtype(torch, device))

                def select(x):
                    return S.vegas_select(x, lengths, s, max_context=context, policy=policy,
                                          ranking=settings.ranking)
            yield at, timer([lambda x=x: select(x) for x in _copies(torch, logits, grid)], grid)
        elif policy.name == "sparsespec":
            group, rows = key["group"], key["rows"]
            kv_heads = min(8, lists)
            sequences = max(1, lists // kv_heads)
            heads = kv_heads * group
            logits = torch.randn(sequences, heads, rows, context, device=device,
                                 dtype=_dtype(torch, device))
            lse = torch.randn(sequences, heads, rows, device=device).abs() + 10
            lengths = torch.full((sequences,), context, dtype=torch.int32, device=device)
            yield {"lists": sequences * kv_heads, "context": context}, timer(
                [lambda x=x: S.sparsespec_select(x, lengths, s, kv_heads, lse=lse,
                                                 max_context=context, policy=policy,
                                                 ranking=settings.ranking)
                 for x in _copies(torch, logits, grid)], grid)
        elif policy.name == "quest":
            group = key["group"]
            kv_heads = min(8, lists)
            batch = max(1, lists // kv_heads)
            heads = kv_heads * group
            hd = key["head_dim"]
            pages = math.ceil(context / policy.page_size)
            dtype = _dtype(torch, device)
            page_min = torch.randn(batch, kv_heads, pages, hd, device=device, dtype=dtype)
            query = torch.randn(batch, heads, hd, device=device, dtype=dtype)
            lengths = torch.full((batch,), context, dtype=torch.int32, device=device)
            yield {"lists": batch * kv_heads, "context": context}, timer(
                [lambda lo=lo, hi=hi: S.quest_select(query, lo, hi, lengths, s,
                                                     max_context=context, policy=policy,
                                                     ranking=settings.ranking)
                 for lo, hi in [(x, x + 1) for x in _copies(torch, page_min, grid)]], grid)


#: Query heads of Vegas' per-head rows (c2q=rows) and rows of last-token's head-summed buffer
#: the selections are timed on (a model of 32 heads; every row of a verify pass at k = 8).
ROWS_HEADS, LAST_TOKEN_ROWS = 32, 9


def _copies(torch, x, grid) -> list:
    """``x`` and enough copies of it to cycle through (``copies``)."""
    return [x] + [x.clone() for _ in range(copies(x.numel() * x.element_size(), grid) - 1)]


MEASURES = {"gemm": _gemm, "grouped_gemm": _grouped_gemm, "moe_routing": _moe_routing,
            "elementwise": _elementwise, "graph": _graph, "kv_append": _kv_append,
            "verify": _verify, "sparse": _sparse, "selection": _selection,
            "prefill_attention": _prefill_attention}

__all__ = ["OperatorGrid", "measure_operators", "resumable"]
