"""Draft KV selection in the engine: per-layer index lists, refreshed after every verify.

``DraftSelection`` is planned once per (policy, s, batch, max_len, k_max): buffers for the
index lists ``indices [layers, batch, (kv_heads,) capacity + k_max + 1]`` and ``counts``, and
for the logits the verify pass collects. Each iteration then

1. ``collect_rows(q)``: which verify rows' pre-softmax logits the verify pass writes —
   Vegas: Collect-2-Query's (first draft, last token); vegas-all: every row (the reference
   Collect-2-Query approximates); last-token: every row (the last *accepted* row is picked
   afterwards); SparseSpec-L: the last W = 16 rows (+ their lse); StreamingLLM, Quest, full:
   none;
2. ``refresh(lengths, last_accepted_row)`` after rollback: the policy's lists from those logits
   (one per layer and sequence, or per layer and KV head), with every layer folded into the
   batch so each policy is one call;
3. ``append(positions)`` at every draft step: the drafted token's own position joins every
   layer's list (draft tokens attend to themselves and to earlier drafts).

Only full-attention layers draft from lists: a model with sliding-window layers (gpt-oss)
gives their indices as ``layers``, and every buffer has one slot per listed layer
(``slot(layer)``); a window layer drafts over its own window (``specsim.engine.steps``) and
collects nothing. Quest has no lists here: it re-scores pages from the draft query inside each layer
(``quest_lists``). After prefill the same ``refresh`` runs on the last R prompt rows
(vegas-all: the last min(k_max + 1, 16)). Budgets are ``specsim.policies``' rule only (through
``selected_counts``/``Policy.selected``).

**Proxy check** (``ProxyCheck``, vegas and vegas-all only, off unless asked for): is
Collect-2-Query a good proxy for ranking by every verify row? The verify pass then writes all
q = k + 1 rows; after each verify, per layer and sequence, ``proxy_overlap`` compares the
top-K positions by the two collected rows with the top-K by all q rows — K the policy's ranked
budget (``selected − recent``), the recent window left out of the comparison — and splits the
chosen positions by their distance from the newest position (``DISTANCE_BANDS``). Vegas keeps
drafting from its own two rows (copied out of the all-rows buffer), so the run is the same as
without the check.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from specsim.engine import attention
from specsim.errors import SpecsimError
from specsim.kernels.verify_attention import summed_logits
from specsim.policies import SPARSESPEC_WINDOW, Policy, get_policy

#: Policies whose lists are refreshed from collected verify logits.
COLLECTING = ("vegas", "vegas-all", "last-token", "sparsespec")

#: Key distance bands of the proxy check: distance d = L − n of key position n from the next
#: token's position L (the cache length), split at these edges: (recent, 128], (128, 512],
#: (512, 2048], (2048, ∞). Keys with d ≤ recent are in every selection and left out.
DISTANCE_BANDS = (128, 512, 2048)


def policy_collect_rows(kind: str, q_len: int) -> tuple[int, ...]:
    """The verify rows whose logits policy ``kind`` collects (module docstring, item 1)."""
    if kind in ("vegas-all", "last-token"):
        return tuple(range(q_len))
    if kind == "vegas":
        return attention.default_collect_rows(q_len)
    if kind == "sparsespec":
        return tuple(range(max(0, q_len - SPARSESPEC_WINDOW), q_len))
    return ()


class DraftSelection:
    def __init__(self, policy: str | Policy, s: float, *, num_layers: int, batch: int,
                 num_heads: int, num_kv_heads: int, max_len: int, k_max: int,
                 backend: attention.AttentionBackend, logits_dtype: torch.dtype,
                 device: torch.device, proxy_check: bool = False, c2q: str = "sum",
                 ranking: str = "best", layers: tuple[int, ...] | None = None):
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        self.s, self.backend = s, backend
        #: the model layers that draft from lists (default: all ``num_layers``), slot by slot
        self.layers = tuple(range(num_layers)) if layers is None else tuple(layers)
        self._slots = {layer: i for i, layer in enumerate(self.layers)}
        num_layers = len(self.layers)
        self.num_layers, self.batch, self.max_len = num_layers, batch, max_len
        self.num_kv_heads, self.k_max = num_kv_heads, k_max
        self.kind = self.policy.name
        self.indices = self.counts = self.logits = self.lse = None
        self.proxy: ProxyCheck | None = None
        if c2q not in ("rows", "sum"):
            raise SpecsimError(f"c2q must be rows or sum, got {c2q!r}")
        #: how the lists are ranked (``EngineSettings.ranking``)
        self.ranking = ranking
        #: Vegas' verify writes the summed row per sequence (``EngineSettings.c2q`` "sum": one
        #: fp32 row, the collected rows' logits summed over every query head; "rows": the two
        #: rows per query head, which the refresh sums; the same ranking up to rounding)
        self.summed = self.kind == "vegas" and c2q == "sum" and not proxy_check
        #: last-token's verify writes each collected row summed over the query heads (fp32
        #: [B, 1, rows, n]), the refresh picking the last accepted token's row
        self.head_summed = self.kind == "last-token"
        if proxy_check and self.kind not in ("vegas", "vegas-all"):
            raise SpecsimError(f"the proxy check compares Vegas' two collected rows with all "
                               f"verify rows; it runs with vegas or vegas-all, not "
                               f"'{self.kind}'")
        if self.kind in ("full", "quest") or not num_layers:
            return
        self.capacity = self.policy.selected(max_len, s)
        lists = (num_layers, batch) + ((num_kv_heads,) if self.policy.per_kv_head else ())
        self.indices = torch.zeros(*lists, self.capacity + k_max + 1, dtype=torch.int32,
                                   device=device)
        self.counts = torch.zeros(lists, dtype=torch.int32, device=device)
        if self.kind in COLLECTING:
            rows = {"vegas": 2, "vegas-all": k_max + 1, "last-token": k_max + 1,
                    "sparsespec": SPARSESPEC_WINDOW}[self.kind]
            if self.summed or self.head_summed:
                self.logits = torch.zeros(num_layers, batch, 1, rows if self.head_summed else 1,
                                          max_len, dtype=torch.float32, device=device)
            else:
                self.logits = torch.zeros(num_layers, batch, num_heads, rows, max_len,
                                          dtype=logits_dtype, device=device)
            if self.kind == "sparsespec":
                self.lse = torch.zeros(num_layers, batch, num_heads, max(k_max + 1, rows),
                                       dtype=torch.float32, device=device)
        if proxy_check:  # vegas-all's own buffer already holds every row
            buffer = self.logits if self.kind == "vegas-all" else torch.zeros(
                num_layers, batch, num_heads, k_max + 1, max_len, dtype=logits_dtype,
                device=device)
            self.proxy = ProxyCheck(self.policy, s, buffer)

    def slot(self, layer: int) -> int | None:
        """Where model layer ``layer``'s lists and collected rows sit (None: a layer that does
        not draft from lists)."""
        return self._slots.get(layer)

    # ---- what the verify pass collects ------------------------------------------------------
    def collect_rows(self, q_len: int) -> tuple[int, ...]:
        if self.proxy is not None:
            return tuple(range(q_len))
        return policy_collect_rows(self.kind, q_len)

    def ranked_rows(self, q_len: int) -> int:
        """How many collected rows of the selection buffer ``refresh`` ranks by after a
        verify of ``q_len`` rows (Vegas: its two, also under the proxy check)."""
        if self.kind == "vegas":
            return len(attention.default_collect_rows(q_len))
        return len(self.collect_rows(q_len))

    def prefill_rows(self, prompt_len: int) -> int:
        """How many of the last prompt rows the prefill collects (0: none)."""
        if self.logits is None:
            return 0
        return min(prompt_len, {"vegas": 2, "last-token": 1, "sparsespec": SPARSESPEC_WINDOW,
                                "vegas-all": min(self.k_max + 1, SPARSESPEC_WINDOW)}[self.kind])

    def layer_logits(self, layer: int, rows: int) -> torch.Tensor:
        """Where verify writes its collected rows for ``layer`` (a listed one): [B, H, rows,
        max_len] (summed: [B, 1, 1, max_len]; summed over the heads: [B, 1, rows, max_len])."""
        layer = self._slots[layer]
        if self.proxy is not None:
            return self.proxy.logits[layer, :, :, :rows]
        if self.summed:
            return self.logits[layer]
        return self.logits[layer, :, :, :rows]

    def store_prefill_rows(self, layer: int, b: int, logits: torch.Tensor,
                           lse: torch.Tensor, rows: int) -> None:
        """The last ``rows`` of a prompt's row logits [H, R, T] and lse [H, R] into slot ``b``
        (summed over heads and rows when ``summed``); nothing for a layer without lists."""
        layer = self.slot(layer)
        if layer is None or self.logits is None:
            return
        length = logits.shape[-1]
        if self.summed or self.head_summed:
            width = rows if self.head_summed else 1
            self.logits[layer, b, :, :width, :length] = summed_logits(
                logits[None, :, -rows:], rows=self.summed)[0]
            return
        self.logits[layer, b, :, :rows, :length] = logits[:, -rows:].to(self.logits.dtype)
        if self.lse is not None:
            self.lse[layer, b, :, :rows] = lse[:, -rows:]

    def check_proxy(self, lengths: torch.Tensor, q_len: int) -> dict[str, torch.Tensor]:
        """After a verify of ``q_len`` rows and its rollback: the proxy check's overlap
        statistics per layer and sequence (``proxy_overlap``), and, for Vegas, its two
        collected rows moved to where ``refresh`` reads them."""
        pair = attention.default_collect_rows(q_len)
        if self.kind == "vegas":
            self.logits[:, :, :, :len(pair)] = self.proxy.logits[:, :, :, list(pair)]
        return self.proxy.measure(lengths, q_len, pair)

    def layer_lse(self, layer: int, q_len: int) -> torch.Tensor | None:
        return None if self.lse is None else self.lse[self._slots[layer], :, :, :q_len]

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
        elif self.kind in ("vegas", "vegas-all", "last-token"):
            logits = self.logits if self.summed else self.logits[:, :, :, :rows]
            logits = logits.flatten(0, 1)                  # [L·B, H, rows, n] (a view)
            if self.kind == "last-token":
                # each sequence's row of its last accepted token (summed over the heads by
                # the verify kernel): fp32 [L·B, 1, 1, n], ranked as it is
                logits = self.backend.picked_row_sum(logits, last_row.repeat(layers),
                                                     folded_lengths, n)
            chosen, counts = attention.vegas_select(
                logits, folded_lengths, self.s, max_context=n, policy=self.policy,
                ranking=self.ranking)
        elif self.kind == "sparsespec":
            logits = self.logits[:, :, :, :rows].reshape(layers * batch, -1, rows, n)
            lse = self.lse[:, :, :, lse_rows].reshape(layers * batch, -1, rows)
            chosen, counts = self.backend.sparsespec_select(logits, lse, folded_lengths, self.s,
                                                            self.num_kv_heads, self.policy,
                                                            self.ranking)
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
        slot = self._slots[layer]
        return self.indices[slot], self.counts[slot]

    def quest_lists(self, q: torch.Tensor, cache: attention.KVCache, layer: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Quest: pages scored by this layer's draft query q [B, H, D], per KV head."""
        page_min, page_max = cache.pages(layer)
        return attention.quest_select(q, page_min, page_max, cache.lengths, self.s,
                                      max_context=self.max_len, policy=self.policy,
                                      ranking=self.ranking)


