"""The engine's model passes on static buffers: one draft step, the greedy draft chain, one
verify pass of q tokens, and the selection's refresh, run eagerly or replayed as CUDA graphs.

Every pass reads and writes only buffers made once per engine (input tokens, the KV cache and
its ``lengths``, the draft index lists, the collected logits), so on CUDA each is captured
once per shape (``graphs.CapturedStep``) and replayed with a single launch; the torch path
(the CPU, or shapes the kernels do not take) reads lengths on the host and runs eagerly.
"""
from __future__ import annotations

import torch

from specsim.engine import attention
from specsim.engine.model import Transformer
from specsim.engine.sampling import GREEDY, choose, entropy
from specsim.engine.selection import DraftSelection


class Steps:
    """The passes of one engine over its ``cache``, ``backend`` and ``selection``."""

    def __init__(self, model: Transformer, cache: attention.KVCache,
                 backend: attention.AttentionBackend, selection: DraftSelection, *,
                 batch: int, k_max: int, cuda_graphs: bool):
        self.model, self.cache, self.backend, self.selection = model, cache, backend, selection
        self.batch, self.kind = batch, selection.kind
        self.device = model.lm_head.weight.device
        self.cuda_graphs = cuda_graphs
        self.graphs: dict = {}
        self.draft_input = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        # static buffers of the greedy draft chain and of the selection refresh (graphed)
        self.chain_x0 = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.drafts = torch.zeros(batch, max(k_max, 1), dtype=torch.long, device=self.device)
        self.entropies = torch.zeros(batch, max(k_max, 1), dtype=torch.float32,
                                     device=self.device)
        self.last_row = torch.zeros(batch, dtype=torch.long, device=self.device)
        self._refresh_pool = None
        self._verify_inputs: dict[int, torch.Tensor] = {}
        #: each layer's sliding window (None: full) and fp32 sinks (None: none), read once
        self.windows = [model.args.window(i) for i in range(model.args.num_layers)]
        self.sinks = model.attention_sinks()

    # ---- attention callables for the model ----------------------------------------------------
    def _verify_attend(self, q_len: int, rows: tuple[int, ...]):
        cache, selection, backend = self.cache, self.selection, self.backend
        windows, sinks = self.windows, self.sinks

        def attend(layer, q, k, v):
            cache.write(layer, k.transpose(1, 2), v.transpose(1, 2))
            window = windows[layer]
            if window is not None:          # window layers collect nothing (no lists)
                return backend.verify(q, cache.k(layer), cache.v(layer), cache.lengths,
                                      sinks=sinks[layer], window=window)
            logits = selection.layer_logits(layer, len(rows)) if rows else None
            lse = selection.layer_lse(layer, q_len) if rows else None
            return backend.verify(q, cache.k(layer), cache.v(layer), cache.lengths,
                                  collect_rows=rows, logits=logits, lse=lse,
                                  collect_sum=selection.summed,
                                  collect_head_sum=selection.head_summed, sinks=sinks[layer])
        return attend

    def _draft_attend(self):
        """Draft attention: a policy's lists in full-attention layers; a sliding-window layer
        attends its window (exact: what it attends in verify too) through verify's q = 1."""
        cache, selection, backend, kind = self.cache, self.selection, self.backend, self.kind
        windows, sinks = self.windows, self.sinks

        def attend(layer, q, k, v):
            cache.write(layer, k.transpose(1, 2), v.transpose(1, 2))
            if kind == "full" or windows[layer] is not None:
                return backend.verify(q, cache.k(layer), cache.v(layer), cache.lengths,
                                      sinks=sinks[layer], window=windows[layer])
            if kind == "quest":
                indices, counts = selection.quest_lists(q[:, 0], cache, layer)
            else:
                indices, counts = selection.layer_lists(layer)
            return backend.draft(q[:, 0], cache.k(layer), cache.v(layer), indices,
                                 counts, sinks[layer])[:, None]
        return attend

    # ---- the passes, as functions of the static buffers -------------------------------------
    def _draft_step(self) -> torch.Tensor:
        """One draft token per sequence from ``draft_input``: logits [B, V]."""
        self.cache.extend(1)
        positions = (self.cache.lengths.long() - 1)[:, None]
        self.selection.append(positions[:, 0])
        return self.model(self.draft_input, positions, self._draft_attend())[:, -1]

    def _verify_step(self, q_len: int, collect: bool) -> torch.Tensor:
        """Full-attention pass over ``verify_input(q_len)``: logits [B, q, V]."""
        self.cache.extend(q_len)
        positions = (self.cache.lengths.long()[:, None] - q_len
                     + torch.arange(q_len, device=self.device))
        rows = self.selection.collect_rows(q_len) if collect else ()
        return self.model(self.verify_input(q_len), positions, self._verify_attend(q_len, rows))

    def _draft_chain_step(self, k_iter: int) -> torch.Tensor:
        """Greedy drafting of ``k_iter`` tokens from ``chain_x0`` with no host read between
        steps: each step's argmax feeds the next; tokens land in ``drafts[:, :k_iter]``, their
        entropies in ``entropies``; the cache is rolled back to where it started."""
        token = self.chain_x0
        for j in range(k_iter):
            self.draft_input[:, 0] = token
            token, probs = choose(self._draft_step(), GREEDY)
            self.drafts[:, j] = token
            self.entropies[:, j] = entropy(probs)
        self.cache.rollback(k_iter)
        return self.drafts

    def _refresh_step(self, rows: int, lse_rows: slice) -> torch.Tensor:
        self.selection.refresh(self.cache.lengths, rows, self.last_row, lse_rows)
        return self.last_row

    def verify_input(self, q_len: int) -> torch.Tensor:
        """The static input tokens [B, q_len] of a verify pass of ``q_len`` rows."""
        if q_len not in self._verify_inputs:
            self._verify_inputs[q_len] = torch.zeros(self.batch, q_len, dtype=torch.long,
                                                      device=self.device)
        return self._verify_inputs[q_len]

    # ---- eager or graphed -------------------------------------------------------------------
    def _snapshot(self):
        saved = [t.clone() for t in (self.cache.lengths, self.selection.counts) if t is not None]

        def restore():
            for t, s in zip((x for x in (self.cache.lengths, self.selection.counts)
                             if x is not None), saved):
                t.copy_(s)
        return restore

    def _run(self, key, step, capturable: bool, pool=None):
        """Run ``step`` eagerly, or as a CUDA graph (its own memory pool unless ``pool``)
        captured on first use."""
        if not (self.cuda_graphs and capturable):
            return step()
        if key not in self.graphs:
            from specsim.engine.graphs import CapturedStep
            self.graphs[key] = CapturedStep(step, self._snapshot, pool=pool)
        return self.graphs[key]()

    def draft_chain(self, k_iter: int) -> torch.Tensor:
        """``k_iter`` greedy draft steps from ``chain_x0`` as one launch (one CUDA graph per
        k): drafts [B, ≥ k_iter] (and ``entropies``), the cache length unchanged."""
        capturable = self.backend.capturable(1 if self.kind == "full" else None)
        return self._run(("chain", k_iter), lambda: self._draft_chain_step(k_iter), capturable)

    def refresh(self, rows: int, last_row: torch.Tensor | None = None,
                lse_rows: slice | None = None) -> None:
        """The selection's refresh (``DraftSelection.refresh``) at the current lengths, as one
        CUDA graph per (rows, lse rows); the graphs share one memory pool (their outputs are
        copied into the static index lists, so nothing outlives a replay)."""
        if self.selection.indices is None:
            return
        if last_row is not None:
            self.last_row.copy_(last_row)
        lse_rows = lse_rows or slice(0, rows)
        if self.cuda_graphs and self._refresh_pool is None:
            self._refresh_pool = torch.cuda.graph_pool_handle()
        self._run(("refresh", rows, lse_rows.start, lse_rows.stop),
                  lambda: self._refresh_step(rows, lse_rows), self.backend.capturable(),
                  pool=self._refresh_pool)

    def draft(self) -> torch.Tensor:
        """One draft step (input ``draft_input``): logits [B, V]."""
        capturable = self.backend.capturable(1 if self.kind == "full" else None)
        return self._run("draft", self._draft_step, capturable)

    def verify(self, q_len: int, collect: bool = True) -> torch.Tensor:
        """One verify pass (input ``verify_input(q_len)``): logits [B, q, V]."""
        return self._run(("verify", q_len, collect), lambda: self._verify_step(q_len, collect),
                         self.backend.capturable(q_len))


__all__ = ["Steps"]
