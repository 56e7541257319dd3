"""Prompts into the engine's cache slots: computed one prompt at a time (its last rows' logits
collected for the first selection), loaded from a kept ``PrefillState`` (the same prompts in
another engine: another policy, k or s), or filled with random numbers (timing with random
weights); and the first selection of the slots a prompt has just filled.
"""
from __future__ import annotations

import torch

from specsim.engine import attention
from specsim.engine.model import Transformer
from specsim.engine.selection import DraftSelection
from specsim.engine.steps import Steps
from specsim.errors import SpecsimError
from specsim.policies import SPARSESPEC_WINDOW


class PrefillState:
    """The prefill of a generate call's prompts (all of them, queued ones included), kept to
    be loaded into other engines (same prompts; another policy, k or s): per prompt and layer
    the prompt's K/V [T, G, D], the pre-softmax logits [H, R, T] and lse [H, R] of its last
    R ≤ 16 rows (None for a sliding-window layer), and the last logits [N, V]."""

    def __init__(self, lengths: list[int]):
        self.lengths = list(lengths)
        batch = len(lengths)
        self.k: list[list] = [[] for _ in range(batch)]
        self.v: list[list] = [[] for _ in range(batch)]
        self.row_logits: list[list] = [[] for _ in range(batch)]
        self.row_lse: list[list] = [[] for _ in range(batch)]
        self.logits: torch.Tensor | None = None
        self._last: dict[int, torch.Tensor] = {}

    def set_logits(self, r: int, logits: torch.Tensor) -> None:
        self._last[r] = logits.clone()
        if len(self._last) == len(self.lengths):
            self.logits = torch.stack([self._last[i] for i in range(len(self.lengths))])

    @staticmethod
    def rows(length: int) -> int:
        return min(length, SPARSESPEC_WINDOW)

    def add(self, b, layer, k, v, row_logits, row_lse) -> None:
        assert len(self.k[b]) == layer
        self.k[b].append(k.clone())
        self.v[b].append(v.clone())
        self.row_logits[b].append(row_logits)
        self.row_lse[b].append(row_lse)

    def subset(self, sequences: list[int]) -> "PrefillState":
        out = PrefillState([self.lengths[b] for b in sequences])
        for name in ("k", "v", "row_logits", "row_lse"):
            setattr(out, name, [getattr(self, name)[b] for b in sequences])
        out.logits = self.logits[sequences]
        return out