# --------------------------------------------------------------------------------------------
# The proxy check: Collect-2-Query's ranking against the ranking by every verify row
# --------------------------------------------------------------------------------------------


def proxy_overlap(logits: torch.Tensor, lengths: torch.Tensor, pair: tuple[int, ...],
                  q_len: int, budget: torch.Tensor, recent: int,
                  bands: tuple[int, ...] = DISTANCE_BANDS) -> dict[str, torch.Tensor]:
    """Top-K agreement of two rankings of the same keys, for N lists at once.

    ``logits`` [N, H, ≥ q_len, n]: pre-softmax logits of the q verify rows over key positions
    n; ``lengths`` [N]: cache length L; ``budget`` [N]: K. Positions ``n < L − recent`` are
    ranked (the recent window is in both selections and left out). With
    ``A`` = top-K by Σ_h Σ_{r ∈ pair} logits (Collect-2-Query) and ``B`` = top-K by
    Σ_h Σ_{r < q} logits (all rows) — sums rank as the head averages do —
    ``overlap = |A ∩ B| / K``. K is clipped to the ranked positions; where K equals them both
    sets are everything (``trivial``). Per distance band of d = L − n (``bands`` edges, d ≤
    edge, last band open): ``shared`` = |A ∩ B ∩ band|, ``pair_picks`` = |A ∩ band|,
    ``all_picks`` = |B ∩ band|. Reads K's maximum on the host (not graph-capturable).
    """
    count, _, _, n = logits.shape
    position = torch.arange(n, device=logits.device)
    length = lengths.long()[:, None]
    ranked = position < length - recent                                         # [N, n]
    eligible = ranked.sum(-1)
    k = torch.minimum(budget.long().clamp(min=0), eligible)
    width = min(n, max(1, int(k.max())))

    def top(rows) -> torch.Tensor:
        score = logits[:, :, rows].sum(dim=(1, 2), dtype=torch.float32)
        score = torch.where(ranked, score, float("-inf"))
        index = torch.topk(score, width, dim=-1).indices
        chosen = torch.zeros(count, n, dtype=torch.bool, device=logits.device)
        return chosen.scatter_(1, index, torch.arange(width, device=logits.device) < k[:, None])

    in_pair, in_all = top(list(pair)), top(list(range(q_len)))
    shared = in_pair & in_all
    edges = torch.tensor(bands, device=logits.device)
    band = torch.bucketize(length - position, edges).expand(count, n)           # [N, n]

    def per_band(chosen):
        out = torch.zeros(count, len(bands) + 1, dtype=torch.long, device=logits.device)
        return out.scatter_add_(1, band, chosen.long())

    return {"overlap": shared.sum(-1) / k.clamp(min=1), "budget": k, "eligible": eligible,
            "trivial": k >= eligible, "shared": per_band(shared),
            "pair_picks": per_band(in_pair), "all_picks": per_band(in_all)}


