"""The decoding loops of one generate call: plain steps, and self-speculative iterations
composed of their phases, with continuous batching's refills between iterations.

A speculative iteration, for every sequence of the batch at once:

- ``draft``: k steps from the last emitted token (one chained launch under greedy decoding
  without the adaptive controller; else step by step, sampling and asking the controller);
- ``verify``: one full-attention pass over the last token and the drafts;
- ``accept`` (timed as ``other``): greedy match or speculative sampling (forced traces replay
  their m instead), then the rejected rows rolled back; then one device-to-host copy of the
  iteration's tokens, entropies and acceptance is started;
- ``selection``: the draft lists refreshed from what the verify pass collected (queued behind
  that copy, so the GPU refreshes while the host keeps the record; after the proxy check reads
  the rows when there is one);
- ``record`` (``other``): the wait for the copy, the adaptive controller's centres, the trace
  rows and the bytes moved.

Every phase runs on the engine's static buffers (``steps.Steps``); the only host reads are
the record phase's one read and, with the adaptive controller, one per draft step.
"""
from __future__ import annotations

import numpy as np
import torch

from specsim.engine.run import Run
from specsim.engine.sampling import (SamplingParams, accept_greedy, accept_speculative,
                                     choose, entropy, next_token, probabilities)
from specsim.engine.timing import PhaseTimer
from specsim.traces.format import RequestTrace


class Transfers:
    """Per-slot host values onto the device without stalling the host."""

    def __init__(self, batch: int, device: torch.device):
        self.batch, self.device = batch, device
        self._k_tensors: dict[int, torch.Tensor] = {}   # uniform k per iteration, on the device
        self._staging: dict[str, tuple[np.ndarray, torch.Tensor, torch.Tensor]] = {}
        self._host: torch.Tensor | None = None   # pinned, for ``to_host``

    def k_tensor(self, k_seq: list[int], k_iter: int) -> torch.Tensor:
        """``k_seq`` clamped to ``k_iter`` on the device; the common case (every sequence at
        one k) from a cache instead of a host-to-device copy per iteration."""
        first = k_seq[0]
        if all(k == first for k in k_seq):
            key = min(first, k_iter)
            if key not in self._k_tensors:
                self._k_tensors[key] = torch.full((self.batch,), key, dtype=torch.long,
                                                  device=self.device)
            return self._k_tensors[key]
        return self.to_device("k", k_seq).clamp(max=k_iter)

    def to_device(self, name: str, values: list[int]) -> torch.Tensor:
        """``values`` (one int per slot) as a device tensor, without stalling the host: written
        into a pinned host buffer and copied asynchronously. A plain ``torch.tensor(values,
        device="cuda")`` copies from pageable memory, which waits for the stream to drain: for
        the forced m that is the verify pass, so the host could not queue the rest of the
        iteration while it ran (a stall a free-running loop does not have, which the
        forced-acceptance loop overheads of a calibration would carry). Reusing the buffer is
        safe: every iteration ends in a synchronising device-to-host read, so the previous copy
        out of it has completed. The returned tensor is overwritten by the next call."""
        if name not in self._staging:
            cuda = torch.device(self.device).type == "cuda"
            host = torch.zeros(self.batch, dtype=torch.long, pin_memory=cuda)
            self._staging[name] = (host.numpy(), host,
                                   torch.zeros(self.batch, dtype=torch.long, device=self.device))
        view, host, device = self._staging[name]
        view[:] = values
        return device.copy_(host, non_blocking=True)

    def to_host(self, values: torch.Tensor) -> "Pending":
        """Start copying ``values`` (float64 [B, n]) to the host and return at once: the copy
        lands in a pinned buffer behind the work queued so far, and ``Pending.wait`` blocks
        only until then, not until work queued later (the next refresh) has run. One buffer
        serves every call, so a caller waits for one copy before starting the next."""
        n = values.numel()
        if values.device.type != "cuda":
            return Pending(values.numpy(), None)
        if self._host is None or self._host.numel() < n:
            self._host = torch.empty(n, dtype=torch.float64, pin_memory=True)
        host = self._host[:n].view(values.shape)
        host.copy_(values, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(values.device))
        return Pending(host.numpy(), done)


