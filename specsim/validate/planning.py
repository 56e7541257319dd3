"""A validation plan: its setups and every configuration's predictions, written before the GPU
runs them (the package doc's step 1)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from specsim.errors import SpecsimError
from specsim.validate.files import FORMAT_KEY


@dataclass
class Setup:
    """One model, batch and mode, with its (policy, k, s) grid."""

    name: str
    model: str                       # catalogue name
    mode: str                        # "forced" (random weights) or "free" (real weights)
    batch: int                       # slots
    policies: list[str]
    ks: list[int]
    ss: list[float]
    context: int | None = None       # forced: every prompt's length
    iterations: int = 24             # forced: iterations replayed per sequence
    max_new_tokens: int = 128        # free
    #: free: token ids per request; more than ``batch`` queue for freed slots
    prompts: list[list[int]] = field(default_factory=list)
    #: free: the trace's prompt id of each request (the simulator replays that prompt's record)
    prompt_ids: list[str] = field(default_factory=list)
    weights: str = "random"          # free: a model folder (safetensors) on the GPU machine
    #: free: instead of ``prompts`` in the plan, the prompt-id file they come from (``specsim
    #: trace --export-prompts``; ``prompt_ids`` name each request's) and its sha256: the plan
    #: stays small (a few hundred long prompts' token ids are megabytes) and names the file its
    #: trace was recorded on
    prompts_file: str | None = None
    prompts_sha256: str | None = None
    #: a model given as a config.json rather than a catalogue name: that config, so that the
    #: GPU machine builds the same shapes without the file (``model`` is then its name)
    model_config: dict | None = None

    def __post_init__(self):
        if self.prompts_file and not self.prompts:
            self.prompts = prompts_from_file(self.prompts_file, self.prompts_sha256,
                                             self.prompt_ids)

    def to_json(self) -> dict:
        """The plan's record of the setup: token ids left in ``prompts_file`` when it names
        them; ``model_config`` only for a model the catalogue does not name."""
        out = dataclasses.asdict(self)
        if self.prompts_file:
            out["prompts"] = []
        if self.model_config is None:
            del out["model_config"]
        return out

    def config(self) -> dict:
        """The model's config.json: the plan's copy, else the catalogue's."""
        if self.model_config is not None:
            return self.model_config
        from specsim.shipped import catalog_file
        path = catalog_file(f"{self.model}/config.json")
        if not path.is_file():
            from specsim.specs import known_models
            raise SpecsimError(f"setup {self.name}: unknown model '{self.model}'; known: "
                               f"{', '.join(known_models())} (or give a path to a config.json)")
        return json.loads(path.read_text())

    def spec(self):
        """The model's :class:`~specsim.specs.ModelSpec`."""
        from specsim.specs import load_model, model_spec_from_config
        if self.model_config is not None:
            return model_spec_from_config(self.model_config, name=self.model)
        return load_model(self.model)

    def cache_length(self) -> int:
        """Cache positions per slot the GPU run allocates: a forced prompt of ``context`` and
        the drafts of ``iterations`` (and the warm-up's) at the largest k; a free prompt and
        its answer (:func:`specsim.engine.decode.cache_positions`)."""
        if self.mode == "forced":
            return int(self.context) + max(self.ks) * (self.iterations + 4) + 16
        longest = max((len(p) for p in self.prompts), default=0)
        return longest + self.max_new_tokens + 2 * max(self.ks) + 1


def repo_file(path: str) -> tuple[str, str]:
    """(where ``path`` is: as given, else specsim's shipped file of that name; how a plan names
    it: its shipped name when it is shipped data, so that any install finds it)."""
    from specsim.shipped import display_name, resolve

    found = resolve(path)
    if not os.path.exists(found):
        raise SpecsimError(f"{path} not found (here or in specsim's shipped data)")
    return found, display_name(found)


def prompts_from_file(path: str, sha256: str | None, names: list[str]) -> list[list[int]]:
    """Token ids of the prompts ``names`` (repeats allowed) in a prompt-id file (``repo_file``);
    refused when the file is not the one the plan was made with."""
    from specsim.engine.record import read_prompt_ids

    found, _ = repo_file(path)
    if sha256 and file_sha(found) != sha256:
        raise SpecsimError(f"{path} is not the file the plan was made with (sha256 "
                           f"{file_sha(found)}, the plan has {sha256})")
    ids, tokens, _ = read_prompt_ids(found)
    by_id = dict(zip(ids, tokens))
    missing = sorted(set(names) - set(by_id))
    if missing:
        raise SpecsimError(f"{path} has no prompt {', '.join(missing[:3])}")
    return [by_id[n] for n in names]


