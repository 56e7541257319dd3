"""KV-selection policies for sparse drafting: how many KV entries a draft step attends to.

One place for each policy's budget rule; the cost models, the kernels' planners and the engine
call :func:`selected_tokens`. ``s`` is the sparsity ratio (selected KV entries / context).

- ``vegas``: top ``max(ceil(s·ctx), 256)`` positions by the head-averaged pre-softmax logits of
  two collected verify rows (first draft token, bonus token), plus a recent window; one ranking
  per layer and sequence, shared by KV heads; token granularity.
- ``last-token``: as Vegas, ranked by the last accepted token's row only (SpecExtend-style).
- ``vegas-all``: as Vegas, ranked by all k+1 verify rows (what Collect-2-Query approximates).
- ``sparsespec``: per (layer, KV head): sink tokens ∪ top-K_mid by attention weight summed over
  the last W verify queries ∪ recent tokens, ``ceil(s·ctx)`` entries in all.
- ``streamingllm``: sink tokens + the most recent window, ``ceil(s·ctx)`` entries in all.
- ``quest``: pages of 16 tokens ranked by ``Σ_i max(q_i·min_i, q_i·max_i)`` at every draft step,
  ``ceil(ceil(s·ctx) / 16)`` pages per KV head.
- ``full``: no sparsity (s = 1); drafting with the full KV, the reference point.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.errors import SpecsimError


@dataclass(frozen=True)
class Policy:
    name: str
    min_selected: int = 0      # Vegas' floor of 256 ranked positions
    recent: int = 0            # recent tokens always kept (beyond the ranked budget for Vegas)
    sink: int = 0              # attention-sink tokens always kept
    page_size: int = 1         # selection granularity
    per_kv_head: bool = False  # one index list per KV head (else one per layer and sequence)
    collected_rows: int = 0    # verify rows whose logits are written for selection
    rescore_every_draft: bool = False  # Quest re-estimates at each draft step
    budget_includes_recent: bool = True

    def selected(self, context: int, s: float) -> int:
        """KV entries one draft step attends to in one full-attention layer."""
        return int(self.selected_array(np.asarray([context]), s)[0])

    def selected_array(self, contexts: np.ndarray, s: float) -> np.ndarray:
        """:meth:`selected` for every context of a (ragged) batch at once."""
        ctx = np.asarray(contexts, dtype=np.int64)
        if self.name == "full":
            return np.maximum(ctx, 0)
        if not 0.0 < s <= 1.0:
            raise SpecsimError(f"sparsity s must lie in (0, 1], got {s}")
        budget = np.ceil(s * ctx).astype(np.int64)
        if self.min_selected:
            budget = np.maximum(budget, self.min_selected)
        if not self.budget_includes_recent:
            budget = budget + self.recent
        budget = np.maximum(budget, self.sink + (self.recent if self.budget_includes_recent
                                                  else 0))
        if self.page_size > 1:
            budget = -(-budget // self.page_size) * self.page_size
        return np.clip(np.minimum(ctx, budget), 0, None)


POLICIES: dict[str, Policy] = {
    "vegas": Policy("vegas", min_selected=256, recent=32, collected_rows=2,
                    budget_includes_recent=False),
    "last-token": Policy("last-token", min_selected=256, recent=32, collected_rows=1,
                         budget_includes_recent=False),
    # Vegas ranked by all k+1 verify rows instead of two: the reference Collect-2-Query
    # approximates (collected_rows = 0 means "every verify row")
    "vegas-all": Policy("vegas-all", min_selected=256, recent=32, collected_rows=0,
                        budget_includes_recent=False),
    "sparsespec": Policy("sparsespec", sink=4, recent=32, per_kv_head=True, collected_rows=16),
    "streamingllm": Policy("streamingllm", sink=4, recent=0),
    "quest": Policy("quest", page_size=16, per_kv_head=True, rescore_every_draft=True),
    "full": Policy("full"),
}

#: the selection methods specsim compares (``full`` is plain drafting, ``vegas-all`` a reference)
SELECTION_POLICIES = ("vegas", "sparsespec", "streamingllm", "quest", "last-token")

#: SparseSpec-L scores with the attention of the last W verify queries.
SPARSESPEC_WINDOW = 16

#: The policies whose lists a ranking orders (StreamingLLM's window is arithmetic).
RANKED_POLICIES = ("vegas", "vegas-all", "last-token", "sparsespec", "quest")

#: ``EngineSettings.ranking="best"`` (the engine's default, ``specsim.kernels.selection``):
#: each policy's fastest ranking as measured on the H200 (every layer's rows at once, as the
#: engine ranks them, batch 4; ``specsim.kernels.topk_select`` for the chunked path): the
#: radix kernels for all. Vegas' and last-token's summed rows (Qwen3-8B, 144 rows) 553 vs
#: 790 µs by ``torch.topk`` at 128K, 162 vs 266 at 32K; SparseSpec-L's 1,152 rows of 128K
#: 6.19 vs 9.28 ms at s = 0.1 (5.84 by topk at s = 0.03), 1.55 vs 1.68 ms at 32K; Quest's
#: fused page selection 97 vs 260 µs a layer at 128K.
BEST_RANKING = dict.fromkeys(RANKED_POLICIES, "radix")
#: What "best" resolved to for files that do not record it (``provenance.engine.best_ranking``
#: is recorded with every run since).
LEGACY_BEST_RANKING = {"sparsespec": "radix", "quest": "radix"}


def recorded_best_ranking(engine: dict) -> dict:
    """What "best" resolved to per policy in the run whose ``provenance.engine`` is
    ``engine`` (:data:`LEGACY_BEST_RANKING` where it does not record it)."""
    return dict(engine.get("best_ranking", LEGACY_BEST_RANKING))


def resolve_ranking(policy: str, ranking: str | None, best: dict | None = None) -> str:
    """The ranking ``policy``'s lists are built with under the setting ``ranking`` ("best"
    resolved by ``best``, default ``BEST_RANKING``, as a file records it; None, as in
    calibrations measured before the setting was recorded: topk, the only ranking then)."""
    ranking = ranking or "topk"
    best = BEST_RANKING if best is None else best
    return best.get(policy, "topk") if ranking == "best" else ranking


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name.lower()]
    except KeyError:
        raise SpecsimError(f"unknown selection policy '{name}'; known: "
                           f"{', '.join(POLICIES)}") from None


def selected_tokens(policy: str | Policy, context: int, s: float) -> int:
    policy = get_policy(policy) if isinstance(policy, str) else policy
    return policy.selected(context, s)
