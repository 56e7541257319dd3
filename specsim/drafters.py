"""Drafters: what proposes the k draft tokens of an iteration, and what one draft step costs.

An iteration costs ``T(k) = k·C_d + C_v(q) + C_sel + overhead`` (DESIGN.md); the drafter
decides ``C_d``, ``C_sel`` and the verify's query count q:

- ``sparse-self``: the target drafts over a selected KV subset (vegas, sparsespec,
  streamingllm, quest, last-token); priced by the cost model's own draft and selection steps.
- ``eagle``: one decoder layer of the target's width over its own KV of the full context, the
  fc layer that maps the target's features (2·hidden wide for EAGLE-1/2, 3·hidden for EAGLE-3,
  whose layer's q|k|v projection also reads 2·hidden) and the LM head; EAGLE-3's reduced draft
  vocabulary (``draft_vocab_size``) shrinks the LM head, which dominates a large-vocab step.
- ``mtp``: the model's multi-token-prediction module: one decoder layer of the target (its
  ``eh_proj`` fc of 2·hidden → hidden) and the shared LM head.
- ``medusa``: per head a residual block (hidden × hidden) and the head's own LM head; k heads
  draft k tokens, no KV.
- ``draft-model``: another model's full plain step (its own KV over the context).
- ``ngram``: prompt lookup, no draft forward.

A token tree (Medusa, EAGLE-2/3 trees) is verified in one pass of the tree's token count with a
tree mask, priced as a verify of q = tree tokens. Every draft step is priced through the same
cost source as the target where that source can compose it (operator tables); a source that
measured whole steps only (a calibration) prices the head by its roofline, and says so.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specsim.costs.base import Cost, IterationCost, as_contexts, memoized
from specsim.errors import SpecsimError
from specsim.policies import POLICIES
from specsim.specs import FULL_ATTENTION, ModelSpec

KINDS = ("sparse-self", "eagle", "mtp", "medusa", "draft-model", "ngram")
#: Kinds that draft with a small head of the target's width (a head config may name it).
HEAD_KINDS = ("eagle", "mtp", "medusa")
#: Shipped draft-head configs (models/drafters/<name>.json) by the catalogue model they serve.
SHIPPED_HEADS = {"llama-3.1-8b": "llama-3.1-8b-eagle3", "qwen3-8b": "qwen3-8b-eagle3"}

#: Method names a trace or a Spec-Bench file records → drafter kind.
RECORDED = {"eagle": "eagle", "eagle2": "eagle", "eagle3": "eagle", "eagle-3": "eagle",
            "medusa": "medusa", "hydra": "medusa", "mtp": "mtp", "deepseek_mtp": "mtp",
            "pld": "ngram", "ngram": "ngram", "lookahead": "ngram", "prompt-lookup": "ngram",
            "sps": "draft-model", "draft_model": "draft-model", "draft-model": "draft-model"}


@dataclass(frozen=True)
class Drafter:
    """A drafter: its kind, the head or model it names (None: the target's default), the
    token count of its verify tree (None: a chain of k + 1), and where it was taken from."""

    kind: str
    name: str | None = None
    tree_tokens: int | None = None
    origin: str = "--drafter"      # "trace" | "--drafter" | "assumed"

    @property
    def label(self) -> str:
        return self.kind + (f":{self.name}" if self.name else "")

    @property
    def replay(self) -> str:
        """How the trace's acceptance is replayed at another k."""
        if self.kind == "sparse-self":
            return "token replay"
        if self.tree_tokens is not None:
            return "recorded tree only"
        return "per-depth survival"


def parse_drafter(text: str, origin: str = "--drafter", tree_tokens: int | None = None
                  ) -> Drafter:
    """``KIND[:NAME]`` (``eagle``, ``eagle:qwen3-8b-eagle3``, ``draft-model:qwen3-4b``)."""
    kind, _, name = str(text).strip().partition(":")
    kind = kind.lower()
    if kind not in KINDS:
        raise SpecsimError(f"drafter '{text}': kind must be one of {', '.join(KINDS)}")
    if kind == "draft-model" and not name:
        raise SpecsimError("drafter 'draft-model' needs a model: draft-model:NAME (a catalogue "
                           "name or a config.json)")
    if kind in ("ngram", "sparse-self") and name:
        raise SpecsimError(f"drafter '{kind}' takes no name, got '{text}'")
    if tree_tokens is not None and (tree_tokens < 2 or kind in ("sparse-self", "ngram")):
        raise SpecsimError(f"a verify tree needs ≥ 2 tokens and a head or draft-model drafter, "
                           f"got {tree_tokens} for {kind}")
    return Drafter(kind, name or None, tree_tokens, origin)


def recorded_drafter(policy: str, header: dict | None = None) -> Drafter | None:
    """The drafter a trace records for a group of ``policy``: a sparse policy is
    ``sparse-self``; a method name (``eagle``, ``medusa``, ``pld``…) in the policy string or,
    for an opaque policy, in the header's ``drafter`` (Spec-Bench file names) is its kind; None
    where the trace does not say."""
    if policy in POLICIES:
        return Drafter("sparse-self", origin="trace")
    for said in (policy, (header or {}).get("drafter")):
        kind = RECORDED.get(str(said or "").lower())
        if kind == "draft-model":
            continue            # the trace never says which draft model: --drafter names it
        if kind:
            return Drafter(kind, origin="trace")
    return None


# --------------------------------------------------------------------------------------------
# heads
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Head:
    """A draft head's shape: the one decoder layer (as a 1-layer :class:`ModelSpec`), the
    width of its fc input (in units of hidden), whether its q|k|v reads 2·hidden (EAGLE-3),
    and where its config came from."""

    spec: ModelSpec
    fc_inputs: int
    wide_qkv: bool
    source: str


def _shipped_head(name: str) -> tuple[dict, str]:
    from specsim.shipped import shipped_file

    path = shipped_file(f"models/drafters/{name}.json")
    if path is None:
        raise SpecsimError(f"draft head '{name}': not shipped (models/drafters/ holds "
                           f"{', '.join(sorted(SHIPPED_HEADS.values()))}) and no such file")
    with open(path) as fh:
        return json.load(fh), f"models/drafters/{name}.json"


def head_config(name: str) -> tuple[dict, str]:
    """A head's config.json: a shipped name or a path."""
    if name.endswith(".json"):
        try:
            with open(name) as fh:
                return json.load(fh), name
        except (OSError, ValueError) as exc:
            raise SpecsimError(f"draft head {name}: {exc}") from None
    return _shipped_head(name)


def head_of(drafter: Drafter, target: ModelSpec) -> Head:
    """The head ``drafter`` runs for ``target``: its named config, else the one shipped for
    the target (EAGLE), else one layer of the target's own shape with its full vocabulary."""
    cfg, source = None, f"one layer of {target.name}'s shape (no head config)"
    name = drafter.name or (SHIPPED_HEADS.get(target.name) if drafter.kind == "eagle" else None)
    if name:
        cfg, source = head_config(name)
    if drafter.kind == "mtp" or cfg is None:
        base = target if drafter.kind == "mtp" else dataclasses.replace(
            target, num_experts=0, experts_per_token=0, moe_intermediate_size=0)
        spec = dataclasses.replace(base, name=f"{target.name} {drafter.kind} head",
                                   num_layers=1, layer_types=(FULL_ATTENTION,),
                                   sliding_window=None)
        return Head(spec, 2, False, source)
    arch = " ".join(cfg.get("architectures") or [])
    eagle3 = "Eagle3" in arch or "draft_vocab_size" in cfg
    hidden = int(cfg.get("hidden_size", target.hidden_size))
    heads = int(cfg.get("num_attention_heads", target.num_heads))
    spec = ModelSpec(
        name=name, architecture=arch or "draft head", num_layers=1, hidden_size=hidden,
        num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg.get("intermediate_size", target.intermediate_size)),
        vocab_size=int(cfg.get("draft_vocab_size") or cfg.get("vocab_size")
                       or target.vocab_size),
        layer_types=(FULL_ATTENTION,), dtype_bytes=target.dtype_bytes, source=source)
    return Head(spec, 3 if eagle3 else 2, eagle3, source)