def file_sha(path: str) -> str:
    """A file's sha256, the first 16 hex digits (what plans record of their trace and files)."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()[:16]


def _pick_requests(group, batch: int, k: int, iterations: int):
    """``batch`` requests of a (policy, s) group, ordered by prompt, truncated to k (the
    counterfactual replay the prediction uses too) and to ``iterations`` iterations each, so
    that every sequence runs to the end of the run."""
    from specsim.traces.acceptance import truncate_trace
    requests = sorted(group.requests, key=lambda r: (r.prompt_id or r.id))
    if not requests:
        raise SpecsimError("forced validation needs per-request trace records")
    out = []
    for b in range(batch):
        r = truncate_trace(requests[b % len(requests)], k)
        n = min(iterations, r.iterations)
        out.append(dataclasses.replace(r, context=r.context[:n], k=r.k[:n], m=r.m[:n]))
    n = min(r.iterations for r in out)
    return [dataclasses.replace(r, context=r.context[:n], k=r.k[:n], m=r.m[:n]) for r in out]


def _predict_forced(costs, requests, context: int, k: int, s: float, policy: str
                    ) -> tuple[float, dict[str, float]]:
    """Tokens / Σ T, each iteration costed at the sequences' contexts at that point; and the
    mean iteration's split (ms by phase)."""
    ctx = np.full(len(requests), context, dtype=np.int64)
    tokens, its = 0.0, []
    for i in range(requests[0].iterations):
        its.append(costs.iteration(ctx, k, s, policy))
        emitted = np.array([int(r.m[i]) + 1 for r in requests])
        tokens += emitted.sum()
        ctx = ctx + emitted
    return tokens / sum(it.seconds for it in its), _mean_split(its)


def _mean_split(iterations) -> dict[str, float]:
    """ms by phase (draft, verify, selection, other) of the mean of some IterationCosts."""
    splits = [it.split() for it in iterations]
    return {phase: 1e3 * float(np.mean([sp[phase] for sp in splits])) for phase in splits[0]}


