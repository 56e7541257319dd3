"""What `specsim predict` answers, as types: per (policy, s) group of a trace the speedup
curve over k with its confidence intervals and cost split, per policy its optimum over k and
s, the best group, the pairwise policy comparisons and the held-out tuning; and the what-if
curves. :mod:`specsim.predict` builds them; the CLI, the dashboards and `specsim review` read
them by attribute. ``to_json()`` is the `--json` output, with ``schema_version`` on top.

Units are in the field names: ``*_ms`` milliseconds, ``cost_split_at_k_star`` seconds;
speedups are over plain decoding on the same batch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

#: Version of the JSON layout of :class:`PredictReport` and :class:`WhatIfReport`.
SCHEMA_VERSION = 1


def optional(kw_only: bool = False):
    """A field that defaults to None and is left out of the JSON while it is None
    (``kw_only``: one that may sit before required fields, given by name)."""
    return field(default=None, kw_only=kw_only, metadata={"omit_none": True})


def to_json_value(value: Any) -> Any:
    """A report (or any part of one) as plain JSON values: dataclasses become objects in field
    order (fields marked ``optional`` dropped while None, ``internal`` ones always), tuples
    lists, numpy scalars Python numbers."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            if f.metadata.get("internal"):
                continue
            v = getattr(value, f.name)
            if v is None and f.metadata.get("omit_none"):
                continue
            out[f.name] = to_json_value(v)
        return out
    if isinstance(value, dict):
        return {k: to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


class _Json:
    def to_json(self) -> dict:
        return to_json_value(self)


class CI(NamedTuple):
    """A confidence interval (JSON: ``[low, high]``)."""

    low: float
    high: float


# --------------------------------------------------------------------------------------------
# one (policy, s) group of a trace
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostSplit(_Json):
    """One speculative iteration's time by component (the unit is the field's that holds it):
    k draft steps, the verify pass over k+1 tokens, KV selection, fixed overhead."""

    draft: float
    verify: float
    selection: float
    other: float

    @property
    def total(self) -> float:
        return self.draft + self.verify + self.selection + self.other

    def as_dict(self) -> dict[str, float]:
        return {"draft": self.draft, "verify": self.verify, "selection": self.selection,
                "other": self.other}


@dataclass(frozen=True)
class Position(_Json):
    """Draft position i as the trace shows it: how many iterations reached it, the conditional
    acceptance ``p`` (None where none did) and the survival ``P = Π_{j≤i} p_j``."""

    i: int
    reached: int
    p: float | None
    P: float


@dataclass(frozen=True)
class CurvePoint(_Json):
    """Draft length k of one group: expected tokens per iteration ``E[m+1]``, the tokens an
    answer emits per iteration (fewer for finite answers), the speedup, the iteration time and
    its split (ms), whether the acceptance at k is extrapolated beyond the measured positions,
    how it was obtained (``counterfactual`` replay or ``fitted``) and whether drafting k + 1
    beats k (None at the largest k)."""

    k: int
    expected_tokens: float
    expected_tokens_ci: CI
    emitted_tokens: float
    speedup: float
    speedup_ci: CI
    iteration_ms: float
    split_ms: CostSplit
    extrapolated: bool
    replay: str
    extend_helps: bool | None


@dataclass(frozen=True)
class CostedAs(_Json):
    """The policy and sparsity a group's iterations are priced with (the recorded ones unless
    the trace's drafter is not one specsim models, or it recorded no s)."""

    policy: str
    s: float | None
    #: a drafter other than sparse self-speculation (``eagle:NAME``, ``ngram``…): its label,
    #: where it was taken from (``trace`` | ``--drafter`` | ``assumed``), the source that
    #: priced its draft step, the verify tree's token count, and how acceptance is replayed
    #: at another k
    drafter: str | None = optional()
    drafter_origin: str | None = optional()
    draft_priced_by: str | None = optional()
    tree_tokens: int | None = optional()
    replay: str | None = optional()


@dataclass(frozen=True)
class ExtrapolationCheck(_Json):
    """The fitted per-position model checked on the trace itself: fitted on the first
    ``fit_positions`` positions, compared with the replay at the k beyond them."""

    fit_positions: int
    k: list[int]
    predicted: list[float]
    replayed: list[float]
    relative_error: list[float]
    max_abs_relative_error: float


@dataclass(frozen=True)
class GroupResult(_Json):
    """One (policy, s) group of a trace: what the trace shows, its speedup curve over k on the
    report's workload (``contexts``), k* with its bootstrap CI and frequency, and the cost
    split at k* (seconds)."""

    policy: str
    s: float | None
    costed_as: CostedAs
    requests: int
    bootstrap_unit: str
    iterations: int
    k_recorded: int
    observed_positions: int
    observed_tokens_per_iteration: float
    observed_alpha: float
    positions: list[Position]
    contexts: list[int]
    context_source: str
    plain_step_ms: float
    curve: list[CurvePoint]
    k_star: int
    speedup_at_k_star: float
    speedup_at_k_star_ci: CI
    k_star_ci: CI
    #: share of bootstrap replicates whose optimum is each k
    k_star_frequency: dict[int, float]
    cost_split_at_k_star: CostSplit
    extrapolation_check: ExtrapolationCheck | None = optional()
    #: [replicate, k] speedups, for paired comparisons; not in the JSON, and dropped from the
    #: groups of a finished :class:`PredictReport`
    bootstrap_speedups: np.ndarray | None = field(
        default=None, repr=False, compare=False, metadata={"internal": True})

    def at(self, k: int) -> CurvePoint:
        """The curve point of draft length k (k = 1 is the first)."""
        return self.curve[k - 1]

    @property
    def key(self) -> tuple[str, float | None]:
        return self.policy, self.s


# --------------------------------------------------------------------------------------------
# across groups
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThreeStep(_Json):
    """Vegas' 3-step tuning over the recorded s values: the (k, s) visited, where it ends,
    its speedup and the relative gap to the joint grid optimum."""

    path: list[tuple[int, float]]
    k: int
    s: float
    speedup: float
    gap_to_joint: float


@dataclass(frozen=True)
class PolicyOptimum(_Json):
    """One policy's joint optimum (k*, s*) over its recorded s values (``s_star`` None for a
    group without s) and, with ≥ 2 s values, Vegas' 3-step path beside it."""

    policy: str
    k_star: int
    s_star: float | None
    speedup: float
    s_values: list[float | None]
    three_step: ThreeStep | None = optional()


@dataclass(frozen=True)
class RunnerUp(_Json):
    policy: str
    s: float | None
    k: int
    speedup: float


@dataclass(frozen=True)
class Distinction(_Json):
    """Does the best group beat the runner-up group in the bootstrap? Distinguishable when it
    wins in ≥ 95% of the replicates."""

    runner_up: RunnerUp
    share_of_replicates_best_wins: float
    distinguishable: bool


@dataclass(frozen=True)
class Best(_Json):
    """The best (policy, s, k) of the report, with its CI; ``distinguishable_from_runner_up``
    is None when the trace has a single group."""

    policy: str
    s: float | None
    k: int
    speedup: float
    speedup_ci: CI
    distinguishable_from_runner_up: Distinction | None = None


@dataclass(frozen=True)
class PolicyComparison(_Json):
    """Two policies, each at its own optimum: the share of bootstrap replicates in which
    ``a`` beats ``b`` (a tie counts half), distinguishable when ≥ level or ≤ 1 − level."""

    a: str
    b: str
    a_speedup: float
    b_speedup: float
    share_a_wins: float
    distinguishable: bool


# --------------------------------------------------------------------------------------------
# held-out tuning
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice(_Json):
    k: int
    s: float | None


@dataclass(frozen=True)
class ChoiceSpeedup(_Json):
    k: int
    s: float | None
    speedup: float


@dataclass(frozen=True)
class HoldoutRow(_Json):
    """One policy's (k, s) picked on the tuning part, its speedup there and on the evaluation
    part (with a CI where the analytical model gives one), the pick the evaluation part would
    have made itself, and ``optimism``: how much tuning on the test set would have flattered
    the result."""

    policy: str
    tuned: Choice
    speedup_on_tuning_part: float
    speedup_on_evaluation_part: float
    speedup_ci: CI | None = optional(kw_only=True)
    tuned_on_evaluation: ChoiceSpeedup
    optimism: float


@dataclass(frozen=True)
class Holdout(_Json):
    holdout_fraction: float
    seed: int
    tuning_requests: int
    evaluation_requests: int
    policies: list[HoldoutRow]
    best: HoldoutRow


# --------------------------------------------------------------------------------------------
# what the report was costed for
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSummary(_Json):
    name: str
    params: int
    active_params: int
    kv_bytes_per_token: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    sliding_layers: int

    @classmethod
    def of(cls, spec) -> "ModelSummary":
        return cls(spec.name, spec.param_count(), spec.param_count(active=True),
                   spec.kv_bytes_per_token, spec.num_layers, spec.num_heads, spec.num_kv_heads,
                   spec.head_dim, spec.sliding_layers)


@dataclass(frozen=True)
class HardwareSummary(_Json):
    name: str
    bandwidth_TBps: float
    bf16_TFLOPs: float
    ceilings: str               # "measured" or "datasheet"
    memory_GB: float

    @classmethod
    def of(cls, hw) -> "HardwareSummary":
        return cls(hw.name, hw.bandwidth / 1e12, hw.flops / 1e12,
                   "measured" if hw.ceilings_measured else "datasheet", hw.memory_bytes / 1e9)


# --------------------------------------------------------------------------------------------
# the reports
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured(_Json):
    """What a Spec-Bench run timed itself, beside the prediction: its tokens per second
    (Σ new_tokens / Σ wall_time), the vanilla run's and their ratio where a vanilla file was
    given, the GPU it ran on (``--recorded-on``: the files do not say), and the prediction at
    the recorded k on this report's hardware. ``comparable``: the run's GPU is the report's."""

    tokens_per_s: float
    new_tokens: int
    wall_time_s: float
    recorded_on: str | None
    comparable: bool
    note: str
    vanilla_tokens_per_s: float | None = optional()
    speedup: float | None = optional()
    predicted_speedup_at_k_recorded: float | None = optional()
    k_recorded: int | None = optional()


@dataclass(frozen=True)
class PredictReport(_Json):
    """`specsim predict` on a trace. ``notes`` are the caveats a reader must see (synthetic
    trace, assumed values, optimum at the edge of the grid, batch not fitting). ``model``,
    ``hardware``, ``tp``, ``costs`` (the cost model's description) and ``cost_validation``
    (what the shipped validation runs say of that source) are set by the caller that knows
    them (the CLI); ``holdout`` with ``--holdout``."""

    trace: str | None
    synthetic: bool
    trace_model: str | None
    bootstrap_paired_by_prompt: bool
    cost_model: str
    batch: int
    bootstrap: int
    confidence_level: float
    groups: list[GroupResult]
    policies: list[PolicyOptimum]
    best: Best
    notes: list[str]
    policy_comparison: list[PolicyComparison]
    holdout: Holdout | None = optional()
    model: ModelSummary | None = optional()
    hardware: HardwareSummary | None = optional()
    tp: int | None = optional()
    costs: str | None = optional()
    cost_validation: str | None = optional()
    measured: Measured | None = optional()
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict:
        body = to_json_value(self)
        return {"schema_version": body.pop("schema_version"), **body}

    @property
    def policy_names(self) -> list[str]:
        return [p.policy for p in self.policies]

    def policy(self, name: str) -> PolicyOptimum:
        """The per-policy optimum of ``name``."""
        for p in self.policies:
            if p.policy == name:
                return p
        raise KeyError(f"no policy '{name}' in the report; it has {self.policy_names}")

    def policy_groups(self, name: str) -> list[GroupResult]:
        """The groups of one policy by s, a group without s first (as predict orders them)."""
        return sorted((g for g in self.groups if g.policy == name),
                      key=lambda g: -1 if g.s is None else g.s)

    def group(self, policy: str, s: float | None) -> GroupResult:
        for g in self.groups:
            if g.policy == policy and g.s == s:
                return g
        raise KeyError(f"no group ({policy}, s={s}) in the report")

    def best_group(self) -> GroupResult:
        return self.group(self.best.policy, self.best.s)


@dataclass(frozen=True)
class WhatIfPoint(_Json):
    k: int
    expected_tokens: float
    speedup: float


@dataclass(frozen=True)
class WhatIfReport(_Json):
    """A what-if without trace or hardware (``T_ar = C_v = 1``, ``γ = C_d / C_v``):
    ``mode`` "alpha" (SparseSpec-L's α, with the slope dS/dk and whether longer drafts help)
    or "rates" (per-position conditional acceptance and its survival)."""

    mode: str
    alpha: float | None = optional(kw_only=True)
    gamma: float
    conditional: list[float] | None = optional(kw_only=True)
    survival: list[float] | None = optional(kw_only=True)
    k_star: int
    speedup_at_k_star: float
    curve: list[WhatIfPoint]
    slope_dS_dk: list[float] | None = optional()
    longer_drafts_help: bool | None = optional()
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict:
        body = to_json_value(self)
        return {"schema_version": body.pop("schema_version"), **body}
