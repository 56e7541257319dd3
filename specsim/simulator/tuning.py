"""Tuning by simulation: a grid sweep over (policy, s, k) run in parallel processes, Vegas'
3-step procedure on the simulated grid, the optimum, the runner-up, the sensitivity, and the
analytical prediction beside the simulated one with the difference split into its causes.

Every configuration is simulated on the same arrivals and compared with plain decoding
simulated on the same arrivals, so simulated speedups and analytical speedups mean the same.
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from specsim import analytical
from specsim.errors import SpecsimError
from specsim.simulator.result import PERCENTILES


class TuningError(SpecsimError):
    """A trace or a request that gives the sweep nothing to tune."""


def _groups_text(groups) -> str:
    return ", ".join(f"{p} (s={'null' if s is None else s})" for p, s in groups) or "none"


@dataclass(frozen=True)
class SweepSpec:
    """Everything a worker needs to rebuild the simulation (picklable, paths and names)."""

    trace_path: str
    model: str
    hardware: str
    tp: int
    arrivals: tuple            # ("all"|"poisson"|"file", args...)
    max_batch: int
    acceptance: str = "replay"
    k_policy: str = "fixed"
    seed: int = 0
    trace_format: str | None = None
    part: str = "all"          # all | tune | eval: which side of a held-out split to simulate
    holdout: float = 0.0
    holdout_seed: int = 0
    costs: str = "auto"         # as make_cost_model takes it
    static_batch: bool = False  # SimConfig.static_batch
    prompt_ids: tuple | None = None  # "all" arrivals: the recorded prompt of each request
    fixed_slots: bool = False   # SimConfig.fixed_slots
    prefill_chunk: int | None = None  # SimConfig.prefill_chunk
    engine_profile: str | None = None  # an engine profile's path, applied on the costs


_CACHE: dict = {}


def _setup(spec: SweepSpec):
    key = spec
    if key not in _CACHE:
        from specsim.costs import make_cost_model
        from specsim.specs import load_hardware, load_model
        from specsim.traces.importers import load_trace
        model, hw = load_model(spec.model), load_hardware(spec.hardware)
        trace = load_trace(spec.trace_path, spec.trace_format,
                           per_draft=spec.k_policy == "adaptive")
        if spec.part != "all":
            from specsim.predict import split_trace
            tune, evaluate = split_trace(trace, spec.holdout, spec.holdout_seed)
            trace = tune if spec.part == "tune" else evaluate
        _CACHE.clear()
        costs = make_cost_model(model, hw, spec.tp, spec.costs)[0]
        if spec.engine_profile:
            from specsim.costs.engine_profile import ProfiledCostModel, read_profile
            costs = ProfiledCostModel(costs, read_profile(spec.engine_profile))
        _CACHE[key] = (model, hw, costs,
                       trace.groups(),
                       make_arrivals(spec.arrivals, trace, spec.prompt_ids))
    return _CACHE[key]


def make_arrivals(arrivals: tuple, trace=None, prompt_ids=None):
    from specsim.simulator.arrivals import all_at_once, from_file, poisson
    kind, *args = arrivals
    if kind == "file":
        return from_file(*args)
    n, prompt, output = args[0], args[-2], args[-1]
    if prompt is None and trace is not None and trace.requests:
        # prompt lengths from the trace: each request's context at its first iteration
        firsts = np.array([int(r.context[0]) for r in trace.requests])
        prompt = np.resize(firsts, n)
    if prompt is None:
        prompt = 4096
    if kind == "all":
        return all_at_once(n, prompt, output, prompt_ids)
    return poisson(n, args[1], prompt, output, seed=args[2] if len(args) > 4 else 0)


def run_one(spec: SweepSpec, policy: str, s: float | None, k: int, k_policy: str | None = None,
            max_batch: int | None = None) -> dict:
    """Simulate one configuration (``policy == "plain"``: plain decoding) at ``max_batch``
    sequences at most (default the spec's)."""
    from specsim.simulator.acceptance_source import make_source
    from specsim.simulator.engine import SimConfig, Simulation
    model, hw, costs, groups, arrivals = _setup(spec)
    kp = k_policy or spec.k_policy
    batch = max_batch or spec.max_batch
    if policy == "plain":
        group = next(iter(groups.values()))
        cfg = SimConfig("full", 1.0, k=1, k_policy="plain", max_batch=batch,
                        seed=spec.seed, static_batch=spec.static_batch,
                        fixed_slots=spec.fixed_slots, prefill_chunk=spec.prefill_chunk)
    else:
        group = groups[(policy, s)]
        cfg = SimConfig(policy, s, k=k, k_policy=kp, max_batch=batch, seed=spec.seed,
                        static_batch=spec.static_batch, fixed_slots=spec.fixed_slots,
                        prefill_chunk=spec.prefill_chunk)
    source = make_source(spec.acceptance, group, k)
    result = Simulation(arrivals, costs, model, source, cfg, hw.memory_bytes, spec.tp).run()
    summary = result.summary
    it = result.steps["is_iteration"]
    decode_s = float(result.steps["seconds"][it].sum())
    decode_tokens = int(result.steps["emitted"][it].sum())
    latencies = {f"{what}_p{p}_s": summary[f"{what}_s"][f"p{p}"]
                 for what in ("tpot", "ttft", "latency") for p in PERCENTILES}
    return {"policy": policy, "s": s, "k": k, "k_policy": cfg.k_policy, "max_batch": batch,
            "throughput": summary["throughput_tokens_per_s"],
            "decode_throughput": decode_tokens / decode_s if decode_s else 0.0,
            "tokens_per_iteration": summary["tokens_per_iteration"],
            "mean_batch": summary["mean_batch"],
            "mean_decode_context": float(np.average(result.requests["prompt_tokens"]
                                                    + result.requests["output_tokens"] / 2)),
            **latencies,
            "time_split_s": summary["time_split_s"],
            "wasted_draft_fraction": summary["wasted_draft_fraction"],
            "extrapolated_iterations": summary["extrapolated_iterations"]}


def pool_context():
    """Forked workers where the platform forks (Linux): they inherit the trace, cost model and
    arrivals the parent read in ``_setup``, so a large trace is read once, not once per worker;
    elsewhere (spawn) each worker reads it once."""
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)