def _predict_forced_plain(costs, batch: int, context: int, tokens: int) -> float:
    steps = max(1, tokens // batch)
    seconds = sum(costs.plain_step(np.full(batch, context + i)).seconds for i in range(steps))
    return steps * batch / seconds


def _simulate(trace_path: str, model: str, hardware: str, batch: int, prompt, output,
              policy: str, s: float | None, k: int, prompt_ids=None, costs: str = "auto"
              ) -> dict:
    """The simulator on the run's own shape: every prompt (lengths ``prompt``) arriving at
    once, ``batch`` slots — a continuous batch when there are more prompts than slots, one
    static batch otherwise, and as ``Engine.generate`` a finished sequence's slot computes
    until a queued prompt takes it — so its prediction covers the whole run, tail included."""
    from specsim.simulator.tuning import SweepSpec, run_one
    prompt = tuple(int(x) for x in np.atleast_1d(prompt))    # hashable: the spec is a key
    spec = SweepSpec(trace_path=trace_path, model=model, hardware=hardware, tp=1,
                     arrivals=("all", len(prompt), prompt, output), max_batch=batch,
                     static_batch=len(prompt) <= batch, fixed_slots=True,
                     prompt_ids=tuple(prompt_ids) if prompt_ids else None, costs=costs)
    return run_one(spec, policy, s, k)


def _full_batches(setup: "Setup") -> list[np.ndarray]:
    """Contexts of full batches in steady state: the prompts ``batch`` at a time (the order
    they take slots, the last partial batch left out), each half-way through its answer."""
    ctx = np.array([len(p) for p in setup.prompts], dtype=np.int64) + setup.max_new_tokens // 2
    b = setup.batch
    return [ctx[i:i + b] for i in range(0, len(ctx) - b + 1, b)] or [ctx]


def check_setups(setups: list[Setup], groups: dict, hardware) -> list[str]:
    """Refuse, in one line, a grid the GPU run could not hold: a policy the engine lacks, a
    (policy, s) the trace has no group for, k outside 1..``MAX_Q_LEN`` − 1 (the verify
    kernel's queries) or, forced, beyond the k the trace recorded (forced acceptance replays
    its drafts), a model the engine cannot build (where torch is here to ask it), and weights
    plus every slot's KV cache beyond ``hardware``'s memory. Returns notes on what holds but
    deserves saying: positions beyond the model's native ones (the rotary tables extend;
    random weights price the cost only)."""
    from specsim.policies import SELECTION_POLICIES

    from specsim.settings import MAX_Q_LEN

    notes = []
    for setup in setups:
        unknown = [p for p in setup.policies if p not in SELECTION_POLICIES]
        if unknown:
            raise SpecsimError(f"unknown policy '{unknown[0]}'; known: "
                               f"{', '.join(SELECTION_POLICIES)}")
        for policy in setup.policies:
            recorded = sorted(s for p, s in groups if p == policy)
            for s in setup.ss:
                if (policy, s) not in groups:
                    raise SpecsimError(f"the trace has no {policy} s={s} group (its {policy} "
                                       f"groups: s {', '.join(map(str, recorded)) or 'none'})")
        bad = [k for k in setup.ks if not 1 <= k <= MAX_Q_LEN - 1]
        if bad:
            raise SpecsimError(f"k {bad[0]} is out of range: the verify kernel takes k + 1 ≤ "
                               f"{MAX_Q_LEN} queries, so k lies in 1..{MAX_Q_LEN - 1}")
        if setup.mode == "forced":
            for policy in setup.policies:
                for s in setup.ss:
                    top = max(int(r.k.max()) for r in groups[(policy, s)].requests)
                    if max(setup.ks) > top:
                        raise SpecsimError(
                            f"k {max(setup.ks)} is beyond the k {top} the trace recorded for "
                            f"{policy} s={s}: forced acceptance replays the recorded drafts, "
                            f"so k ≤ {top} (free-running setups extrapolate beyond it)")
        if setup.mode == "free" and setup.model_config is not None:
            raise SpecsimError(f"setup {setup.name}: free-running setups decode a catalogue "
                               f"model with its real weights (the simulator finds it by "
                               f"name); a config.json alone runs forced")
        spec = setup.spec()
        try:
            from specsim.engine.model import ModelArgs
        except ImportError:       # no torch on this machine: the GPU machine checks it
            ModelArgs = None
        if ModelArgs is not None:
            try:
                ModelArgs.from_config(setup.config())
            except SpecsimError as exc:
                raise SpecsimError(f"the engine cannot run {setup.model}: {exc}") from None
        length = setup.cache_length()
        need = spec.memory_bytes([length] * setup.batch)
        if need > hardware.memory_bytes:
            what = (f"context {setup.context}" if setup.mode == "forced"
                    else f"prompts up to {length - setup.max_new_tokens} tokens")
            raise SpecsimError(
                f"setup {setup.name}: batch {setup.batch} at {what} does not fit on "
                f"{hardware.name}: {spec.name}'s weights and KV cache need "
                f"{need / 1e9:.0f} GB, it has {hardware.memory_bytes / 1e9:.0f} GB (lower the "
                f"batch or the context)")
        if spec.max_context and length > spec.max_context:
            notes.append(f"setup {setup.name}: {length} cache positions are beyond "
                         f"{spec.name}'s {spec.max_context} native ones; forced acceptance "
                         f"with random weights measures the cost there, not the model")
    return notes


def build_plan(setups: list[Setup], trace_path: str, hardware: str = "h200",
               progress: bool = True, costs: str = "auto") -> dict:
    """Predictions for every configuration, before anything runs on the GPU; ``costs`` as
    :func:`specsim.costs.source.resolve_cost_source` takes it (``auto``, ``roofline``,
    ``calibrated``, a calibration file). Each setup records the source that priced it
    (``cost_source``: kind, note, file and its sha256) and the plan :func:`check_setups`'
    notes."""
    from specsim.analytical import emitted_tokens_per_iteration
    from specsim.costs.source import resolve_cost_source
    from specsim.specs import load_hardware
    from specsim.traces.acceptance import estimate_acceptance
    from specsim.traces.importers import load_trace

    trace = load_trace(trace_path)
    groups = trace.groups()
    hw = load_hardware(hardware)
    names = [s.name for s in setups]
    if len(set(names)) < len(names):
        raise SpecsimError(f"two setups named {next(n for n in names if names.count(n) > 1)}")
    notes = check_setups(setups, groups, hw)
    out = {FORMAT_KEY: 1, "trace": trace_path, "trace_sha256": file_sha(trace_path),
           "hardware": hardware, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "setups": []}
    if notes:
        out["notes"] = notes
    for setup in setups:
        spec = setup.spec()
        source = resolve_cost_source(spec, hw, 1, costs)
        cost_model = source.cost_model
        # files by their name in the repository and with their hash: the file the
        # predictions were made with can be checked against the commit's
        path = repo_file(source.path)[1] if source.path else None
        sha = file_sha(source.path) if source.path else None
        calibrated = source.kind == "calibration"
        entry = {"setup": setup.to_json(), "costs": source.note,
                 "cost_source": {"kind": source.kind, "note": source.note, "path": path,
                                 "sha256": sha, "fallback": source.fallback},
                 "calibration": path if calibrated else None,
                 "calibration_sha256": sha if calibrated else None,
                 "configs": []}
        if setup.mode == "forced":
            plain_tokens = setup.batch * setup.iterations * 4
            entry["plain"] = {"predict": _predict_forced_plain(cost_model, setup.batch,
                                                               setup.context, plain_tokens),
                              "tokens": plain_tokens}
            # one prompt of the setup's context, prefilled for real on the GPU
            entry["prefill"] = {"tokens": setup.context,
                                "predict_s": cost_model.prefill([setup.context]).seconds}
        else:
            prompt = np.array([len(p) for p in setup.prompts])
            sim = _simulate(trace_path, setup.model, hardware, setup.batch, prompt,
                            setup.max_new_tokens, "plain", None, 1, setup.prompt_ids, costs)
            step = np.mean([cost_model.plain_step(c).seconds for c in _full_batches(setup)])
            entry["plain"] = {"predict": setup.batch / step,
                              "simulate": sim["decode_throughput"]}
        grid = [(p, s, k) for p in setup.policies for s in setup.ss for k in setup.ks]
        for n, (policy, s, k) in enumerate(grid):
            if progress:
                print(f"\r[{setup.name}] predicting {n + 1}/{len(grid)}", end="",
                      file=sys.stderr, flush=True)
            group = groups[(policy, s)]
            cfg = {"policy": policy, "s": s, "k": k}
            if setup.mode == "forced":
                reqs = _pick_requests(group, setup.batch, k, setup.iterations)
                cfg["forced"] = [{"id": r.id, "k": r.k.tolist(), "m": r.m.tolist()}
                                 for r in reqs]
                cfg["predict"], cfg["split_predicted_ms"] = _predict_forced(
                    cost_model, reqs, setup.context, k, s, policy)
                cfg["tokens_per_iteration_predicted"] = float(np.mean(
                    [np.mean(r.m + 1) for r in reqs]))
            else:
                est = estimate_acceptance(group, k_max=max(k, 1))
                e_tokens = float(est.expected_tokens[k - 1])
                # each answer stops after max_new − 1 iteration tokens: its last iteration's
                # drafts past that are accepted but not emitted
                emitted = emitted_tokens_per_iteration(est.survival_at(k), k,
                                                       max(1, setup.max_new_tokens - 1))
                its = [cost_model.iteration(c, k, s, policy) for c in _full_batches(setup)]
                seconds = np.mean([it.seconds for it in its])
                cfg["predict"] = setup.batch * emitted / seconds
                cfg["split_predicted_ms"] = _mean_split(its)
                cfg["tokens_per_iteration_predicted"] = e_tokens
                cfg["emitted_per_iteration_predicted"] = emitted
                cfg["acceptance_mode"] = "fitted" if bool(est.extrapolated[k - 1]) \
                    else "replay"
                sim = _simulate(trace_path, setup.model, hardware, setup.batch,
                                np.array([len(p) for p in setup.prompts]),
                                setup.max_new_tokens, policy, s, k, setup.prompt_ids, costs)
                cfg["simulate"] = sim["decode_throughput"]
            entry["configs"].append(cfg)
        if progress:
            print(file=sys.stderr)
        out["setups"].append(entry)
    return out
