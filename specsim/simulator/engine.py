"""SimPy model of a serving engine doing sparse self-speculative decoding.

One engine process runs iterations over a continuously batched set of sequences:

1. **Admission** (FIFO): a waiting request is admitted while the batch has a free slot and the
   memory budget holds its *whole* KV cache (prompt + output, sliding layers capped at their
   window) plus its draft-selection state; otherwise it waits. Reserving the final size up
   front means no sequence is ever pre-empted and the budget is never exceeded.
2. **Prefill** of the newly admitted prompts: by default one pass, which emits each one's first
   token while decoding pauses; with ``prefill_chunk`` C (chunked prefill, as vLLM's and
   SGLang's schedulers run it) each iteration also prefills up to C prompt tokens of the
   admitted prompts in admission order, priced as a prefill of those chunks after their
   already-prefilled positions and added to the iteration's time (the fused pass of an engine
   that reads the weights once costs up to one weight read less); a prompt's last chunk emits
   its first token, and it decodes from the next iteration.
3. **Iteration**: every running sequence drafts its k tokens (the batch runs ``max k`` draft
   steps), one verify pass checks them, the selection is refreshed. The time is the cost
   model's ``T(k, s)`` for the batch's actual ragged contexts. Each sequence accepts m drafts
   from its acceptance source and emits ``min(m + 1, tokens still owed)``.

k per sequence: ``fixed``; ``adaptive`` (SparseSpec-L, Eqs. 6–8: EMA entropy centres and
:func:`specsim.analytical.adaptive_k` on the recorded draft entropies; the batch drafts
``max k`` steps, shorter drafts idle); or ``oracle``: knowing every sequence's m in advance,
each iteration runs the batch-wide k that maximises emitted tokens per second — an upper bound
no real system reaches. ``plain`` simulates plain decoding (one token per step, ``T_ar``) as
the baseline the speedups are measured against.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from specsim import analytical
from specsim.costs.base import CostModel
from specsim.costs.roofline import draft_state_bytes
from specsim.errors import SpecsimError
from specsim.simulator.arrivals import Arrival
from specsim.simulator.result import SimResult, StepLog
from specsim.specs import ModelSpec

K_POLICIES = ("fixed", "adaptive", "oracle", "plain")


#: the most sequences one simulated batch holds
MAX_BATCH = 65_536


@dataclass
class SimConfig:
    policy: str
    s: float
    k: int = 4                       # fixed k, or the largest k for adaptive / oracle
    k_policy: str = "fixed"
    max_batch: int = 64
    memory_budget: float | None = None   # bytes for KV + draft state (default: GPU − weights)
    seed: int = 0
    entropy_beta: float = 0.9        # SparseSpec-L's EMA smoothing
    record_events: bool = False      # keep per-request spans for a Chrome trace
    #: a static batch (HF ``generate``, specsim's own engine): a batch is admitted only when
    #: the previous one is done, and every iteration computes all its slots — finished
    #: sequences keep theirs (priced at their last context) until the last one finishes
    static_batch: bool = False
    #: slots keep computing after their sequence finishes, until a new request takes the slot
    #: (static shapes / CUDA graphs, as specsim's engine runs a continuous batch); by default a
    #: finished sequence leaves the batch at once (vLLM-style)
    fixed_slots: bool = False
    #: chunked prefill: prompt tokens prefilled per iteration beside the decode (None: each
    #: admitted prompt is prefilled whole before decoding resumes)
    prefill_chunk: int | None = None
    label: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        from specsim.analytical import check_k_max
        check_k_max(self.k, "k")
        if self.k_policy not in K_POLICIES:
            raise SpecsimError(f"unknown k policy '{self.k_policy}'; use one of "
                               f"{', '.join(K_POLICIES)}")
        if not 1 <= self.max_batch <= MAX_BATCH:
            raise SpecsimError(f"max batch must lie in 1..{MAX_BATCH}, got {self.max_batch}")
        if self.prefill_chunk is not None:
            if self.prefill_chunk < 1:
                raise SpecsimError(f"prefill chunk must be ≥ 1 token, got {self.prefill_chunk}")
            if self.static_batch or self.fixed_slots:
                raise SpecsimError("chunked prefill runs a continuous batch: not with a static "
                                   "batch or fixed slots")


def default_memory_budget(model: ModelSpec, memory_bytes: float, tp: int = 1,
                          utilisation: float = 0.9) -> float:
    """What is left for KV and draft state per GPU: ``utilisation`` of the memory less the
    weights' share."""
    return utilisation * memory_bytes - model.param_count() * model.dtype_bytes / tp


