"""A plan's configurations run on the GPU with the engine (the package doc's step 2)."""
from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np

from specsim.errors import SpecsimError
from specsim.validate.files import MEASURED_KEY
from specsim.validate.planning import Setup


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
