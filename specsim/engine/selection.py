"""Draft KV selection in the engine: per-layer index lists, refreshed after every verify.

``DraftSelection`` is planned once per (policy, s, batch, max_len, k_max): buffers for the
index lists ``indices [layers, batch, (kv_heads,) capacity + k_max + 1]`` and ``counts``, and
for the logits the verify pass collects. Each iteration then

1. ``collect_rows(q)``: which verify rows' pre-softmax logits the verify pass writes —
   Vegas: Collect-2-Query's (first draft, last token); last-token: every row (the last
   *accepted* row is picked afterwards); SparseSpec-L: the last W = 16 rows (+ their lse);
   StreamingLLM, Quest, full: none;
2. ``refresh(lengths, last_accepted_row)`` after rollback: the policy's lists from those logits
   (one per layer and sequence, or per layer and KV head), with every layer folded into the
   batch so each policy is one call;
3. ``append(positions)`` at every draft step: the drafted token's own position joins every
   layer's list (draft tokens attend to themselves and to earlier drafts).

Quest has no lists here: it re-scores pages from the draft query inside each layer
(``quest_lists``). After prefill the same ``refresh`` runs on the last R prompt rows.
Budgets are ``specsim.policies``' rule only (through ``selected_counts``/``Policy.selected``).
"""
from __future__ import annotations

import torch

from specsim.engine import attention
from specsim.policies import SPARSESPEC_WINDOW, Policy, get_policy

#: Policies whose lists are refreshed from collected verify logits.
COLLECTING = ("vegas", "last-token", "sparsespec")


class DraftSelection:
    def __init__(self, policy: str | Policy, s: float, *, num_layers: int, batch: int,
                 num_heads: int, num_kv_heads: int, max_len: int, k_max: int,
                 backend: attention.AttentionBackend, logits_dtype: torch.dtype,
                 device: torch.device):
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        self.s, self.backend = s, backend
        self.num_layers, self.batch, self.max_len = num_layers, batch, max_len
        self.num_kv_heads = num_kv_heads
        self.kind = self.policy.name
        self.indices = self.counts = self.logits = self.lse = None
        if self.kind in ("full", "quest"):
            return
        self.capacity = self.policy.selected(max_len, s)
        lists = (num_layers, batch) + ((num_kv_heads,) if self.policy.per_kv_head else ())
        self.indices = torch.zeros(*lists, self.capacity + k_max + 1, dtype=torch.int32,
                                   device=device)
        self.counts = torch.zeros(lists, dtype=torch.int32, device=device)
        if self.kind in COLLECTING:
            rows = {"vegas": 2, "last-token": k_max + 1, "sparsespec": SPARSESPEC_WINDOW}[self.kind]
            self.logits = torch.zeros(num_layers, batch, num_heads, rows, max_len,
                                      dtype=logits_dtype, device=device)
            if self.kind == "sparsespec":
                self.lse = torch.zeros(num_layers, batch, num_heads, max(k_max + 1, rows),
                                       dtype=torch.float32, device=device)

    # ---- what the verify pass collects ------------------------------------------------------
    def collect_rows(self, q_len: int) -> tuple[int, ...]:
        if self.kind == "vegas":
            return attention.default_collect_rows(q_len)
        if self.kind == "last-token":
            return tuple(range(q_len))
        if self.kind == "sparsespec":
            return tuple(range(max(0, q_len - SPARSESPEC_WINDOW), q_len))
        return ()

    def prefill_rows(self, prompt_len: int) -> int:
        """How many of the last prompt rows the prefill collects (0: none)."""
        if self.logits is None:
            return 0
        return min(prompt_len, {"vegas": 2, "last-token": 1,
                                "sparsespec": SPARSESPEC_WINDOW}[self.kind])

    def layer_logits(self, layer: int, rows: int) -> torch.Tensor:
        """Where verify writes its collected rows for ``layer``: [B, H, rows, max_len]."""
        return self.logits[layer, :, :, :rows]

    def layer_lse(self, layer: int, q_len: int) -> torch.Tensor | None:
        return None if self.lse is None else self.lse[layer, :, :, :q_len]

    # ---- refresh after verify (or prefill) --------------------------------------------------
    def refresh(self, lengths: torch.Tensor, rows: int, last_row: torch.Tensor | None = None,
                lse_rows: slice | None = None) -> None:
        """Rebuild every layer's lists for the current ``lengths`` (after rollback).

        ``rows``: collected rows present in the logits buffer; ``last_row`` [B] (last-token):
        which of them is the last accepted token; ``lse_rows`` (SparseSpec-L): where the
        collected rows' lse sit in the lse buffer.
        """
        if self.indices is None:
            return
        layers, batch, n = self.num_layers, self.batch, self.max_len
        folded_lengths = lengths.repeat(layers)
        if self.kind == "streamingllm":
            chosen, counts = attention.streamingllm_select(lengths, self.s, max_context=n,
                                                           policy=self.policy)
            chosen, counts = chosen.expand(layers, -1, -1), counts.expand(layers, -1)
        elif self.kind in ("vegas", "last-token"):
            logits = self.logits[:, :, :, :rows]
            if self.kind == "last-token":
                pick = last_row.long().clamp(0, rows - 1)
                picked = logits.permute(1, 3, 0, 2, 4)[torch.arange(batch, device=pick.device),
                                                       pick]                    # [B, L, H, n]
                logits = picked.transpose(0, 1)[:, :, :, None]               # [L, B, H, 1, n]
            chosen, counts = attention.vegas_select(
                logits.reshape(layers * batch, *logits.shape[2:]), folded_lengths, self.s,
                max_context=n, policy=self.policy)
        elif self.kind == "sparsespec":
            logits = self.logits[:, :, :, :rows].reshape(layers * batch, -1, rows, n)
            lse = self.lse[:, :, :, lse_rows].reshape(layers * batch, -1, rows)
            chosen, counts = self.backend.sparsespec_select(logits, lse, folded_lengths, self.s,
                                                            self.num_kv_heads, self.policy)
        else:
            raise AssertionError(self.kind)
        width = chosen.shape[-1]
        self.indices[..., :width] = chosen.reshape(*self.indices.shape[:-1], width)
        self.counts.copy_(counts.reshape(self.counts.shape))

    def append(self, positions: torch.Tensor) -> None:
        """Add each sequence's position [B] to the lists of every layer."""
        if self.indices is None:
            return
        lists = self.indices.view(self.num_layers * self.batch, *self.indices.shape[2:])
        attention.append_positions(lists, self.counts.view(lists.shape[:-1]),
                                   positions.repeat(self.num_layers))

    def layer_lists(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.indices[layer], self.counts[layer]

    def quest_lists(self, q: torch.Tensor, cache: attention.KVCache, layer: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Quest: pages scored by this layer's draft query q [B, H, D], per KV head."""
        page_min, page_max = cache.pages(layer)
        return attention.quest_select(q, page_min, page_max, cache.lengths, self.s,
                                      max_context=self.max_len, policy=self.policy)


__all__ = ["COLLECTING", "DraftSelection"]
