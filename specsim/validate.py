"""`specsim validate`: does specsim predict the throughput it will measure, and pick the right
k and s? Three steps, so that the predictions exist before the GPU runs:

1. ``plan`` (any machine; needs simpy): for each *setup* — a model, a batch, a context and a
   mode — and each configuration (policy, k, s) of its grid, the predictions of ``specsim
   predict`` (the analytical model: expected tokens per iteration from the trace × the cost
   model's iteration time) and of ``specsim simulate`` (the SimPy simulator, replaying the
   same acceptance), priced by the cost source :func:`specsim.costs.source.resolve_cost_source`
   picks (the plan records its kind, note and file). Written to a plan file with everything
   the GPU needs (the model's config where it is not a catalogue model, prompt token ids,
   forced k/m per sequence). :func:`check_setups` refuses a grid the GPU run could not hold
   (unknown policy, a (policy, s) the trace lacks, k beyond the kernels or the trace, a batch
   and context beyond the GPU's memory) in one line.
2. ``measure`` (the GPU; torch only): runs every configuration of the plan with the engine —
   ``forced`` setups replay the plan's per-iteration k and m with random weights of the real
   shapes; ``free`` setups decode freely with real weights (greedy) — and records measured
   decode throughput two ways, each the median of ``repeats`` runs after a warm-up run: over
   the *steady window* (the iterations that start with every slot busy: tokens over their
   wall time) and over the *whole run* (new tokens over the loop's wall time, prefill
   excluded). A free setup with more prompts than slots runs them as a continuous batch (a
   finished sequence's slot takes the next prompt, as a server does), so its steady window
   spans whole answers, start to end; once the queue is empty the run ends in a tail where
   finished sequences hold their slots.
3. ``report``: per setup and policy, MAPE / worst error of each predictor with its worst cell
   (the configuration and its signed error), Pearson r, and the regret of the predicted
   optimum (measured throughput at the predicted best (k, s) — over the whole grid (policy,
   k, s) — over the best measured); the same per policy across every setup of the plan; for
   free-running setups also the acceptance-side error — counterfactual replay (k ≤ the
   trace's k_rec) and the fitted extrapolation (k > k_rec) against the measured tokens per
   iteration.

``predict`` prices a full batch in steady state (tokens / Σ iteration times of the cost model,
which includes the calibrated loop overhead) and is compared with the steady window;
``simulate`` replays the run itself — its prompts through its slots, continuous or static —
and is compared with the whole run. Forced setups truncate every sequence to the same number
of iterations, so there the two windows coincide but for the first iteration's launch.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from specsim import atomic
from specsim.atomic import write_text_atomic
from specsim.errors import SpecsimError

FORMAT_KEY = "specsim_validation_plan"
MEASURED_KEY = "specsim_validation_measured"


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
    if sha256 and _sha(found) != sha256:
        raise SpecsimError(f"{path} is not the file the plan was made with (sha256 "
                           f"{_sha(found)}, the plan has {sha256})")
    ids, tokens, _ = read_prompt_ids(found)
    by_id = dict(zip(ids, tokens))
    missing = sorted(set(names) - set(by_id))
    if missing:
        raise SpecsimError(f"{path} has no prompt {', '.join(missing[:3])}")
    return [by_id[n] for n in names]


def _sha(path: str) -> str:
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
    out = {FORMAT_KEY: 1, "trace": trace_path, "trace_sha256": _sha(trace_path),
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
        sha = _sha(source.path) if source.path else None
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


# --------------------------------------------------------------------------------------------
# measure (GPU)
# --------------------------------------------------------------------------------------------


def _throughput(gen) -> float:
    """Whole decode loop: the tokens its iterations emitted (not each prompt's first token,
    which the prefill gave, as the simulator counts) over wall time minus the prefills, tail
    included."""
    loop = gen.wall_seconds - gen.timing.get("prefill", 0.0)
    return (gen.new_tokens - sum(1 for t in gen.tokens if t)) / loop


def machine_probe(torch, device: str) -> dict:
    """This machine's copy bandwidth and matmul rate, measured as the operator tables' probe
    is: a run on another start of the machine (which drifts 2–3%) is compared through it."""
    from specsim.operator_sweep import OperatorGrid, _Timer, probe

    dev = torch.device(device)
    return probe(torch, dev, _Timer(torch, dev), OperatorGrid())


def measure(plan: dict, repeats: int = 2, progress: bool = True, device: str = "cuda") -> dict:
    """Run every configuration of ``plan`` on this machine's GPU."""
    import torch

    from specsim.engine import Engine, build_model
    from specsim.traces.format import RequestTrace

    out = {MEASURED_KEY: 1, "plan_created": plan["created"], "setups": []}
    try:
        out["gpu"] = torch.cuda.get_device_name(0)
    except (RuntimeError, AssertionError):
        out["gpu"] = None
    out["torch"] = torch.__version__
    out["probe"] = machine_probe(torch, device)
    for entry in plan["setups"]:
        setup = Setup(**entry["setup"])
        config = setup.config()
        weights = setup.weights if setup.mode == "free" else "random"
        if setup.mode == "free" and len(setup.prompts) < setup.batch:
            raise SpecsimError(f"setup {setup.name}: {len(setup.prompts)} prompts for "
                               f"{setup.batch} slots")
        if setup.mode == "free" and weights == "random":
            raise SpecsimError(f"setup {setup.name}: free-running validation needs real weights "
                               f"(a folder of safetensors)")
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        # the engine prepares the model as its settings say (fused projections, compiled
        # layers on CUDA)
        model = build_model(config, weights=weights, dtype=dtype, device=device)
        rows = []
        prefill_s = None
        started = time.perf_counter()
        if setup.mode == "forced":
            prompts = [[1] * setup.context] * setup.batch
            state = "random"
        else:
            prompts = setup.prompts
            state = None
        max_len = setup.cache_length()
        with torch.inference_mode():
            plain = Engine(model, batch=setup.batch, max_len=max_len, policy="full", k_max=1,
                           beyond_max_position=True)
            new = (entry["plain"].get("tokens", 0) // setup.batch + 1) if setup.mode == \
                "forced" else setup.max_new_tokens
            if setup.mode == "free":
                # one prefill per distinct prompt (the requests cycle a few prompts), shared by
                # reference: the first batch's prompts, plus any later first occurrence
                first_of: dict = {}
                for r, p in enumerate(prompts):
                    first_of.setdefault(tuple(p), r)
                head = sorted(set(range(setup.batch)) | set(first_of.values()))
                kept = plain.generate([prompts[i] for i in head], 4, speculative=False,
                                      keep_prefill=True).prefill
                where = {i: j for j, i in enumerate(head)}
                state = kept.subset([where[first_of[tuple(p)]] for p in prompts])
            else:
                prefill_s = _time_prefill(torch, plain, prompts[0], repeats) \
                    if "prefill" in entry else None
                plain.generate(prompts, 4, speculative=False, prefill=state)
            runs = [plain.generate(prompts, new, speculative=False, prefill=state)
                    for _ in range(repeats)]
            plain_tps = float(np.median([g.steady_tokens_per_second for g in runs]))
            plain_whole = float(np.median([_throughput(g) for g in runs]))
            del plain
            for n, cfg in enumerate(entry["configs"]):
                if progress:
                    el = time.perf_counter() - started
                    print(f"[{setup.name}] {n + 1}/{len(entry['configs'])} {cfg['policy']} "
                          f"s={cfg['s']} k={cfg['k']} (elapsed {el:.0f} s)", file=sys.stderr,
                          flush=True)
                engine = Engine(model, batch=setup.batch, max_len=max_len, policy=cfg["policy"],
                                s=cfg["s"], k_max=cfg["k"], beyond_max_position=True)
                forced = None
                if setup.mode == "forced":
                    forced = [RequestTrace(f["id"], cfg["policy"], cfg["s"],
                                           np.full(len(f["k"]), setup.context),
                                           np.array(f["k"]), np.array(f["m"]))
                              for f in cfg["forced"]]
                    warm = [dataclasses.replace(t, context=t.context[:2], k=t.k[:2],
                                                m=t.m[:2]) for t in forced]
                    engine.generate(prompts, 1, k=cfg["k"], forced=warm, prefill=state)
                else:   # warm up (graphs captured) on one batch and one refill, not the queue
                    warm = list(range(min(len(prompts), setup.batch + 1)))
                    engine.generate([prompts[i] for i in warm], 2 * cfg["k"] + 4, k=cfg["k"],
                                    prefill=state.subset(warm))
                gens = [engine.generate(prompts, setup.max_new_tokens, k=cfg["k"],
                                        forced=forced, prefill=state) for _ in range(repeats)]
                tps = [g.steady_tokens_per_second for g in gens]
                traced = {t.id: t for t in gens[0].traces}
                by_request = [traced.get(str(r)) for r in range(len(gens[0].tokens))]
                full = gens[0].steady_window
                rows.append({**{k: cfg[k] for k in ("policy", "s", "k")},
                             "tokens_per_second": float(np.median(tps)),
                             "tokens_per_second_runs": tps,
                             "tokens_per_second_whole_run": float(np.median(
                                 [_throughput(g) for g in gens])),
                             "steady_iterations": len(full),
                             "iterations": gens[0].iterations,
                             # the window's own (the whole run's weights the sequences
                             # that need more iterations more)
                             "tokens_per_iteration": sum(n for _, n in full) / (
                                 len(full) * setup.batch) if full else float("nan"),
                             "tokens_per_iteration_whole_run": gens[0].tokens_per_iteration,
                             "emitted_per_iteration_whole_run":
                                 gens[0].emitted_tokens_per_iteration,
                             # per request (prompt order; None: no iteration): what the
                             # tail is made of
                             "request_iterations": [
                                 t.iterations if t else None for t in by_request],
                             "request_tokens_per_iteration": [
                                 float(np.mean(t.m + 1)) if t else None for t in by_request],
                             "split_s": gens[0].timing,
                             "wall_s": gens[0].wall_seconds,
                             # the loop's own clock (every iteration's time, as the
                             # calibration's loop overhead is measured): the call's fixed
                             # costs outside the loop are not in it
                             "loop_s": float(sum(step[0] for step in gens[0].steps)),
                             # where a run's odd wall time went (a process's first
                             # configuration can spend tenths of a second outside every
                             # phase): its three slowest iterations, (seconds, index, active
                             # slots)
                             "slowest_iterations": slowest_steps(gens[0].steps)})
                del engine
                if device == "cuda":
                    torch.cuda.empty_cache()
        out["setups"].append({"name": setup.name, "plain_tokens_per_second": plain_tps,
                              "plain_tokens_per_second_whole_run": plain_whole,
                              **({"prefill_s": prefill_s} if prefill_s else {}),
                              "configs": rows})
        del model
    return out


def _time_prefill(torch, engine, prompt: list[int], repeats: int) -> list[float]:
    """Seconds of the engine's prefill of one prompt, computed (not a random cache): one
    warm-up at the same length (compiled layers specialise on it), then ``repeats`` timed."""
    def once() -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.prefill([prompt])
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    once()
    return [once() for _ in range(max(1, repeats))]


def slowest_steps(steps: list[tuple[float, int, int]], n: int = 3) -> list[list]:
    """The ``n`` longest iterations of a run as [seconds, index, active slots], longest first."""
    order = sorted(range(len(steps)), key=lambda i: -steps[i][0])[:n]
    return [[float(steps[i][0]), i, int(steps[i][1])] for i in order]


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------


def _errors(pred: np.ndarray, meas: np.ndarray) -> dict:
    err = pred / meas - 1.0
    r = float(np.corrcoef(pred, meas)[0, 1]) if pred.size > 2 and np.std(pred) > 0 \
        and np.std(meas) > 0 else float("nan")
    return {"mape": float(np.mean(np.abs(err))), "worst": float(np.max(np.abs(err))),
            "bias": float(np.mean(err)), "pearson_r": r}


def _regret(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(meas[int(np.argmax(pred))] / np.max(meas))


def _worst_cell(rows: list[dict], predictor: str, setups: list[str] | None = None) -> dict:
    """The configuration ``predictor`` misses most (largest |predicted / measured − 1|) and
    that signed error; with ``setups`` (each row's setup name), its setup too."""
    errors = [r[predictor] / r[TARGET[predictor]] - 1.0 for r in rows]
    i = int(np.argmax(np.abs(errors)))
    return {**({"setup": setups[i]} if setups else {}),
            **{k: rows[i][k] for k in ("policy", "s", "k")}, "error": float(errors[i])}


#: What each predictor is compared with: ``predict`` prices a full batch in steady state —
#: measured as the steady window's iteration time (every slot busy) with the tokens per
#: iteration of every answer start to end (``measured``; the window's own throughput is
#: ``measured_window``); ``simulate`` replays the run — its prompts through its slots, tail
#: included (the whole decode loop).
TARGET = {"predict": "measured", "simulate": "measured_whole_run"}


def trace_agreement(setup: dict, got: dict, trace) -> dict | None:
    """How many of a free-running setup's answers decoded exactly as the trace recorded them
    (same iterations, same tokens per iteration), over its configurations at the recorded k
    of their (policy, s) group: bf16 near-ties make a prompt's text depend on the batch shape
    it was decoded in, and an answer that went another way carries another acceptance (a
    floor under any prediction from that trace). None where no configuration ran at k_rec or
    the measurements lack per-request figures."""
    prompt_ids = setup.get("prompt_ids")
    if not prompt_ids:
        return None
    from specsim.traces.acceptance import fixed_k
    records = {(r.prompt_id, r.policy, r.s, fixed_k(r)): r for r in trace.requests
               if r.prompt_id and fixed_k(r) is not None}
    per_config, never = [], None
    for c in got["configs"]:
        its, tpis = c.get("request_iterations"), c.get("request_tokens_per_iteration")
        if not its or len(its) != len(prompt_ids):
            continue
        recs = [records.get((p, c["policy"], c["s"], c["k"])) for p in prompt_ids]
        if any(r is None for r in recs):
            continue
        same = [r.iterations == n and abs(r.tokens / r.iterations - t) < 1e-9
                for r, n, t in zip(recs, its, tpis)]
        per_config.append(sum(same))
        off = {p for p, ok in zip(prompt_ids, same) if not ok}
        never = off if never is None else never & off
    if not per_config:
        return None
    return {"configs": len(per_config), "requests": len(prompt_ids),
            "matching_mean": float(np.mean(per_config)), "matching_min": int(min(per_config)),
            "prompts_never_matching": sorted(never)}


def report(plan: dict, measured: dict, trace=None) -> dict:
    """Errors and regrets per setup and policy (and over each setup's whole grid); with the
    plan's ``trace`` (a :class:`~specsim.traces.format.Trace`) also how many answers decoded
    as the trace recorded them (:func:`trace_agreement`)."""
    by_name = {s["name"]: s for s in measured["setups"]}
    out = []
    for entry in plan["setups"]:
        name = entry["setup"]["name"]
        got = by_name.get(name)
        if got is None:
            continue
        meas_by = {(c["policy"], c["s"], c["k"]): c for c in got["configs"]}
        rows = []
        for cfg in entry["configs"]:
            m = meas_by.get((cfg["policy"], cfg["s"], cfg["k"]))
            if m is None:
                continue
            tpi_window = m["tokens_per_iteration"]          # emitted, in the window
            tpi_all = m.get("tokens_per_iteration_whole_run", tpi_window)
            emitted_all = m.get("emitted_per_iteration_whole_run", tpi_all)
            rows.append({**{k: cfg[k] for k in ("policy", "s", "k")},
                         "measured_window": m["tokens_per_second"],
                         # steady state: the window's full-batch iteration time with the
                         # emitted tokens per iteration of every answer, start to end (the
                         # window of a finite queue over-weights answers' beginnings)
                         "measured": m["tokens_per_second"] * emitted_all / tpi_window,
                         "measured_whole_run": m.get("tokens_per_second_whole_run",
                                                     m["tokens_per_second"]),
                         "predict": cfg["predict"],
                         "simulate": cfg.get("simulate"),
                         "tokens_per_iteration": tpi_all,
                         "tokens_per_iteration_window": tpi_window,
                         "tokens_per_iteration_predicted": cfg["tokens_per_iteration_predicted"],
                         "emitted_per_iteration_predicted": cfg.get(
                             "emitted_per_iteration_predicted",
                             cfg["tokens_per_iteration_predicted"]),
                         "acceptance_mode": cfg.get("acceptance_mode", "forced"),
                         "split_predicted_ms": cfg.get("split_predicted_ms"),
                         "split_measured_ms": _measured_split(m)})
        # q = k + 1 beyond the Triton verify kernel runs the engine's torch fallback (eager,
        # no CUDA graph): listed, but not a configuration a user would run or calibrate
        from specsim.settings import MAX_Q_LEN
        excluded = [r for r in rows if r["k"] + 1 > MAX_Q_LEN]
        rows = [r for r in rows if r["k"] + 1 <= MAX_Q_LEN]
        predictors = ["predict"] + (["simulate"] if rows and rows[0]["simulate"] is not None
                                    else [])

        batch = entry["setup"]["batch"]
        for r in rows + excluded:   # the cost side alone: seconds per iteration, steady window
            r["iteration_ms_predicted"] = 1e3 * batch * r["emitted_per_iteration_predicted"] \
                / r["predict"]
            r["iteration_ms_measured"] = 1e3 * batch * r["tokens_per_iteration_window"] \
                / r["measured_window"]

        def summary(sel):
            res = {"configs": len(sel), "best_measured": max(
                sel, key=lambda r: r["measured"])}
            e = np.array([r["iteration_ms_predicted"] / r["iteration_ms_measured"] - 1
                          for r in sel])
            res["iteration_time"] = {"mape": float(np.mean(np.abs(e))),
                                     "worst": float(np.max(np.abs(e))),
                                     "bias": float(np.mean(e))}
            res["phases"] = phase_summary(sel)
            for p in predictors:
                meas = np.array([r[TARGET[p]] for r in sel])
                pred = np.array([r[p] for r in sel])
                best = sel[int(np.argmax(pred))]
                res[p] = {**_errors(pred, meas), "worst_cell": _worst_cell(sel, p),
                          "regret": _regret(pred, meas),
                          "predicted_best": {k: best[k] for k in ("policy", "s", "k")}}
            return res

        policies = sorted({r["policy"] for r in rows})
        item = {"name": name, "setup": {**{k: v for k, v in entry["setup"].items()
                                           if k not in ("prompts", "model_config")},
                                        "requests": len(entry["setup"].get("prompts", ()))
                                        or entry["setup"]["batch"]},
                "costs": entry["costs"], "cost_source": _cost_source(entry),
                "rows": rows, "excluded": excluded,
                "plain": {"measured": got["plain_tokens_per_second"],
                          "measured_whole_run": got.get("plain_tokens_per_second_whole_run",
                                                        got["plain_tokens_per_second"]),
                          **entry["plain"]},
                "per_policy": {p: summary([r for r in rows if r["policy"] == p])
                               for p in policies},
                "all": summary(rows) if rows else None}
        if "prefill" in entry and got.get("prefill_s"):
            measured_s = float(np.median(got["prefill_s"]))
            item["prefill"] = {"tokens": entry["prefill"]["tokens"],
                               "predict_s": entry["prefill"]["predict_s"],
                               "measured_s": measured_s,
                               "error": entry["prefill"]["predict_s"] / measured_s - 1.0}
        if entry["setup"]["mode"] == "free":
            acc = {}
            for mode in ("replay", "fitted"):   # tokens/iteration: the fallback runs count
                sel = [r for r in rows + excluded if r["acceptance_mode"] == mode]
                if sel:
                    e = np.array([r["tokens_per_iteration_predicted"] / r["tokens_per_iteration"]
                                  - 1 for r in sel])
                    acc[mode] = {"configs": len(sel), "mape": float(np.mean(np.abs(e))),
                                 "worst": float(np.max(np.abs(e))), "bias": float(np.mean(e))}
            item["acceptance"] = acc
            if trace is not None:
                item["trace_agreement"] = trace_agreement(entry["setup"], got, trace)
        out.append(item)
    return {"setups": out, "across_setups": across_setups(out)}


def _cost_source(entry: dict) -> dict:
    """What priced a plan's setup: its ``cost_source`` record, or for a plan that has only
    the note, the kind read from it (a calibration file named, else the roofline)."""
    if entry.get("cost_source"):
        return entry["cost_source"]
    path = entry.get("calibration")
    return {"kind": "calibration" if path else "roofline", "note": entry["costs"],
            "path": path, "sha256": entry.get("calibration_sha256"), "fallback": None}


def across_setups(items: list[dict]) -> dict:
    """Per policy and over every policy, each predictor's errors over the cells of every
    setup together (MAPE, the worst cell with its setup) and the regrets of the setups'
    predicted optima (their mean and the lowest, with its setup: each setup is its own
    workload, so the optimum is chosen within it). A predictor counts where every setup
    having rows has it."""
    items = [item for item in items if item["all"]]
    predictors = [p for p in TARGET if items and all(p in item["all"] for item in items)]

    def pooled(policy: str | None) -> dict:
        cells = [(item["name"], r) for item in items for r in item["rows"]
                 if policy is None or r["policy"] == policy]
        summaries = [(item["name"], item["all"] if policy is None
                      else item["per_policy"].get(policy)) for item in items]
        summaries = [(n, sm) for n, sm in summaries if sm]
        res = {"configs": len(cells), "setups": len(summaries)}
        rows = [r for _, r in cells]
        for p in predictors:
            errors = np.array([r[p] / r[TARGET[p]] - 1.0 for r in rows])
            worst = _worst_cell(rows, p, [n for n, _ in cells])
            regrets = [(sm[p]["regret"], n) for n, sm in summaries]
            lowest = min(regrets)
            res[p] = {"mape": float(np.mean(np.abs(errors))), "worst": abs(worst["error"]),
                      "worst_cell": worst,
                      "regret_mean": float(np.mean([r for r, _ in regrets])),
                      "regret_lowest": float(lowest[0]), "regret_lowest_setup": lowest[1]}
        return res

    policies = sorted({r["policy"] for item in items for r in item["rows"]})
    return {"setups": len(items), "per_policy": {p: pooled(p) for p in policies},
            "all": pooled(None) if items else None}


#: Phases of an iteration, as the cost model splits it and the engine times it.
PHASES = ("draft", "verify", "selection", "other")


def _measured_split(m: dict) -> dict[str, float] | None:
    """ms per iteration by phase over the whole run (CUDA-event phase totals; ``other`` also
    takes the host time no phase covered: the loop's own clock less the phases, as the
    calibration measures the loop overhead that prices it; in runs that did not record the
    loop's clock, the call's wall time less its prefill, which also spreads the call's fixed
    costs outside the loop over its iterations), or None for measurements without the
    split."""
    split, iterations = m.get("split_s"), m.get("iterations")
    if not split or not iterations:
        return None
    loop = m["loop_s"] if m.get("loop_s") else m["wall_s"] - split.get("prefill", 0.0)
    out = {p: 1e3 * split.get(p, 0.0) / iterations for p in PHASES[:3]}
    out["other"] = 1e3 * loop / iterations - sum(out.values())
    return out


def phase_summary(rows: list[dict]) -> dict[str, dict[str, float]] | None:
    """Mean ms per iteration by phase, measured and predicted, over rows having both."""
    both = [r for r in rows if r.get("split_measured_ms") and r.get("split_predicted_ms")]
    if not both:
        return None
    return {p: {"measured": float(np.mean([r["split_measured_ms"][p] for r in both])),
                "predicted": float(np.mean([r["split_predicted_ms"][p] for r in both]))}
            for p in PHASES}


def markdown(rep: dict, measured: dict) -> str:
    """The tables of VALIDATION.md."""
    probe = measured.get("probe") or {}
    lines = [f"GPU: {measured.get('gpu')}, torch {measured.get('torch')}"
             + (f", copy bandwidth {probe['copy_bandwidth_Bps'] / 1e12:.2f} TB/s"
                if probe.get("copy_bandwidth_Bps") else "") + ".", ""]
    for item in rep["setups"]:
        st = item["setup"]
        requests = st.get("requests", st["batch"])
        what = (f"{st['model']}, batch {st['batch']}, "
                + (f"context {st['context']}, forced acceptance ({st['iterations']} iterations, "
                   f"random weights)" if st["mode"] == "forced" else
                   f"real weights, free-running greedy, {st['max_new_tokens']} new tokens"
                   + (f", {requests} prompts as a continuous batch" if requests > st["batch"]
                      else "")))
        lines += [f"### {item['name']}: {what}", "",
                  f"Costs: {item['costs']}. Plain decoding: measured "
                  f"{item['plain']['measured']:.0f} tokens/s (steady window; whole run "
                  f"{item['plain']['measured_whole_run']:.0f}), predicted "
                  f"{item['plain']['predict']:.0f}"
                  + (f", simulated {item['plain']['simulate']:.0f}"
                     if item["plain"].get("simulate") else "") + "."
                  + (f" Prefill of one {item['prefill']['tokens']}-token prompt: measured "
                     f"{item['prefill']['measured_s'] * 1e3:.1f} ms, predicted "
                     f"{item['prefill']['predict_s'] * 1e3:.1f} ms "
                     f"({item['prefill']['error'] * 100:+.1f}%)." if "prefill" in item else ""),
                  ""]
        preds = [p for p in ("predict", "simulate") if item["all"] and p in item["all"]]
        head = "| policy | configs | " + " | ".join(
            f"{p} MAPE | {p} worst | {p} r | {p} regret" for p in preds) + " |"
        lines += [head, "|" + "---|" * (2 + 4 * len(preds))]
        for name, sm in [*item["per_policy"].items(), ("all", item["all"])]:
            cells = [name, str(sm["configs"])]
            for p in preds:
                e = sm[p]
                cells += _error_cells(e, name) + [f"{e['pearson_r']:.3f}", f"{e['regret']:.3f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("Cost side alone (seconds per iteration in the steady window, predicted vs "
                     "measured): " + "; ".join(
                         f"{name} MAPE {sm['iteration_time']['mape'] * 100:.1f}%, bias "
                         f"{sm['iteration_time']['bias'] * 100:+.1f}%"
                         for name, sm in [*item["per_policy"].items(), ("all", item["all"])])
                     + ".")
        lines.append("")
        phases = {name: sm.get("phases")
                  for name, sm in [*item["per_policy"].items(), ("all", item["all"])]}
        if any(phases.values()):
            lines += ["Cost side by phase (ms per iteration over the whole run, mean over the "
                      "configurations; measured / predicted):", "",
                      "| policy | " + " | ".join(PHASES) + " |", "|---|" + "---|" * len(PHASES)]
            for name, ph in phases.items():
                if ph:
                    lines.append(f"| {name} | " + " | ".join(
                        f"{ph[p]['measured']:.2f} / {ph[p]['predicted']:.2f}" for p in PHASES)
                        + " |")
            lines.append("")
        if item.get("acceptance"):
            lines.append("Acceptance side (tokens per iteration, predicted vs measured): "
                         + "; ".join(f"{m}: MAPE {v['mape'] * 100:.1f}%, worst "
                                     f"{v['worst'] * 100:.1f}%, bias {v['bias'] * 100:+.1f}% "
                                     f"({v['configs']} configs)"
                                     for m, v in item["acceptance"].items()) + ".")
            lines.append("")
        agree = item.get("trace_agreement")
        if agree:
            never = agree["prompts_never_matching"]
            lines.append(f"Answers decoded exactly as the trace recorded them (configurations at "
                         f"the recorded k, {agree['configs']}): {agree['matching_mean']:.1f} of "
                         f"{agree['requests']} on average (fewest {agree['matching_min']})"
                         + (f"; never: {', '.join(never)}" if never else "") + ".")
            lines.append("")
        lines += ["<details><summary>every configuration</summary>", "",
                  "| policy | s | k | measured tok/s (steady state) | predict | window tok/s | "
                  "measured tok/s (whole run) | simulate | tok/iter (all answers) | tok/iter "
                  "(window) | tok/iter predicted |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in item["rows"]:
            sim = f"{r['simulate']:.0f}" if r["simulate"] is not None else ""
            lines.append(f"| {r['policy']} | {r['s']} | {r['k']} | {r['measured']:.0f} | "
                         f"{r['predict']:.0f} | {r['measured_window']:.0f} | "
                         f"{r['measured_whole_run']:.0f} | {sim} | "
                         f"{r['tokens_per_iteration']:.2f} | "
                         f"{r['tokens_per_iteration_window']:.2f} | "
                         f"{r['tokens_per_iteration_predicted']:.2f} |")
        if item.get("excluded"):
            lines += ["", "Excluded (q = k + 1 above the verify kernel's 16: the engine's eager "
                      "torch fallback runs them): " + ", ".join(
                          f"{r['policy']} s={r['s']} k={r['k']} measured {r['measured']:.0f} "
                          f"vs predicted {r['predict']:.0f}" for r in item["excluded"]) + "."]
        lines += ["", "</details>", ""]
    across = rep.get("across_setups")
    if across and across["setups"] > 1:
        preds = [p for p in TARGET if p in across["all"]]
        lines += [f"### Across the {across['setups']} setups", "",
                  "Every setup's cells together; regret is each setup's own (its predicted "
                  "best against its measured best), the mean and the lowest.", "",
                  "| policy | configs | " + " | ".join(
                      f"{p} MAPE | {p} worst | {p} regret mean | {p} regret lowest"
                      for p in preds) + " |", "|" + "---|" * (2 + 4 * len(preds))]
        for name, sm in [*across["per_policy"].items(), ("all", across["all"])]:
            cells = [name, str(sm["configs"])]
            for p in preds:
                e = sm[p]
                cells += _error_cells(e, name) + [
                    f"{e['regret_mean']:.3f}",
                    f"{e['regret_lowest']:.3f} ({e['regret_lowest_setup']})"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _error_cells(summary: dict, name: str) -> list[str]:
    """A summary's MAPE and worst-cell columns (the worst cell named, with its setup in the
    ``all`` row)."""
    return [f"{summary['mape'] * 100:.1f}%",
            f"{summary['worst'] * 100:.1f}% ({_cell_label(summary['worst_cell'], name == 'all')})"]


def _cell_label(cell: dict, policy: bool = True) -> str:
    """A worst cell as the tables name it: its setup, its policy (where the row is not that
    policy's), s and k, and the signed miss (+: predicted faster than measured)."""
    where = f"{cell['setup']} " if cell.get("setup") else ""
    what = f"{cell['policy']} " if policy else ""
    return f"{where}{what}s={cell['s']} k={cell['k']}, {cell['error'] * 100:+.1f}%"


def read_json(path: str, key: str) -> dict:
    """A plan (``key`` = ``FORMAT_KEY``) or measurement file (``MEASURED_KEY``), checked."""
    doc = atomic.read_json(path, "validation file")
    if not isinstance(doc, dict) or doc.get(key) != 1:
        raise SpecsimError(f"{path}: not a specsim validation file (expected \"{key}\": 1)")
    return doc


def write_json(path: str, doc: dict) -> None:
    write_text_atomic(path, json.dumps(doc, indent=1))


def select(plan: dict, setups: str | None = None, policies: str | None = None) -> dict:
    """The plan restricted to some setups and policies (comma-separated names): a part of the
    grid per process — a CUDA device-side assert ends the process that hits it."""
    out = []
    for entry in plan["setups"]:
        if setups and entry["setup"]["name"] not in setups.split(","):
            continue
        if policies:
            keep = policies.split(",")
            entry = dict(entry, configs=[c for c in entry["configs"] if c["policy"] in keep])
        out.append(entry)
    return dict(plan, setups=out)


def merge_measured(docs: list[dict]) -> dict:
    """Measurements of parts of one plan (``select``) as one file: per setup, every part's
    configurations (a configuration measured twice keeps its first); plain decoding, and the
    machine's probe, from the first part that has the setup."""
    if not docs:
        raise SpecsimError("nothing to merge")
    created = {d["plan_created"] for d in docs}
    if len(created) > 1:
        raise SpecsimError(f"measurements of different plans: {sorted(created)}")
    out = {k: v for k, v in docs[0].items() if k != "setups"}
    setups: dict[str, dict] = {}
    for doc in docs:
        for part in doc["setups"]:
            probe = {"probe": doc["probe"]} if "probe" in doc and "probe" not in part else {}
            have = setups.setdefault(part["name"], dict(part, configs=[], **probe))
            seen = {(c["policy"], c["s"], c["k"]) for c in have["configs"]}
            have["configs"] += [c for c in part["configs"]
                                if (c["policy"], c["s"], c["k"]) not in seen]
    out["setups"] = list(setups.values())
    return out


def main(argv=None) -> None:
    """GPU side without the CLI installed:
    ``python -m specsim.validate PLAN OUT [REPEATS [SETUP,…|all [POLICY,…]]]``, and
    ``python -m specsim.validate merge OUT PART.json PART.json …``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["merge"]:
        if len(argv) < 3:
            raise SystemExit("usage: python -m specsim.validate merge OUT PART.json …")
        write_json(argv[1], merge_measured([read_json(p, MEASURED_KEY) for p in argv[2:]]))
        return
    if len(argv) < 2:
        raise SystemExit("usage: python -m specsim.validate PLAN MEASURED_OUT [REPEATS "
                         "[SETUPS|all [POLICIES]]]")
    plan = select(read_json(argv[0], FORMAT_KEY),
                  argv[3] if len(argv) > 3 and argv[3] != "all" else None,
                  argv[4] if len(argv) > 4 else None)
    got = measure(plan, repeats=int(argv[2]) if len(argv) > 2 else 2)
    write_json(argv[1], got)
    rep = report(plan, got)
    for item in rep["setups"]:
        for p, sm in [*item["per_policy"].items(), ("all", item["all"])]:
            e = sm["predict"]
            print(f"{item['name']:>10} {p:>12}: predict MAPE {e['mape'] * 100:5.1f}% worst "
                  f"{e['worst'] * 100:5.1f}% ({_cell_label(e['worst_cell'], p == 'all')}) r "
                  f"{e['pearson_r']:.3f} regret {e['regret']:.3f}")


if __name__ == "__main__":
    main()