class Pending:
    """A device-to-host copy in flight (``Transfers.to_host``)."""

    def __init__(self, values: np.ndarray, done):
        self.values, self.done = values, done

    def wait(self) -> np.ndarray:
        """The values, once copied (a copy of their own: the buffer is reused)."""
        if self.done is None:
            return self.values
        self.done.synchronize()
        return self.values.copy()


class Decoding:
    """What both loops share: the engine's parts, the call's bookkeeping (``run``), sampling
    and phase timer, and the refill of finished slots from the queue."""

    def __init__(self, engine, run: Run, sampling: SamplingParams, generator: torch.Generator,
                 timer: PhaseTimer):
        self.engine, self.run, self.sampling = engine, run, sampling
        self.generator, self.timer = generator, timer
        self.steps, self.cache, self.selection = engine.steps, engine.cache, engine.selection
        self.batch = engine.batch

    def refill(self, x0: torch.Tensor) -> list[int]:
        """Continuous batching: queued prompts into the slots whose sequence finished (their
        first token into ``x0``), timed as prefill; the iteration clock restarts after it."""
        run, prefill = self.run, self.engine.prefiller
        refilled: list[int] = []
        if not run.free_slots():      # nothing queued or nothing finished: no timed phase
            return refilled
        run.drain()                   # the last refresh, into the iteration that queued it
        with self.timer.phase("prefill"):
            while slots := run.free_slots():
                for b in slots:
                    r = run.next_request()
                    logits = prefill.fill_slot(b, r, run.prompts[r], run.source, run.keep)
                    token = next_token(logits[None], self.sampling, self.generator)
                    x0[b] = token[0]
                    run.start(b, r, int(token[0]))
                    refilled.append(b)
            if refilled:
                prefill.select_slots(sorted(set(refilled)))
        if refilled:
            run.sync_active()
            run.mark()
        return refilled


class PlainLoop(Decoding):
    """Plain decoding: one q = 1 pass per step, collecting nothing."""

    def decode(self) -> None:
        run, timer, engine = self.run, self.timer, self.engine
        x0 = run.x0
        self.refill(x0)
        run.mark()
        while run.any_active():
            with timer.phase("verify"):
                self.steps.verify_input(1)[:, 0] = x0
                logits = self.steps.verify(1, collect=False)[:, 0]
            with timer.phase("other"):
                token = next_token(logits, self.sampling, self.generator)
                self.cache.rollback((~run.active_t).int())
                x0 = torch.where(run.active_t, token, x0)
                run.count_plain(engine.weight_bytes, engine.kv_bytes_per_token)
                with run.waiting():
                    tokens = token.tolist()
                run.step_plain(tokens)
            self.refill(x0)


