"""Host-side bookkeeping of one generate call: which prompt each slot holds and the queue of
the others (continuous batching), outputs and trace rows per prompt, lengths and activity per
slot, forward passes and bytes moved, and the loop's per-iteration clock.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import torch

from specsim.engine.prefill import PrefillState
from specsim.engine.selection import ProxyRecords
from specsim.policies import Policy
from specsim.traces.format import RequestTrace


class Run:
    """Host-side bookkeeping of one generate call: which prompt each slot holds, the queue,
    outputs and trace rows per prompt, lengths and activity per slot."""

    def __init__(self, batch: int, prompts, max_new: int, x0: torch.Tensor, eos: set[int],
                 request_ids, source=None, keep: PrefillState | None = None,
                 forced: list[RequestTrace] | None = None):
        self.batch, self.max_new, self.eos, self.x0 = batch, max_new, eos, x0
        self.prompts, self.source, self.keep, self.forced = prompts, source, keep, forced
        self.ids = request_ids or [str(r) for r in range(len(prompts))]
        self.slot_request = list(range(batch))   # the prompt each slot holds
        self._queue_head = batch                 # the next prompt to take a freed slot
        self.lengths = [len(p) for p in prompts[:batch]]
        first = x0.tolist()
        self.tokens: list[list[int]] = [[t] for t in first] + [[] for _ in prompts[batch:]]
        self.active = [self._live(t) for t in first]
        self.active_t = torch.tensor(self.active, device=x0.device)
        self._active_sent = list(self.active)    # what active_t holds
        self.iterations = 0
        self.iteration_of = [0] * batch
        self.rows: list[dict[str, list]] = [{"context": [], "k": [], "m": [], "entropy": [],
                                             "accept_prob": []} for _ in prompts]
        self.forwards: dict[str, int] = {"draft": 0, "verify": 0}
        self.bytes: dict[str, float] = {"draft": 0.0, "verify": 0.0}
        self.proxy: ProxyRecords | None = None
        self.steps: list[tuple[float, int, int]] = []
        self._mark = time.perf_counter()   # the decode loop's start (mark() resets it)
        #: seconds the loop spent blocked in its device-to-host reads (waiting for the GPU)
        self.host_wait = 0.0

    def _live(self, first_token: int) -> bool:
        return self.max_new > 1 and first_token not in self.eos

    # ---- the queue (continuous batching) ------------------------------------------------------
    def free_slots(self) -> list[int]:
        """Slots whose sequence is done, as many as there are prompts still queued."""
        free = [b for b, a in enumerate(self.active) if not a]
        return free[:len(self.prompts) - self._queue_head]

    def next_request(self) -> int:
        r = self._queue_head
        self._queue_head += 1
        return r

    def start(self, b: int, r: int, first_token: int) -> None:
        """Prompt ``r`` now holds slot ``b`` (prefilled; ``first_token`` from its logits)."""
        self.slot_request[b] = r
        self.lengths[b] = len(self.prompts[r])
        self.tokens[r] = [first_token]
        self.iteration_of[b] = 0
        self.active[b] = self._live(first_token)

    def forced_of(self, b: int) -> RequestTrace:
        return self.forced[self.slot_request[b]]

    # ---- per iteration ------------------------------------------------------------------------
    def mark(self) -> None:
        """The loop starts (or resumes after a refill) now: the next iteration's clock."""
        if self.x0.is_cuda:
            torch.cuda.synchronize(self.x0.device)
        self._mark = time.perf_counter()

    @contextmanager
    def waiting(self):
        """Around the iteration's one device-to-host read: the time the host spends there
        waiting for the GPU, which the loop's wall time less it (``host_seconds``) leaves out."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.host_wait += time.perf_counter() - t0

    @property
    def host_seconds(self) -> float:
        """The decode loop's own CPU time: its iterations' wall time less the reads' waits."""
        return max(sum(sec for sec, _, _ in self.steps) - self.host_wait, 0.0)

    def _log_step(self, active_before: int, emitted: int) -> None:
        # each step's host read waits for the iteration's GPU work (the refresh queued behind
        # it excepted, which runs during the next iteration's clock): end − previous end is the
        # iteration's wall time
        now = time.perf_counter()
        self.steps.append((now - self._mark, active_before, emitted))
        self._mark = now

    def drain(self) -> None:
        """The loop is done or pauses for a refill: wait for the GPU work queued after its
        last read (the last refresh) and count it in the last iteration's wall time, so that
        the iterations' clock covers every phase the engine's timer does."""
        if not (self.x0.is_cuda and self.steps):
            return
        t0 = time.perf_counter()
        torch.cuda.synchronize(self.x0.device)
        now = time.perf_counter()
        seconds, active, emitted = self.steps[-1]
        self.steps[-1] = (seconds + now - self._mark, active, emitted)
        self.host_wait += now - t0
        self._mark = now

    def any_active(self) -> bool:
        return any(self.active)

    def _emit(self, b: int, new: list[int]) -> None:
        for i, t in enumerate(new):
            if t in self.eos:
                new = new[:i + 1]
                self.active[b] = False
                break
        out = self.tokens[self.slot_request[b]]
        out.extend(new[:self.max_new - len(out)])
        if len(out) >= self.max_new:
            self.active[b] = False

    def step_plain(self, tokens: list[int]) -> None:
        self.iterations += 1
        before, emitted = sum(self.active), self.new_tokens()
        for b, t in enumerate(tokens):
            if self.active[b]:
                self.lengths[b] += 1
                self._emit(b, [t])
        self.sync_active()
        self._log_step(before, self.new_tokens() - emitted)

    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    def step_speculative(self, k_seq, m, drafts, token, entropies, accept, forced) -> None:
        self.iterations += 1
        before, emitted = sum(self.active), self.new_tokens()
        for b in range(len(m)):
            if not self.active[b]:
                continue
            k_b, m_b, rows = k_seq[b], m[b], self.rows[self.slot_request[b]]
            rows["context"].append(self.lengths[b])
            rows["k"].append(k_b)
            rows["m"].append(m_b)
            rows["entropy"].append(entropies[b][:k_b])
            rows["accept_prob"].append(accept[b][:k_b])
            self.lengths[b] += m_b + 1
            self.iteration_of[b] += 1
            self._emit(b, drafts[b][:m_b].tolist() + [token[b]])
            if forced is not None and self.iteration_of[b] >= self.forced_of(b).iterations:
                self.active[b] = False
        self.sync_active()
        self._log_step(before, self.new_tokens() - emitted)

    def sync_active(self) -> None:
        """The device copy of which slots are active, copied only when it changed."""
        if self.active != self._active_sent:
            self.active_t.copy_(torch.tensor(self.active))
            self._active_sent = list(self.active)

    # ---- forward passes and bytes moved ------------------------------------------------------
    def count_plain(self, weight_bytes: float, kv_bytes_per_token: float) -> None:
        """One plain step (before its tokens are recorded): the weights once, and each
        sequence's KV rows and its new one."""
        self.bytes["verify"] += weight_bytes + kv_bytes_per_token * sum(
            n + 1 for n in self.lengths)
        self.forwards["verify"] += 1

    def count_speculative(self, policy: Policy, s: float, k_iter: int, weight_bytes: float,
                          kv_bytes_per_token: float) -> None:
        """One speculative iteration of ``k_iter`` drafts: weights once per forward; KV rows
        each pass attends to (drafts: the policy's selection + the drafts so far; verify: the
        whole context + q)."""
        self.forwards["draft"] += k_iter
        self.forwards["verify"] += 1
        lengths = np.asarray(self.lengths, dtype=np.int64)
        steps = k_iter * (k_iter + 1) // 2                      # Σ_j (j + 1) appended drafts
        draft = k_iter * float(policy.selected_array(lengths, s).sum()) + steps * lengths.size
        verify = float((lengths + k_iter + 1).sum())
        self.bytes["draft"] += k_iter * weight_bytes + draft * kv_bytes_per_token
        self.bytes["verify"] += weight_bytes + verify * kv_bytes_per_token

    def traces(self, policy: str, s: float) -> list[RequestTrace]:
        out = []
        for r, rows in enumerate(self.rows):
            if not rows["k"]:
                continue
            out.append(RequestTrace(
                self.ids[r], policy, None if policy == "full" else float(s),
                np.asarray(rows["context"], dtype=np.int64), np.asarray(rows["k"], np.int64),
                np.asarray(rows["m"], np.int64),
                entropy=[np.asarray(e, float) for e in rows["entropy"]],
                accept_prob=[np.asarray(a, float) for a in rows["accept_prob"]]))
        return out


__all__ = ["Run"]