class Prefill:
    """Fills one engine's slots (``cache``) and the selection's collected prompt rows."""

    def __init__(self, model: Transformer, cache: attention.KVCache, selection: DraftSelection,
                 steps: Steps, batch: int):
        self.model, self.cache, self.selection, self.steps = model, cache, selection, steps
        self.batch, self.args = batch, model.args
        self.device = model.lm_head.weight.device
        #: how many of the last prompt rows the selection collects (set by :meth:`fill`)
        self.rows = 0
        self._random_generator: torch.Generator | None = None

    def fill(self, prompts, source, keep_state: PrefillState | None, min_prompt: int
             ) -> torch.Tensor:
        """The first ``batch`` prompts into their slots → their last-position logits [B, V];
        the selection collects the last ``prefill_rows(min_prompt)`` prompt rows (the shortest
        prompt of the call, queued ones included, so that a refilled slot has as many)."""
        self.cache.lengths.zero_()
        self.rows = self.selection.prefill_rows(min_prompt)
        if isinstance(source, str):
            if source != "random":
                raise SpecsimError(f"prefill: a PrefillState or 'random', not {source!r}")
            return self._random_fill(prompts)
        return torch.stack([self.fill_slot(b, b, prompt, source, keep_state)
                            for b, prompt in enumerate(prompts)])

    def fill_slot(self, b: int, r: int, prompt: list[int], source, keep_state
                  ) -> torch.Tensor:
        """Prompt ``r`` into slot ``b`` (computed, loaded from the ``PrefillState`` ``source``,
        or random numbers) → its last-position logits [V]."""
        n = len(prompt)
        self.cache.lengths[b] = n
        if isinstance(source, str):
            return self._random_slot(b, n)
        if source is not None:
            if source.lengths[r] != n:
                raise SpecsimError("prefill state of other prompts")
            for layer in range(self.args.num_layers):
                attention.write_prefill(self.cache, layer, b, source.k[r][layer],
                                        source.v[r][layer])
                if self.rows and source.row_logits[r][layer] is not None:
                    self._store_rows(layer, b, source.row_logits[r][layer],
                                     source.row_lse[r][layer])
            return source.logits[r].to(self.device)
        tokens = torch.tensor(prompt, dtype=torch.long, device=self.device)[None]
        positions = torch.arange(n, device=self.device)[None]
        attend = self._attend(b, n, self.rows, keep_state, r)
        logits = self.model(tokens, positions, attend, last_only=True)[0, -1]
        if keep_state is not None:
            keep_state.set_logits(r, logits)
        return logits

    def _attend(self, b: int, length: int, rows: int, keep: PrefillState | None, r: int):
        """Prefill of one prompt into slot ``b`` (recorded as prompt ``r`` of ``keep``); the
        last rows' logits of the layers that draft from lists (a window layer's are not
        collected)."""
        cache, windows, sinks = self.cache, self.steps.windows, self.steps.sinks

        def attend(layer, q, k, v):
            attention.write_prefill(cache, layer, b, k[0], v[0])
            wanted = keep.rows(length) if keep is not None else rows
            logits = lse = None
            if wanted and windows[layer] is None:
                logits, lse = attention.prefill_logits(q[0, -wanted:], k[0], length - wanted,
                                                       sinks[layer])
                if rows:
                    self._store_rows(layer, b, logits, lse)
            if keep is not None:
                keep.add(r, layer, k[0], v[0], logits, lse)
            return attention.prefill_attention(q, k, v, window=windows[layer],
                                               sinks=sinks[layer])
        return attend

    def _store_rows(self, layer: int, b: int, logits: torch.Tensor, lse: torch.Tensor) -> None:
        """The last prompt rows' logits [H, R, T] and lse [H, R] → the selection buffers
        (the policy's last ``rows`` of them)."""
        self.selection.store_prefill_rows(layer, b, logits, lse, self.rows)

    def _random_fill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Timing only: fill the cache (and the collected rows) with random numbers instead of
        running the prompts — at real scale a prefill of random weights costs minutes and its
        KV values do not change a decode step's cost."""
        self._random_generator = torch.Generator(device=self.device).manual_seed(0)
        for b, prompt in enumerate(prompts):
            self.cache.lengths[b] = len(prompt)
        return torch.stack([self._random_slot(b, len(p)) for b, p in enumerate(prompts)])

    def _random_slot(self, b: int, n: int) -> torch.Tensor:
        """Random K/V for the first ``n`` positions of slot ``b`` (and its Quest page bounds
        and collected rows) → random last-position logits [V]."""
        generator = self._random_generator
        if generator is None:
            generator = self._random_generator = torch.Generator(
                device=self.device).manual_seed(0)
        for layer in range(self.args.num_layers):
            self.cache.k(layer)[b, :, :n].normal_(generator=generator)
            self.cache.v(layer)[b, :, :n].normal_(generator=generator)
            if self.cache.page_size:
                attention.write_prefill(self.cache, layer, b,
                                        self.cache.k(layer)[b, :, :n].transpose(0, 1),
                                        self.cache.v(layer)[b, :, :n].transpose(0, 1))
            slot = self.selection.slot(layer)
            if self.selection.logits is not None and slot is not None:
                logits = self.selection.logits[slot, b].normal_(generator=generator)
                if self.selection.lse is not None:
                    self.selection.lse[slot, b] = torch.logsumexp(logits.float(), -1)[..., :1]
        return torch.randn(self.args.vocab_size, generator=generator, device=self.device)

    def select(self) -> None:
        """The first selection of every slot, from its prompt rows."""
        rows = self.rows
        self.steps.refresh(rows, torch.zeros(self.batch, dtype=torch.long, device=self.device),
                           slice(0, rows))

    def select_slots(self, slots: list[int]) -> None:
        """First selection of refilled ``slots`` from their prompt rows; the other slots keep
        the lists their last verify gave them (the refresh runs batched, then they are put
        back)."""
        selection = self.selection
        if selection.indices is None:
            return
        saved = selection.indices.clone(), selection.counts.clone()
        self.select()
        others = torch.ones(self.batch, dtype=torch.bool)
        others[slots] = False
        others = others.to(self.device)
        selection.indices[:, others] = saved[0][:, others]
        selection.counts[:, others] = saved[1][:, others]


__all__ = ["Prefill", "PrefillState"]