class ProxyCheck:
    """The all-rows logits buffer [layers, batch, heads, k_max + 1, max_len] and the
    measurement after each verify (one ``proxy_overlap`` call over every layer)."""

    def __init__(self, policy: Policy, s: float, logits: torch.Tensor):
        self.policy, self.s, self.logits = policy, s, logits

    def measure(self, lengths: torch.Tensor, q_len: int, pair: tuple[int, ...]
                ) -> dict[str, torch.Tensor]:
        """Statistics [batch, layers, ...] at the current (rolled-back) ``lengths``; K is the
        policy's ranked budget ``selected(L, s) − recent``."""
        layers, batch = self.logits.shape[:2]
        folded = lengths.repeat(layers)
        budget = attention.selected_counts(self.policy, folded, self.s) - self.policy.recent
        stats = proxy_overlap(self.logits.flatten(0, 1), folded, pair, q_len, budget,
                              self.policy.recent)
        return {name: v.view(layers, batch, *v.shape[1:]).transpose(0, 1)
                for name, v in stats.items()}


@dataclass
class ProxyRecords:
    """What the proxy check measured in one ``generate``: one entry per (sequence, verify).

    ``context`` is the cache length the selection was made at (= the sequence's context at
    the start of its next iteration); ``k`` the drafts verified (q = k + 1 rows); ``budget``
    K and ``eligible`` (positions outside the recent window) per layer (equal across layers);
    ``overlap`` [layers]; ``shared`` / ``pair_picks`` / ``all_picks`` [layers, bands] counts
    per distance band (``DISTANCE_BANDS``; see ``proxy_overlap``).
    """

    recent: int
    bands: tuple[int, ...] = DISTANCE_BANDS
    sequence: list[int] = field(default_factory=list)
    iteration: list[int] = field(default_factory=list)
    context: list[int] = field(default_factory=list)
    k: list[int] = field(default_factory=list)
    budget: list[int] = field(default_factory=list)
    eligible: list[int] = field(default_factory=list)
    overlap: list[np.ndarray] = field(default_factory=list)
    shared: list[np.ndarray] = field(default_factory=list)
    pair_picks: list[np.ndarray] = field(default_factory=list)
    all_picks: list[np.ndarray] = field(default_factory=list)

    def add(self, stats: dict[str, torch.Tensor], sequences: list[int], iterations: list[int],
            contexts: list[int], k: list[int]) -> None:
        """One verify's statistics (``ProxyCheck.measure``) for the listed sequences."""
        host = {name: v.cpu().numpy() for name, v in stats.items()}
        for b in sequences:
            self.sequence.append(b)
            self.iteration.append(iterations[b])
            self.context.append(contexts[b])
            self.k.append(k[b])
            self.budget.append(int(host["budget"][b, 0]))
            self.eligible.append(int(host["eligible"][b, 0]))
            self.overlap.append(host["overlap"][b].astype(float))
            for name in ("shared", "pair_picks", "all_picks"):
                getattr(self, name).append(host[name][b].astype(np.int64))

    def __len__(self) -> int:
        return len(self.sequence)

    @property
    def trivial(self) -> np.ndarray:
        """Entries where K covers every ranked position (both rules choose everything)."""
        return np.asarray(self.budget) >= np.asarray(self.eligible)


__all__ = ["COLLECTING", "DISTANCE_BANDS", "DraftSelection", "ProxyCheck", "ProxyRecords",
           "proxy_overlap"]