# --------------------------------------------------------------------------------------------
# pricing through the target's cost source
# --------------------------------------------------------------------------------------------


def source_kind(costs) -> str:
    """``operators`` where the cost model composes operators, else ``roofline``."""
    from specsim.costs.operators import OperatorCostModel
    return "operators" if isinstance(costs, OperatorCostModel) else "roofline"


def _roofline_of(costs):
    from specsim.costs.roofline import RooflineCostModel
    if isinstance(costs, RooflineCostModel):
        return costs
    return costs.roofline


def same_source(costs, spec: ModelSpec):
    """A cost model for ``spec`` of the kind that prices ``costs``: the same operator table
    (no fitted residuals: they were fitted for other models' whole steps), else the roofline
    on the same hardware, tensor parallelism and overheads."""
    from specsim.costs.operators import OperatorCostModel
    from specsim.costs.roofline import RooflineCostModel

    def build():
        if isinstance(costs, OperatorCostModel):
            return OperatorCostModel(costs.table, spec, costs.hardware)
        roof = _roofline_of(costs)
        return RooflineCostModel(spec, roof.hardware, roof.tp, roof.overheads, c2q=roof.c2q)
    return memoized(costs, ("same source", spec), build)


def _extra_gemms(head: Head, kind: str) -> list[tuple[int, int]]:
    """(n, k) of the weight GEMMs a head runs per token beside its decoder layer."""
    m = head.spec
    out = [(m.hidden_size, head.fc_inputs * m.hidden_size)]          # fc / eh_proj
    if head.wide_qkv:      # EAGLE-3: q|k|v read [embedding; hidden], the second half here
        out.append(((m.num_heads + 2 * m.num_kv_heads) * m.head_dim, m.hidden_size))
    return out


