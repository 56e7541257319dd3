"""The cost interface: what one plain step, draft step, verify pass and selection cost.

Every cost model (roofline, calibrated) answers the same five questions for a batch given as
its *ragged* list of context lengths (never its mean):

- ``plain_step(contexts)``            → ``T_ar``
- ``draft_step(contexts, s, policy)``  → ``C_d(s)``
- ``verify(contexts, q)``              → ``C_v(q)``
- ``selection(contexts, s, policy, k)`` → ``C_sel(s)`` per iteration
- ``iteration(contexts, k, s, policy)`` → ``T(k, s)`` with its split, via
  :func:`specsim.analytical.iteration_time`.
- ``prefill(prompt_lengths)`` → the prompt pass a serving simulator charges on admission.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol, Sequence

import numpy as np

from specsim import analytical


@dataclass(frozen=True)
class Cost:
    """Time of one operation and what it moved. Bytes and FLOPs are per GPU."""

    seconds: float
    weight_bytes: float = 0.0
    kv_bytes: float = 0.0
    other_bytes: float = 0.0     # indices, collected logits, page metadata, activations
    flops: float = 0.0
    overhead_s: float = 0.0      # launch / CPU / latency terms
    comm_s: float = 0.0          # tensor-parallel all-reduce
    bound: str = "memory"        # which roofline term dominated: memory | compute | overhead
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.other_bytes

    def scaled(self, n: float) -> "Cost":
        """n repetitions of this operation (e.g. k draft steps)."""
        return Cost(self.seconds * n, self.weight_bytes * n, self.kv_bytes * n,
                    self.other_bytes * n, self.flops * n, self.overhead_s * n, self.comm_s * n,
                    self.bound, self.notes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bytes"] = self.bytes
        d["notes"] = list(self.notes)
        return d


@dataclass(frozen=True)
class IterationCost:
    """``T(k, s) = k·C_d(s) + C_v(k+1) + C_sel(s) + overhead`` with each term kept."""

    k: int
    draft_step: Cost   # one draft step, C_d(s)
    verify: Cost       # one verify pass over k + 1 query tokens, C_v(k+1)
    selection: Cost    # C_sel(s) for the whole iteration
    overhead_s: float  # per-iteration overhead (accept/reject, rollback, bookkeeping)

    @property
    def draft(self) -> Cost:
        """All k draft steps of the iteration."""
        return self.draft_step.scaled(self.k)

    @property
    def seconds(self) -> float:
        return float(analytical.iteration_time(self.k, self.draft_step.seconds,
                                               self.verify.seconds, self.selection.seconds,
                                               self.overhead_s))

    def split(self) -> dict[str, float]:
        """Seconds by component: draft / verify / selection / other."""
        return {"draft": self.draft.seconds, "verify": self.verify.seconds,
                "selection": self.selection.seconds, "other": self.overhead_s}


class CostModel(Protocol):
    name: str

    def plain_step(self, contexts: Sequence[int]) -> Cost: ...

    def draft_step(self, contexts: Sequence[int], s: float, policy: str) -> Cost: ...

    def verify(self, contexts: Sequence[int], q: int) -> Cost: ...

    def selection(self, contexts: Sequence[int], s: float, policy: str, k: int) -> Cost: ...

    def iteration(self, contexts: Sequence[int], k: int, s: float, policy: str
                  ) -> IterationCost: ...

    def prefill(self, prompt_lengths: Sequence[int], past: Sequence[int] | None = None
                ) -> Cost: ...


def compose_iteration(costs, contexts, k: int, s: float, policy: str) -> IterationCost:
    """``T(k, s)`` from a cost model's parts: k draft steps, a verify pass of k + 1 tokens,
    one selection, and the model's per-iteration overhead."""
    if k < 1:
        raise ValueError("draft length k must be ≥ 1")
    return IterationCost(k=k, draft_step=costs.draft_step(contexts, s, policy),
                         verify=costs.verify(contexts, k + 1),
                         selection=costs.selection(contexts, s, policy, k),
                         overhead_s=costs.overheads.iteration)


#: Steps a cost model remembers (a predict sweep over k and s prices the same draft, verify
#: and selection steps many times).
STEP_MEMO = 65536


def memoized(model, key: tuple, compute):
    """``compute()`` once per ``key`` for this cost model instance (its costs are pure)."""
    memo = model.__dict__.setdefault("_step_memo", {})
    if key not in memo:
        if len(memo) >= STEP_MEMO:
            memo.clear()
        memo[key] = compute()
    return memo[key]


def as_contexts(contexts) -> np.ndarray:
    """The batch's context lengths as a 1-D int64 array (the same array when it is one: the
    cost models call this hundreds of thousands of times in a dashboard)."""
    if type(contexts) is np.ndarray and contexts.dtype == np.int64 and contexts.ndim == 1:
        arr = contexts
    else:
        arr = np.atleast_1d(np.asarray(contexts, dtype=np.int64))
    if arr.size == 0:
        raise ValueError("a batch needs at least one sequence")
    if arr.min() < 1:
        raise ValueError("context lengths must be ≥ 1")
    return arr
