"""What `specsim tune` optimises and under which service-level objectives.

An *objective* ranks the simulated settings: ``throughput`` (output tokens per second over the
whole run, higher is better) or a latency percentile (``tpot-p50``, ``tpot-p99``, ``ttft-p99``
and the other :data:`LATENCY_METRICS`, lower is better). An *SLO* bounds a latency percentile
(``tpot-p99=50ms``); a setting that exceeds any bound is infeasible. The pick is the feasible
setting best on the objective; where none is feasible there is no pick, and the setting that
misses the bounds by the least is named instead. The trade-off between throughput and the
objective's latency is the Pareto front of the simulated settings: those no other setting
beats on both.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from specsim.errors import SpecsimError

#: Latency percentiles a row of the sweep carries: name → row field (seconds).
LATENCY_METRICS = {f"{what}-p{p}": f"{what}_p{p}_s"
                   for what in ("tpot", "ttft", "latency") for p in (50, 90, 99)}
OBJECTIVES = ("throughput",) + tuple(LATENCY_METRICS)

_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|µs|ms|s)\s*$")


class ObjectiveError(SpecsimError):
    """An objective or SLO that cannot be read."""


@dataclass(frozen=True)
class Objective:
    name: str

    @property
    def field(self) -> str:
        return "throughput" if self.name == "throughput" else LATENCY_METRICS[self.name]

    @property
    def maximise(self) -> bool:
        return self.name == "throughput"

    def value(self, row: dict) -> float:
        v = row.get(self.field)
        return math.nan if v is None else float(v)


@dataclass(frozen=True)
class Slo:
    metric: str        # a LATENCY_METRICS name
    limit_s: float

    @property
    def field(self) -> str:
        return LATENCY_METRICS[self.metric]

    def excess(self, row: dict) -> float:
        """How far ``row`` is over the bound, relative to it (0 when it holds; infinite when
        the row has no value for the metric)."""
        v = row.get(self.field)
        if v is None or not math.isfinite(v):
            return math.inf
        return max(0.0, float(v) / self.limit_s - 1.0)

    def text(self) -> str:
        return f"{self.metric} ≤ {format_seconds(self.limit_s)}"


def parse_objective(text: str) -> Objective:
    name = text.strip().lower()
    if name not in OBJECTIVES:
        raise ObjectiveError(f"objective {text!r}: expected one of {', '.join(OBJECTIVES)}")
    return Objective(name)


def parse_duration(text: str) -> float:
    """Seconds of a duration with its unit: ``50ms``, ``0.2 s``, ``800us``."""
    m = _DURATION.match(text)
    if not m:
        raise ObjectiveError(f"duration {text!r}: expected a number and a unit (us, ms or s), "
                             f"as in 50ms")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ObjectiveError(f"duration {text!r}: expected a positive, finite time")
    return seconds


def parse_slos(text: str | None) -> tuple[Slo, ...]:
    """``tpot-p99=50ms,ttft-p99=2s`` → the bounds (none for an empty or missing text)."""
    if text is None or not text.strip():
        return ()
    out: dict[str, Slo] = {}
    for part in text.split(","):
        metric, sep, limit = part.partition("=")
        metric = metric.strip().lower()
        if not sep:
            raise ObjectiveError(f"SLO {part.strip()!r}: expected METRIC=DURATION, as in "
                                 f"tpot-p99=50ms")
        if metric not in LATENCY_METRICS:
            raise ObjectiveError(f"SLO {part.strip()!r}: expected a metric among "
                                 f"{', '.join(LATENCY_METRICS)}")
        if metric in out:
            raise ObjectiveError(f"SLO {metric} given twice")
        out[metric] = Slo(metric, parse_duration(limit))
    return tuple(out.values())


def format_seconds(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def pick(rows: list[dict], objective: Objective, slos: tuple[Slo, ...] = ()) -> dict:
    """The feasible rows' best on ``objective`` (``best``: None when no row meets every SLO),
    the runner-up, how many rows are feasible, and, where none is, the row whose largest
    relative excess over a bound is smallest (``closest``)."""
    feasible = [r for r in rows if all(slo.excess(r) == 0.0 for slo in slos)]
    ranked = sorted(feasible, key=lambda r: _rank_key(objective, r))
    closest = None
    if not feasible and rows:
        closest = min(rows, key=lambda r: (max(slo.excess(r) for slo in slos),
                                           _rank_key(objective, r)))
    return {"objective": objective.name, "slos": [s.text() for s in slos],
            "feasible": len(feasible), "settings": len(rows),
            "best": ranked[0] if ranked else None,
            "runner_up": ranked[1] if len(ranked) > 1 else None, "closest": closest}


def _rank_key(objective: Objective, row: dict) -> tuple:
    v = objective.value(row)
    if math.isnan(v):
        return (1, 0.0)
    return (0, -v if objective.maximise else v)


def setting_label(row: dict) -> str:
    """A swept setting in words: plain decoding or (policy, s, k), and its largest batch."""
    if row["policy"] == "plain":
        return f"plain decoding, batch ≤ {row['max_batch']}"
    return f"{row['policy']} s={row['s']:g} k={row['k']}, batch ≤ {row['max_batch']}"


def pareto_front(rows: list[dict], latency_field: str) -> list[dict]:
    """Rows no other row beats on both throughput (higher) and ``latency_field`` (lower),
    sorted by latency."""
    usable = [r for r in rows if r.get(latency_field) is not None
              and math.isfinite(r[latency_field])]
    usable.sort(key=lambda r: (r[latency_field], -r["throughput"]))
    front, best = [], -math.inf
    for r in usable:
        if r["throughput"] > best:
            front.append(r)
            best = r["throughput"]
    return front