def _star(args):
    return run_one(*args)


def sweep(spec: SweepSpec, policies, ks, workers: int | None = None, progress=None,
          ray_address: str | None = None, batches: list[int] | None = None) -> dict:
    """Simulate plain decoding and every (policy, s, k) with s from the trace's groups, at
    each of ``batches`` (largest batch sizes; default the spec's alone): in ``workers`` local
    processes, or on Ray (``ray_address``: ``"local"``, ``"auto"`` or ``ray://host:port``, see
    :mod:`specsim.simulator.ray_sweep`) with the same rows, each carrying the ``worker`` that
    computed it."""
    setup = _setup(spec)
    groups = setup[3]
    if not any(s is not None for _, s in groups):
        raise TuningError(f"{spec.trace_path}: the trace has no sparse groups (every record has "
                          f"s = null, a drafter that is not sparse, as in a Spec-Bench file); "
                          f"tune needs (policy, s) groups with s recorded; it has: "
                          f"{_groups_text(groups)}")
    if not policies:
        raise TuningError("no policies to tune")
    for k in ks:
        analytical.check_k_max(k, "k")
    batches = sorted(set(batches or [spec.max_batch]))
    configs = [(spec, "plain", None, 1, None, b) for b in batches]
    for policy in policies:
        ss = sorted(s for (p, s) in groups if p == policy and s is not None)
        if not ss:
            raise TuningError(f"{spec.trace_path}: the trace has no '{policy}' groups with s "
                              f"recorded; it has: {_groups_text(groups)}")
        configs += [(spec, policy, s, k, None, b) for b in batches for s in ss for k in ks]
    if ray_address is not None:
        from specsim.simulator.ray_sweep import run_configs
        results, cluster = run_configs(configs, setup, ray_address, workers, progress)
        return _finish(results, len(configs), cluster["workers"], len(batches)) | {
            "ray": cluster}
    workers = workers or min(len(configs), os.cpu_count() or 1)
    results = []
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers, mp_context=pool_context()) as pool:
            for r in pool.map(_star, configs, chunksize=max(1, len(configs) // (4 * workers))):
                results.append(r)
                if progress:
                    progress(1)
    else:
        for c in configs:
            results.append(_star(c))
            if progress:
                progress(1)
    return _finish(results, len(configs), workers, len(batches))


def _finish(results: list, configs: int, workers: int, n_batches: int = 1) -> dict:
    """Speedups against plain decoding at the same largest batch (the first ``n_batches``
    results), results in the order of the configs. ``plain`` is the largest batch's."""
    plains = {r["max_batch"]: r for r in results[:n_batches]}
    rows = results[n_batches:]
    for r in rows:
        plain = plains[r["max_batch"]]
        r["speedup"] = r["throughput"] / plain["throughput"]
        r["decode_speedup"] = r["decode_throughput"] / plain["decode_throughput"]
    return {"plain": plains[max(plains)], "plains": list(plains.values()), "rows": rows,
            "configs": configs, "workers": workers}


def at_batch(swept: dict, max_batch: int) -> dict:
    """The sweep's rows at one largest batch, with that batch's plain decoding."""
    plain = next(p for p in swept["plains"] if p["max_batch"] == max_batch)
    return dict(swept, plain=plain, plains=[plain],
                rows=[r for r in swept["rows"] if r["max_batch"] == max_batch])


def summarise(swept: dict, analytical_by_group: dict | None = None) -> dict:
    """Optimum, runner-up, sensitivity, Vegas 3-step per policy, and the analytical
    prediction beside the simulated one with the gap decomposed."""
    rows = sorted(swept["rows"], key=lambda r: -r["throughput"])
    if not rows:
        raise TuningError("the sweep simulated no (policy, s, k) configuration: nothing to tune")
    best, runner = rows[0], (rows[1] if len(rows) > 1 else None)
    out = {"plain": swept["plain"], "best": best, "runner_up": runner, "policies": []}
    for policy in sorted({r["policy"] for r in rows}):
        pr = [r for r in rows if r["policy"] == policy]
        ks = sorted({r["k"] for r in pr})
        ss = sorted({r["s"] for r in pr})
        by = {(r["k"], r["s"]): r for r in pr}
        speed = np.array([[by[(k, s)]["speedup"] for s in ss] for k in ks])
        tokens = np.array([[by[(k, s)]["tokens_per_iteration"] for s in ss] for k in ks])
        k_star, s_star, best_speedup = analytical.best_k_s(speed, ks, ss)
        entry = {"policy": policy, "k_star": k_star, "s_star": s_star,
                 "speedup": best_speedup, "grid": {"k": ks, "s": ss, "speedup": speed.tolist()},
                 "sensitivity": _sensitivity(by, ks, ss, k_star, s_star)}
        if len(ss) >= 2:
            path = analytical.vegas_three_step(tokens, speed, ks, ss)
            entry["three_step"] = {"path": [list(p) for p in path.path], "k": path.k_step2,
                                   "s": path.s_step3, "speedup": path.speedup,
                                   "gap_to_joint": path.gap}
        if analytical_by_group:
            entry["analytical"] = _explain(by[(k_star, s_star)],
                                           analytical_by_group.get((policy, s_star)))
        out["policies"].append(entry)
    return out


def holdout_summary(tuned: dict, tested: dict) -> dict:
    """Per policy: (k*, s*) picked on the tuning part's simulations, the evaluation part's
    throughput there, and the optimism of picking on the evaluation part itself."""
    from specsim.predict import holdout_row
    rows = []
    eval_rows = {(r["policy"], r["s"], r["k"]): r for r in tested["rows"]}
    for policy in sorted({r["policy"] for r in tuned["rows"]}):
        pick = max((r for r in tuned["rows"] if r["policy"] == policy),
                   key=lambda r: r["throughput"])
        own = max((r for r in tested["rows"] if r["policy"] == policy),
                  key=lambda r: r["throughput"])
        there = eval_rows[(policy, pick["s"], pick["k"])]
        rows.append(holdout_row(policy, (pick["k"], pick["s"]), pick["speedup"],
                                there["speedup"], (own["k"], own["s"], own["speedup"])))
    rows.sort(key=lambda r: -r["speedup_on_evaluation_part"])
    return {"policies": rows, "best": rows[0]}


def _sensitivity(by, ks, ss, k_star, s_star) -> dict:
    """Relative throughput change one step away from the optimum in k and in s."""
    base = by[(k_star, s_star)]["throughput"]
    out = {}
    i, j = ks.index(k_star), ss.index(s_star)
    for label, key in (("k-1", (ks[i - 1], s_star) if i > 0 else None),
                       ("k+1", (ks[i + 1], s_star) if i + 1 < len(ks) else None),
                       ("s-", (k_star, ss[j - 1]) if j > 0 else None),
                       ("s+", (k_star, ss[j + 1]) if j + 1 < len(ss) else None)):
        if key is not None:
            out[label] = {"k": key[0], "s": key[1],
                          "change": by[key]["throughput"] / base - 1.0}
    return out


def _explain(sim: dict, analytical_at: dict | None) -> dict | None:
    """Split simulated/analytical into: batch occupancy and contexts (analytical re-evaluated
    at the simulation's mean batch), decode dynamics, and prefill + queueing."""
    if analytical_at is None:
        return None
    predicted = analytical_at["speedup"]
    at_batch = analytical_at.get("speedup_at_sim_batch", predicted)
    return {"analytical_speedup": predicted,
            "analytical_at_simulated_batch": at_batch,
            "simulated_decode_speedup": sim["decode_speedup"],
            "simulated_speedup": sim["speedup"],
            "factors": {"batch occupancy and contexts": at_batch / predicted,
                        "decode dynamics (ragged contexts, acceptance sampling, lockstep k)":
                            sim["decode_speedup"] / at_batch,
                        "prefill and queueing": sim["speedup"] / sim["decode_speedup"]}}