def _roofline_gemms(roof, base: Cost, gemms: list[tuple[int, int]], tokens: int,
                    notes: tuple[str, ...]) -> Cost:
    """``base`` with weight GEMMs of ``tokens`` rows added, as the roofline counts them."""
    d = roof.model.dtype_bytes
    weight = base.weight_bytes + sum(n * k for n, k in gemms) * d / roof.tp
    flops = base.flops + sum(2.0 * tokens * n * k for n, k in gemms) / roof.tp
    memory_s = (weight + base.kv_bytes + base.other_bytes) / roof.hardware.bandwidth
    compute_s = flops / roof.hardware.flops
    return Cost(max(memory_s, compute_s) + base.overhead_s + base.comm_s, weight, base.kv_bytes,
                base.other_bytes, flops, base.overhead_s, base.comm_s,
                "memory" if memory_s >= compute_s else "compute", (*base.notes, *notes))


def _medusa_step(costs, head: Head, ctx: np.ndarray, said: str) -> Cost:
    """One Medusa head on the batch: a residual block (hidden × hidden) and its LM head, on
    the verify's last hidden state (no KV, no forward of its own)."""
    m, batch = head.spec, ctx.size
    gemms = [(m.hidden_size, m.hidden_size), (m.vocab_size, m.hidden_size)]
    if source_kind(costs) == "operators":
        op = same_source(costs, m)
        seconds, notes = 0.0, []
        for n, k in gemms:
            t, more = op.gemm(batch, n, k)
            seconds += t
            notes += more
        return Cost(seconds, bound="memory", notes=(said, *dict.fromkeys(notes)))
    roof = same_source(costs, m)
    return _roofline_gemms(roof, Cost(0.0), gemms, batch, (said,))


def draft_cost(drafter: Drafter, costs, contexts: Sequence[int]) -> Cost:
    """``C_d``: one draft step of ``drafter`` on the batch ``contexts``, priced through the
    source that prices ``costs`` (the target's cost model); notes say which."""
    ctx = as_contexts(contexts)
    if drafter.kind == "ngram":
        return Cost(0.0, bound="overhead", notes=("ngram: prompt lookup, no draft forward",))
    if drafter.kind == "sparse-self":
        raise ValueError("sparse self-speculation is priced by the cost model's draft step")
    target = costs.model
    kind = source_kind(costs)
    via = "operators" if kind == "operators" else (
        "roofline" if costs.name == "roofline" else
        f"roofline ({costs.name} source holds no draft step of this drafter)")
    if drafter.kind == "draft-model":
        from specsim.specs import load_model
        spec = load_model(drafter.name)
        cost = same_source(costs, spec).plain_step(ctx)
        return dataclasses.replace(cost, notes=(*cost.notes,
                                                f"draft model {spec.name}: its plain step, "
                                                f"priced by {via}"))
    head = head_of(drafter, target)
    said = f"{drafter.kind} head ({head.source}), priced by {via}"
    if drafter.kind == "medusa":
        return _medusa_step(costs, head, ctx, said)
    gemms = _extra_gemms(head, drafter.kind)
    model = same_source(costs, head.spec)
    if kind == "operators":
        parts, notes = model.forward_parts(ctx, 1)
        for n, k in gemms:
            t, more = model.gemm(ctx.size, n, k)
            parts["gemm fc"] = parts.get("gemm fc", 0.0) + t
            notes = notes + more
        cost = model._cost(model.roofline.plain_step(ctx), parts, notes)
        return dataclasses.replace(cost, notes=(*cost.notes, said))
    return _roofline_gemms(model, model.plain_step(ctx), gemms, ctx.size, (said,))


def drafter_memory_bytes(drafter: Drafter, target: ModelSpec, contexts: Sequence[int],
                         tp: int = 1) -> tuple[float, str]:
    """Per-GPU memory ``drafter`` adds beside the target for a batch at ``contexts``: a draft
    model's weights and KV cache (at ``tp``: vLLM's draft_tensor_parallel_size as emitted),
    a head's weights and its one layer's KV; nothing for n-gram lookup and sparse
    self-speculation (its index lists are the simulator's concern). Returns (bytes, what)."""
    if drafter.kind in ("ngram", "sparse-self"):
        return 0.0, ""
    if drafter.kind == "draft-model":
        from specsim.specs import load_model
        spec = load_model(drafter.name)
        return spec.memory_bytes(contexts, tp), f"draft model {spec.name}: weights and KV"
    head = head_of(drafter, target)
    return head.spec.memory_bytes(contexts, tp), f"{drafter.kind} head: weights and its KV"