class SpeculativeLoop(Decoding):
    """Self-speculative decoding at ``k`` drafts per iteration (the maximum with ``adaptive``;
    per sequence and iteration as ``forced`` traces say)."""

    def __init__(self, engine, run: Run, sampling: SamplingParams, generator: torch.Generator,
                 timer: PhaseTimer, k: int, adaptive, forced: list[RequestTrace] | None):
        super().__init__(engine, run, sampling, generator, timer)
        self.k, self.adaptive, self.forced = k, adaptive, forced
        # greedy drafting without the adaptive controller needs no host read between draft
        # steps: one launch drafts all k (a CUDA graph per k on the GPU)
        self.chained = sampling.greedy and adaptive is None

    def decode(self) -> None:
        run, batch, device = self.run, self.batch, self.engine.device
        with self.timer.phase("prefill"):  # the first lists, from the prompts: part of it
            self.engine.prefiller.select()
        self.drafts = torch.zeros(batch, self.k, dtype=torch.long, device=device)
        self.entropies = torch.zeros(batch, self.k, dtype=torch.float32, device=device)
        self.draft_probs = None if self.sampling.greedy else torch.zeros(
            batch, self.k, self.engine.args.vocab_size, device=device)
        adaptive = self.adaptive
        self.centres = [adaptive.start if adaptive else None] * batch
        x0 = run.x0
        self.refill(x0)
        run.mark()
        while run.any_active():
            k_seq, k_iter = self.draft_lengths()
            k_iter = self.draft_phase(x0, k_seq, k_iter)
            q_len = k_iter + 1
            logits = self.verify_phase(x0, k_iter)
            m, token, accept, x0 = self.accept_phase(logits, x0, k_seq, k_iter)
            sent = self.send_record(m, token, accept, k_iter)
            if run.proxy is None:   # the refresh runs while the host keeps the record
                self.refresh_phase(m, q_len)
            checked = self.record_phase(sent, k_seq, k_iter)
            if run.proxy is not None:   # the check reads the rows before the refresh
                with self.timer.phase("proxy"):
                    run.proxy.add(self.selection.check_proxy(self.cache.lengths, q_len),
                                  *checked, run.lengths, k_seq)
                self.refresh_phase(m, q_len)
            for b in self.refill(x0):
                self.centres[b] = adaptive.start if adaptive else None
        run.drain()

    def draft_lengths(self) -> tuple[list[int], int]:
        """Each sequence's k this iteration, and the most of the active ones."""
        run, forced = self.run, self.forced
        k_seq = [self.k] * self.batch
        if forced is not None:
            k_seq = [int(run.forced_of(b).k[min(run.iteration_of[b],
                                                 run.forced_of(b).iterations - 1)])
                     for b in range(self.batch)]
        return k_seq, max(k_seq[b] for b in range(self.batch) if run.active[b])

    def draft_phase(self, x0: torch.Tensor, k_seq: list[int], k_iter: int) -> int:
        """Up to ``k_iter`` drafts into ``drafts`` (their entropies, and under sampling the
        distributions they were drawn from); the drafts' KV rows rolled back. The adaptive
        controller may stop the batch early (→ the drafts made) and sets each sequence's
        k in ``k_seq``."""
        run, steps, adaptive = self.run, self.steps, self.adaptive
        drafts, entropies, draft_probs = self.drafts, self.entropies, self.draft_probs
        with self.timer.phase("draft"):
            token, stopped = x0, [not a for a in run.active]
            if self.chained:
                steps.chain_x0.copy_(x0)
                steps.draft_chain(k_iter)
                drafts[:, :k_iter] = steps.drafts[:, :k_iter]
                entropies[:, :k_iter] = steps.entropies[:, :k_iter]
            for j in range(0 if self.chained else k_iter):
                steps.draft_input[:, 0] = token
                token, probs = choose(steps.draft(), self.sampling, self.generator)
                drafts[:, j] = token
                entropies[:, j] = entropy(probs)
                if draft_probs is not None:
                    draft_probs[:, j] = probs
                if adaptive is not None:  # host read per step: SparseSpec-L's controller
                    h = entropies[:, :j + 1].tolist()
                    for b in range(self.batch):
                        if not stopped[b] and adaptive.stop(h[b], self.centres[b], self.k):
                            stopped[b], k_seq[b] = True, j + 1
                    if all(stopped):
                        k_iter = j + 1
                        break
            if not self.chained:
                self.cache.rollback(k_iter)
        return k_iter

    def verify_phase(self, x0: torch.Tensor, k_iter: int) -> torch.Tensor:
        """The full-attention pass over the last token and the drafts: logits [B, q, V]."""
        with self.timer.phase("verify"):
            inputs = self.steps.verify_input(k_iter + 1)
            inputs[:, 0] = x0
            inputs[:, 1:] = self.drafts[:, :k_iter]
            return self.steps.verify(k_iter + 1)

    def accept_phase(self, logits: torch.Tensor, x0: torch.Tensor, k_seq: list[int],
                     k_iter: int):
        """Accepted drafts m [B], the next token, each draft's acceptance probability, and the
        next iteration's x0 (finished sequences keep theirs); the rejected rows rolled back."""
        run, transfers = self.run, self.engine.transfers
        drafts, q_len = self.drafts, k_iter + 1
        with self.timer.phase("other"):
            k_t = transfers.k_tensor(k_seq, k_iter)
            # an idle slot keeps its trace's last k and m, which may exceed this k_iter
            forced_m = None if self.forced is None else transfers.to_device("forced_m", [
                min(int(run.forced_of(b).m[min(run.iteration_of[b],
                                               run.forced_of(b).iterations - 1)]), k_seq[b],
                    k_iter)
                for b in range(self.batch)])
            if self.sampling.greedy:
                m, token, accept = accept_greedy(drafts[:, :k_iter], logits, k_t,
                                                 forced_m=forced_m)
            else:
                m, token, accept = accept_speculative(
                    drafts[:, :k_iter], self.draft_probs[:, :k_iter],
                    probabilities(logits, self.sampling), self.generator, k_t)
                if forced_m is not None:
                    m = forced_m
                    token = logits.argmax(-1).gather(1, m[:, None]).squeeze(1)
            kept = torch.where(run.active_t, m + 1, 0)
            self.cache.rollback((q_len - kept).int())
            x0 = torch.where(run.active_t, token, x0)
        return m, token, accept, x0

    def refresh_phase(self, m: torch.Tensor, q_len: int) -> None:
        """The draft lists rebuilt from the rows the verify pass collected."""
        with self.timer.phase("selection"):
            rows = self.selection.ranked_rows(q_len)
            self.steps.refresh(rows, m, slice(q_len - rows, q_len))

    def send_record(self, m, token, accept, k_iter: int):
        """Start the iteration's one device-to-host copy of everything the host keeps (token
        ids are exact in float64; each separate read would be a synchronising copy), queued
        before the refresh so that the host's wait ends when the acceptance does."""
        with self.timer.phase("other"):
            packed = torch.cat([m[:, None].double(), token[:, None].double(),
                                self.drafts[:, :k_iter].double(),
                                self.entropies[:, :k_iter].double(),
                                accept.double()], 1)
            return self.engine.transfers.to_host(packed)

    def record_phase(self, sent, k_seq: list[int], k_iter: int):
        """The iteration's bytes moved, the wait for ``send_record``'s copy, the adaptive
        controller's centres and the trace rows → under the proxy check, who was checked and
        at which of their iterations (before this one updates them)."""
        run, adaptive, engine = self.run, self.adaptive, self.engine
        checked = None
        with self.timer.phase("other"):
            run.count_speculative(engine.policy, engine.s, k_iter, engine.weight_bytes,
                                  engine.kv_bytes_per_token)
            with run.waiting():
                packed = sent.wait()
            ids = packed[:, :2 + k_iter].astype(np.int64)
            m_h, token_h, drafts_h = ids[:, 0].tolist(), ids[:, 1].tolist(), ids[:, 2:]
            entropy_h = packed[:, 2 + k_iter:2 + 2 * k_iter]
            accept_h = np.clip(packed[:, 2 + 2 * k_iter:], 0.0, 1.0)
            for b in range(self.batch):
                if run.active[b] and adaptive is not None:
                    self.centres[b] = adaptive.update(self.centres[b], entropy_h[b], m_h[b],
                                                      k_seq[b])
            if run.proxy is not None:   # who is checked, before the step updates them
                checked = ([b for b in range(self.batch) if run.active[b]],
                           list(run.iteration_of))
            run.step_speculative(k_seq, m_h, drafts_h, token_h, entropy_h, accept_h,
                                 self.forced)
        return checked


__all__ = ["Decoding", "Pending", "PlainLoop", "SpeculativeLoop", "Transfers"]
