"""The operator table file: what ``specsim calibrate --gpu --operators`` writes and the operator
cost model (:mod:`specsim.costs.operators`) reads.

One file per GPU holds model-agnostic measurements of the operators every catalogue model is
composed of, each a *point*: an operator name (``OPERATORS``), its discrete ``key`` (e.g. a
GEMM's ``n`` and ``k``, an attention kernel's ``head_dim``, ``group``, ``q`` and what it
collects), the continuous axes it was measured ``at`` (a GEMM's ``m`` tokens; an attention
pass's ``batch_kv_heads`` and ``context``) and its raw timing samples in milliseconds. Beside
them:

- ``provenance``: GPU, multiprocessors, clocks, driver, CUDA, torch, triton, the kernels' source
  hash, the engine settings (:class:`specsim.settings.EngineSettings`, ``to_json`` and
  ``stable_hash``), the grid, the date, and whether every group was measured;
- ``probe``: the copy bandwidth and bf16 matmul rate measured in the same run, so a table
  measured on one machine can be normalised against another's probe.

Every problem with a file is a one-line :class:`~specsim.errors.SpecsimError` naming the file
and the field.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from specsim.atomic import atomic_writer, read_versioned_json
from specsim.costs.calibration_file import MAX_SAMPLE_MS
from specsim.errors import SpecsimError
from specsim.settings import EngineSettings, recorded_hash, recorded_settings

FORMAT_KEY = "specsim_operators"
VERSION = 1

#: Each operator: its key fields and the axes it is measured at.
OPERATORS = {
    # a bf16 nn.Linear of ``m`` rows: [m, k] @ [k, n]
    "gemm": (("n", "k"), ("m",)),
    # the verify kernel (plan_verify) for one layer: q query tokens per sequence over its full
    # KV; collect: off (nothing), sum (Vegas' summed row), rows (every row's logits)
    "verify": (("head_dim", "group", "q", "collect"), ("batch_kv_heads", "context")),
    # the sparse draft kernel (plan_sparse) for one layer: one query over ``selected`` entries
    "sparse": (("head_dim", "group", "per_kv_head"), ("batch_kv_heads", "selected")),
    # the fused one-position K/V append of one layer (paged: with Quest's page bounds)
    "kv_append": (("head_dim", "paged"), ("batch_kv_heads",)),
    # one compiled element-wise kernel (norm, rotary, SwiGLU, residual, casts) moving ``bytes``
    "elementwise": ((), ("bytes",)),
    # one policy's selection for every list of a step at once (lists = layers·batch, times KV
    # heads for per-KV-head policies), over a buffer of ``context`` positions, keeping a
    # fraction ``s`` of it (its winners are sorted: the time grows with s); group, rows
    # (ranked verify rows) and head_dim (Quest's page bounds, which its scoring reads) where
    # the policy's cost depends on them, else 0
    "selection": (("policy", "group", "rows", "s", "head_dim"), ("lists", "context")),
    # replay of a CUDA graph holding ``kernels`` minimal kernels, with the host's wait
    "graph": ((), ("kernels",)),
    # the MoE layers' grouped GEMM (``torch._grouped_mm``): ``rows`` token-expert pairs spread
    # evenly over ``groups`` experts, each [rows/groups, k] @ [k, n]; where rows < groups only
    # ``rows`` experts get a row (their weights alone are read)
    "grouped_gemm": (("n", "k"), ("rows", "groups")),
    # an MoE layer around its GEMMs: routing from the router's logits over ``experts``, the
    # dispatch of ``tokens``·``top`` token-expert pairs of width ``hidden`` and their weighted
    # combine
    "moe_routing": (("experts", "top", "hidden"), ("tokens",)),
    # one layer's prefill attention of one prompt (``prefill_attention``) on one of the
    # engine's kernels (``specsim.costs.prefill.OPERATOR_PATHS``: causal, window), at
    # ``elements`` query-key products summed over the query heads (``attention_elements``)
    "prefill_attention": (("head_dim", "group", "path"), ("elements",)),
}
#: The one fraction s that tables measured before selections were keyed by s timed them at.
LEGACY_SELECTION_S = 0.05
#: The head dim tables measured Quest's page scoring at before selections were keyed by it.
LEGACY_QUEST_HEAD_DIM = 128
#: Provenance every file carries (a string, a number or null each).
PROVENANCE_FIELDS = ("gpu", "driver", "cuda", "torch", "triton", "kernel_config_hash",
                     "engine", "date", "complete")
#: The probe every file carries.
PROBE_FIELDS = ("copy_bandwidth_Bps", "bf16_matmul_flops")


@dataclass
class Point:
    """One measured point of one operator."""

    op: str
    key: dict
    at: dict
    samples_ms: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def key_tuple(self) -> tuple:
        return tuple(self.key[name] for name in OPERATORS[self.op][0])

    @property
    def at_tuple(self) -> tuple:
        return tuple(float(self.at[name]) for name in OPERATORS[self.op][1])

    def to_json(self) -> dict:
        spread = float(np.std(self.samples_ms)) if self.samples_ms else 0.0
        return {"op": self.op, "key": self.key, "at": self.at,
                "median_ms": self.median_ms, "std_ms": spread, "samples_ms": self.samples_ms}


@dataclass
class OperatorTable:
    provenance: dict
    probe: dict
    points: list[Point]
    path: str | None = None
    #: prefill_attention points of an older table's masked path, not read (their path is gone)
    retired_prefill_points: int = 0

    @property
    def settings(self) -> EngineSettings:
        return recorded_settings(self.provenance["engine"]["settings"])

    @property
    def groups(self) -> dict[tuple, list[Point]]:
        """Points by (operator, key)."""
        out: dict[tuple, list[Point]] = {}
        for p in self.points:
            out.setdefault((p.op, p.key_tuple), []).append(p)
        return out

    def to_json(self) -> dict:
        return {FORMAT_KEY: VERSION, "provenance": self.provenance, "probe": self.probe,
                "points": [p.to_json() for p in self.points]}

    def write(self, path: str) -> None:
        with atomic_writer(path) as fh:
            json.dump(self.to_json(), fh, indent=1)


def _bad(path, message) -> SpecsimError:
    return SpecsimError(f"{path}: bad operator table: {message}")


def read_operator_table(path: str) -> OperatorTable:
    """The operator table in ``path``, validated; any problem is a one-line error naming the
    file and the field."""
    doc, prov = read_versioned_json(path, "operator table", FORMAT_KEY, VERSION)
    missing = [f for f in PROVENANCE_FIELDS if f not in prov]
    if missing:
        raise _bad(path, f"provenance lacks {', '.join(missing)}")
    engine = prov["engine"]
    if not isinstance(engine, dict) or not isinstance(engine.get("settings"), dict):
        raise _bad(path, "provenance.engine.settings must be an object")
    try:
        recorded_settings(engine["settings"])
    except SpecsimError as exc:
        raise _bad(path, f"provenance.engine.settings: {exc}") from None
    if engine.get("settings_hash") != recorded_hash(engine["settings"]):
        raise _bad(path, "provenance.engine.settings_hash does not match its settings")
    probe = doc.get("probe")
    if not isinstance(probe, dict):
        raise _bad(path, "missing probe")
    for name in PROBE_FIELDS:
        value = probe.get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise _bad(path, f"probe.{name} must be a positive number")
    rows = doc.get("points")
    if not isinstance(rows, list) or not rows:
        raise _bad(path, "no points")
    points, retired = [], 0
    # a table measured before selections were keyed by s timed them all at its method's one s
    method = prov.get("method") if isinstance(prov.get("method"), dict) else {}
    older_s = method.get("selection_s", LEGACY_SELECTION_S)
    for i, row in enumerate(rows):
        row = _older_selection(_older_prefill(row), older_s)
        if row is None:
            retired += 1
        if not row:
            continue
        points.append(_point(path, f"points[{i}]", row))
    return OperatorTable(prov, probe, points, path, retired_prefill_points=retired)


def _older_selection(row, s: float):
    """A ``selection`` point of an older table keyed as now: one that timed every selection at
    one fraction ``s`` (its ``method.selection_s``) keyed by it, one that timed Quest's page
    scoring at head_dim 128 alone keyed by that (0 for the other policies)."""
    if not (isinstance(row, dict) and row.get("op") == "selection"
            and isinstance(row.get("key"), dict)):
        return row
    key = dict(row["key"])
    key.setdefault("s", s)
    key.setdefault("head_dim", LEGACY_QUEST_HEAD_DIM if key.get("policy") == "quest" else 0)
    return dict(row, key=key)


def _older_prefill(row):
    """A ``prefill_attention`` point of a table measured before the engine's current prefill
    kernels: keyed ``masked`` (its causal points are the causal path's; its masked points
    timed a path the engine no longer runs: None, not read and counted as retired), or on the
    ``sinks`` path, which now runs the causal kernel (``False``: not read, nothing lost)."""
    if not (isinstance(row, dict) and row.get("op") == "prefill_attention"
            and isinstance(row.get("key"), dict)):
        return row
    if row["key"].get("path") == "sinks":
        return False
    if "masked" not in row["key"]:
        return row
    key = dict(row["key"])
    if key.pop("masked"):
        return None
    return dict(row, key=dict(key, path="causal"))


def _point(path, where: str, row) -> Point:
    if not isinstance(row, dict):
        raise _bad(path, f"{where} must be an object")
    op = row.get("op")
    if op not in OPERATORS:
        raise _bad(path, f"{where}.op: unknown operator {op!r} (known: {', '.join(OPERATORS)})")
    key_names, axes = OPERATORS[op]
    key, at = row.get("key"), row.get("at")
    if not isinstance(key, dict) or sorted(key) != sorted(key_names):
        raise _bad(path, f"{where}.key must hold {', '.join(key_names) or 'nothing'}")
    if not isinstance(at, dict) or sorted(at) != sorted(axes):
        raise _bad(path, f"{where}.at must hold {', '.join(axes)}")
    for name in axes:
        value = at[name]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise _bad(path, f"{where}.at.{name} must be a positive number")
    samples = row.get("samples_ms")
    if not isinstance(samples, list) or not samples or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            and 0 <= x <= MAX_SAMPLE_MS for x in samples):
        raise _bad(path, f"{where}.samples_ms must be a non-empty list of times in "
                         f"[0, {MAX_SAMPLE_MS:g}] ms")
    return Point(op, dict(key), dict(at), [float(x) for x in samples])


__all__ = ["FORMAT_KEY", "OPERATORS", "OperatorTable", "Point", "VERSION",
           "read_operator_table"]