# --------------------------------------------------------------------------------------------
# the iteration
# --------------------------------------------------------------------------------------------


class DrafterCosts:
    """The target's cost model with ``drafter``'s draft step: ``T(k) = k·C_d + C_v(q) +
    overhead``, q = k + 1 for a chain or the tree's token count, no KV selection. Plain steps,
    verify passes (collecting nothing) and the loop overhead are the target's."""

    def __init__(self, target, drafter: Drafter):
        if drafter.kind == "sparse-self":
            raise ValueError("sparse self-speculation is priced by the target's cost model")
        self.target, self.drafter = target, drafter
        self.name = target.name
        self.model = target.model
        self.overheads = target.overheads

    def plain_step(self, contexts: Sequence[int]) -> Cost:
        return self.target.plain_step(contexts)

    def prefill(self, prompt_lengths: Sequence[int], past: Sequence[int] | None = None
                ) -> Cost:
        return self.target.prefill(prompt_lengths, past)

    def draft_step(self, contexts: Sequence[int], s=None, policy=None) -> Cost:
        ctx = as_contexts(contexts)
        return memoized(self, ("draft", ctx.tobytes()),
                        lambda: draft_cost(self.drafter, self.target, ctx))

    def verify(self, contexts: Sequence[int], q: int) -> Cost:
        tree = self.drafter.tree_tokens
        q = tree if tree is not None else q
        cost = (self.target.policy_verify(contexts, q, "full")
                if hasattr(self.target, "policy_verify") else self.target.verify(contexts, q))
        if tree is not None:
            cost = dataclasses.replace(cost, notes=(
                *cost.notes, f"tree verify: a verify of q = {tree} tree tokens, the tree mask "
                             f"priced as the causal verify kernel over q"))
        if self.drafter.kind == "ngram":
            cost = dataclasses.replace(cost, notes=(
                *cost.notes, "ngram: the trace does not record which iterations found a "
                             "match, so every iteration is charged a verify"))
        return cost

    def selection(self, contexts: Sequence[int], s=None, policy=None, k: int = 1) -> Cost:
        return Cost(0.0, bound="overhead", notes=(f"{self.drafter.kind}: no KV selection",))

    def iteration(self, contexts: Sequence[int], k: int, s=None, policy=None
                  ) -> IterationCost:
        if k < 1:
            raise ValueError("draft length k must be ≥ 1")
        ctx = as_contexts(contexts)
        return IterationCost(k=k, draft_step=self.draft_step(ctx), verify=self.verify(ctx, k + 1),
                             selection=self.selection(ctx), overhead_s=self.overheads.iteration)


# --------------------------------------------------------------------------------------------
# replay at another k
# --------------------------------------------------------------------------------------------


def survival_tokens(survival: np.ndarray, k: int) -> float:
    """``E[m+1](k) = 1 + Σ_{i≤k} P_i``: the tokens an iteration emits at draft length k from
    the per-depth survivals P_i recorded at k_rec ≥ k (the i-th draft of a chain drafter does
    not depend on k, so a run at k accepts min(m, k) of what the run at k_rec accepted)."""
    survival = np.asarray(survival, dtype=float)
    if not 1 <= k <= survival.size:
        raise ValueError(f"k must lie in 1..{survival.size}")
    return 1.0 + float(survival[:k].sum())


def survival_from_counts(m: Sequence[int], k_recorded: int) -> np.ndarray:
    """``P_i = P(m ≥ i)`` for i = 1..k_recorded from the accepted counts of iterations that
    drafted k_recorded tokens."""
    m = np.asarray(m, dtype=np.int64)
    if m.size == 0:
        raise ValueError("no iterations")
    return np.array([float(np.mean(m >= i)) for i in range(1, k_recorded + 1)])


def survival_by_k(survival: np.ndarray) -> np.ndarray:
    """``[..., k − 1, i − 1]`` = P_i for i ≤ k, else 0: the per-k survivals the per-depth
    counterfactual gives (the same P_i at every k)."""
    survival = np.asarray(survival, dtype=float)
    k = survival.shape[-1]
    keep = np.tril(np.ones((k, k)))
    return survival[..., None, :] * keep


__all__ = ["Drafter", "DrafterCosts", "KINDS", "draft_cost", "head_of", "parse_drafter",
           "recorded_drafter", "same_source", "survival_by_k", "survival_from_counts",
           "survival_tokens"]