class Simulation:
    def __init__(self, arrivals: list[Arrival], costs: CostModel, model: ModelSpec, source,
                 config: SimConfig, memory_bytes: float, tp: int = 1):
        if not arrivals:
            raise SpecsimError("no requests to simulate")
        self.arrivals = sorted(arrivals, key=lambda a: a.time)
        self.costs, self.model, self.source, self.cfg = costs, model, source, config
        self.budget = (config.memory_budget if config.memory_budget is not None
                       else default_memory_budget(model, memory_bytes, tp))
        if self.budget <= 0:
            raise SpecsimError("the weights alone fill the GPU memory: no room for any KV cache")
        if config.k_policy == "adaptive" and not getattr(source, "entropy_available", False):
            raise SpecsimError("adaptive k needs per-draft entropies in the trace (replay source)")
        self.rng = np.random.default_rng(config.seed)

    def need_bytes(self, a: Arrival) -> float:
        final = a.prompt_tokens + a.output_tokens
        return (self.model.kv_bytes_resident(final)
                + draft_state_bytes(self.model, self.cfg.policy, final, self.cfg.s))

    # ------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        import simpy

        cfg, n = self.cfg, len(self.arrivals)
        needs = np.array([self.need_bytes(a) for a in self.arrivals])
        too_big = np.flatnonzero(needs > self.budget)
        if too_big.size:
            a = self.arrivals[int(too_big[0])]
            raise SpecsimError(
                f"request {a.request_id} ({a.prompt_tokens} + {a.output_tokens} tokens) needs "
                f"{needs[too_big[0]] / 1e9:.1f} GB of KV and draft state; the budget is "
                f"{self.budget / 1e9:.1f} GB")
        env = simpy.Environment()
        waiting: deque[int] = deque()
        state = {"wake": env.event()}
        B = cfg.max_batch
        slot_req = np.full(B, -1)
        ctx = np.zeros(B, dtype=np.int64)
        remaining = np.zeros(B, dtype=np.int64)
        recorded = np.zeros(B, dtype=np.int64)
        step = np.zeros(B, dtype=np.int64)
        active = np.zeros(B, dtype=bool)
        member = np.zeros(B, dtype=bool)   # slots in use (static batch: the running batch's)
        # prompt tokens still to prefill (chunked; those prefilled: ctx − pending, ctx holding
        # the prompt's length until its first token)
        pending = np.zeros(B, dtype=np.int64)
        prefill_order: deque[int] = deque()       # slots awaiting prefill, by admission
        req = {name: np.full(n, np.nan) for name in ("admit", "first_token", "finish")}
        iterations = np.zeros(n, dtype=np.int64)
        log = StepLog()
        memory = {"used": 0.0}
        centres = analytical.EntropyCentres(accepted=0.5, rejected=2.0)
        ratio = {"draft": 0.1, "verify": 1.0}
        k_adaptive_max = min(cfg.k, getattr(self.source, "k_recorded", cfg.k))
        k_choices = np.arange(1, k_adaptive_max + 1)
        done = {"n": 0}

        def arrivals_process():
            for i, a in enumerate(self.arrivals):
                if a.time > env.now:
                    yield env.timeout(a.time - env.now)
                waiting.append(i)
                if not state["wake"].triggered:
                    state["wake"].succeed()

        def admit() -> list[int]:
            admitted = []
            if cfg.static_batch:
                if active.any():
                    return admitted
                member[:] = False
            free = np.flatnonzero(~active)
            while waiting and free.size > len(admitted):
                i = waiting[0]
                if memory["used"] + needs[i] > self.budget:
                    break
                waiting.popleft()
                slot = int(free[len(admitted)])
                a = self.arrivals[i]
                memory["used"] += needs[i]
                slot_req[slot] = i
                ctx[slot] = a.prompt_tokens
                remaining[slot] = a.output_tokens
                recorded[slot] = self.source.start(a.request_id, a.prompt_id)
                step[slot] = 0
                active[slot] = True
                member[slot] = True
                req["admit"][i] = env.now
                admitted.append(slot)
            return admitted

        def finish(slots: np.ndarray):
            for slot in slots:
                i = int(slot_req[slot])
                req["finish"][i] = env.now
                memory["used"] -= needs[i]
                active[slot] = False
                slot_req[slot] = -1
                done["n"] += 1

        def plan_chunk() -> tuple[list, list, list]:
            """The slots, new tokens and cached tokens of this iteration's prefill chunks."""
            slots, new, past = [], [], []
            budget = cfg.prefill_chunk
            for slot in prefill_order:
                if budget <= 0:
                    break
                take = int(min(pending[slot], budget))
                slots.append(slot)
                new.append(take)
                past.append(int(ctx[slot] - pending[slot]))
                budget -= take
            return slots, new, past

        def prefill_chunks(chunk, seconds: float, start: float):
            """Log the chunks' pass and advance their prompts; a finished prompt has its
            first token now."""
            slots, new, _ = chunk
            log.prefill(start, seconds, len(slots), memory["used"])
            first = []
            for slot, take in zip(slots, new):
                pending[slot] -= take
                if pending[slot] == 0:
                    prefill_order.remove(slot)
                    first.append(slot)
            if first:
                first_tokens(np.array(first))

        def first_tokens(slots: np.ndarray):
            """Prompts whose prefill ended now: each has its first token."""
            req["first_token"][slot_req[slots]] = env.now
            ctx[slots] += 1
            remaining[slots] -= 1
            finish(slots[remaining[slots] <= 0])

        def engine_process():
            nonlocal centres
            while done["n"] < n:
                admitted = admit()
                chunk = None
                if admitted and cfg.prefill_chunk:
                    for slot in admitted:
                        pending[slot] = ctx[slot]
                        prefill_order.append(slot)
                elif admitted:
                    slots = np.array(admitted)
                    pre = self.costs.prefill(ctx[slots])
                    start = env.now
                    yield env.timeout(pre.seconds)
                    log.prefill(start, pre.seconds, len(slots), memory["used"])
                    first_tokens(slots)
                    continue
                pre_s = 0.0
                if prefill_order:
                    chunk = plan_chunk()
                    pre_s = self.costs.prefill(chunk[1], chunk[2]).seconds
                idx = np.flatnonzero(active & (pending == 0))
                if idx.size == 0 and chunk is not None:   # prompts to prefill, none decoding
                    start = env.now
                    yield env.timeout(pre_s)
                    prefill_chunks(chunk, pre_s, start)
                    continue
                if idx.size == 0:
                    if not waiting:
                        state["wake"] = env.event()
                        yield state["wake"]
                    continue
                ks = np.full(idx.size, cfg.k)
                # what the step computes: the active sequences, or every slot in use (a
                # static batch; fixed slots: a finished sequence's until it is replaced)
                computed = np.flatnonzero(member) if cfg.static_batch or cfg.fixed_slots \
                    else idx
                if cfg.k_policy == "plain":   # the baseline: one token per step, no drafts
                    contexts = ctx[computed]
                    plain = self.costs.plain_step(contexts)
                    start = env.now
                    yield env.timeout(plain.seconds + pre_s)
                    log.iteration(start, plain.seconds, {"draft": 0.0, "verify": plain.seconds,
                                  "selection": 0.0, "other": 0.0}, idx.size, idx.size, 0, 0,
                                  0, 0, memory["used"])
                    ctx[idx] += 1
                    remaining[idx] -= 1
                    iterations[slot_req[idx]] += 1
                    finish(idx[remaining[idx] <= 0])
                    if chunk is not None:
                        prefill_chunks(chunk, pre_s, start + plain.seconds)
                    continue
                if cfg.k_policy == "adaptive":
                    H = self.source.entropies(recorded[idx], step[idx])[:, :k_adaptive_max]
                    H = np.where(np.isnan(H), np.nanmax(H) if np.isfinite(H).any() else 5.0, H)
                    ks = analytical.adaptive_k(H, centres, ratio["draft"], ratio["verify"],
                                               k_choices)
                    ks = np.atleast_1d(ks)
                m, extrapolated = self.source.draw(recorded[idx], step[idx], ks, ctx[idx],
                                                   self.rng)
                if cfg.k_policy == "oracle":
                    # knowing every m in advance, run the batch-wide k that maximises
                    # emitted tokens per second this iteration (drafts run in lockstep)
                    contexts = ctx[computed]
                    rates = [np.sum(np.minimum(np.minimum(m, kk), remaining[idx] - 1) + 1)
                             / self.costs.iteration(contexts, kk, cfg.s, cfg.policy).seconds
                             for kk in range(1, cfg.k + 1)]
                    best = 1 + int(np.argmax(rates))
                    ks = np.full(idx.size, best)
                    m = np.minimum(m, best)
                if cfg.k_policy == "adaptive":
                    H_rows = H
                    pos = np.arange(H_rows.shape[1])[None, :]
                    acc = H_rows[pos < m[:, None]]
                    rej_mask = (pos == m[:, None]) & (m[:, None] < ks[:, None])
                    centres = analytical.update_entropy_centres(centres, acc, H_rows[rej_mask],
                                                                cfg.entropy_beta)
                k_batch = int(ks.max())
                contexts = ctx[computed]
                if k_batch == 0:
                    plain = self.costs.verify(contexts, 1)
                    split = {"draft": 0.0, "verify": plain.seconds, "selection": 0.0,
                             "other": 0.0}
                    seconds = plain.seconds
                else:
                    it = self.costs.iteration(contexts, k_batch, cfg.s, cfg.policy)
                    split, seconds = it.split(), it.seconds
                    ratio["draft"], ratio["verify"] = it.draft_step.seconds, it.verify.seconds
                start = env.now
                yield env.timeout(seconds + pre_s)
                emitted = np.minimum(m + 1, remaining[idx])
                log.iteration(start, seconds, split, idx.size, int(emitted.sum()),
                              int(ks.sum()), int(np.minimum(m, ks).sum()), k_batch,
                              int(extrapolated.sum()), memory["used"])
                ctx[idx] += emitted
                remaining[idx] -= emitted
                # the next iteration's place in the recorded answer (token by token) or its
                # next recorded iteration
                step[idx] += m + 1 if self.source.by_tokens else 1
                iterations[slot_req[idx]] += 1
                finish(idx[remaining[idx] <= 0])
                if chunk is not None:
                    prefill_chunks(chunk, pre_s, start + seconds)

        env.process(arrivals_process())
        env.process(engine_process())
        env.run()
        return SimResult.build(self, req, iterations, log)
