"""Metrics of a simulation: throughput, latency percentiles, time split, waste, memory; as a
result object, a JSON-ready summary, a short table, and a Chrome trace (chrome://tracing)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from specsim.atomic import atomic_writer

PERCENTILES = (50, 90, 99)
SPLIT = ("draft", "verify", "selection", "other")


@dataclass
class StepLog:
    """One row per engine step (an iteration or a prefill), kept as Python lists while the
    simulation runs and turned into arrays once."""

    kind: list = field(default_factory=list)        # "iteration" | "prefill"
    start: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    split: list = field(default_factory=list)       # per component seconds (iterations)
    batch: list = field(default_factory=list)
    emitted: list = field(default_factory=list)
    drafted: list = field(default_factory=list)
    accepted: list = field(default_factory=list)
    k_batch: list = field(default_factory=list)
    extrapolated: list = field(default_factory=list)
    memory: list = field(default_factory=list)

    def iteration(self, start, seconds, split, batch, emitted, drafted, accepted, k_batch,
                  extrapolated, memory):
        self.kind.append("iteration")
        self.start.append(start)
        self.seconds.append(seconds)
        self.split.append(tuple(split[name] for name in SPLIT))
        self.batch.append(batch)
        self.emitted.append(emitted)
        self.drafted.append(drafted)
        self.accepted.append(accepted)
        self.k_batch.append(k_batch)
        self.extrapolated.append(extrapolated)
        self.memory.append(memory)

    def prefill(self, start, seconds, batch, memory):
        self.kind.append("prefill")
        self.start.append(start)
        self.seconds.append(seconds)
        self.split.append((0.0, 0.0, 0.0, 0.0))
        self.batch.append(batch)
        self.emitted.append(batch)
        self.drafted.append(0)
        self.accepted.append(0)
        self.k_batch.append(0)
        self.extrapolated.append(0)
        self.memory.append(memory)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {name: np.asarray(getattr(self, name)) for name in
               ("start", "seconds", "batch", "emitted", "drafted", "accepted", "k_batch",
                "extrapolated", "memory")}
        out["is_iteration"] = np.asarray([k == "iteration" for k in self.kind])
        out["split"] = np.asarray(self.split, dtype=float).reshape(-1, 4)
        return out


def _percentiles(x: np.ndarray) -> dict[str, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {f"p{p}": None for p in PERCENTILES} | {"mean": None}
    return {f"p{p}": float(np.percentile(x, p)) for p in PERCENTILES} | {"mean": float(x.mean())}


@dataclass
class SimResult:
    config: dict
    summary: dict
    steps: dict[str, np.ndarray]
    requests: dict[str, np.ndarray]

    @classmethod
    def build(cls, sim, req: dict, iterations: np.ndarray, log: StepLog) -> "SimResult":
        arrivals = sim.arrivals
        arrival = np.array([a.time for a in arrivals])
        output = np.array([a.output_tokens for a in arrivals])
        steps = log.arrays()
        it = steps["is_iteration"]
        end = float(np.nanmax(req["finish"]))
        makespan = end - float(arrival.min())
        decode_time = req["finish"] - req["first_token"]
        tpot = np.where(output > 1, decode_time / np.maximum(output - 1, 1), np.nan)
        seq_iterations = int(steps["batch"][it].sum())
        decode_tokens = int(steps["emitted"][it].sum())
        drafted = int(steps["drafted"][it].sum())
        accepted = int(steps["accepted"][it].sum())
        split = steps["split"][it].sum(0)
        prefill_s = float(steps["seconds"][~it].sum())
        busy = float(steps["seconds"].sum())
        summary = {
            "requests": len(arrivals), "output_tokens": int(output.sum()),
            "makespan_s": makespan,
            "throughput_tokens_per_s": float(output.sum()) / makespan,
            "iterations": int(it.sum()), "sequence_iterations": seq_iterations,
            "tokens_per_iteration": decode_tokens / max(seq_iterations, 1),
            "mean_batch": float(steps["batch"][it].mean()) if it.any() else 0.0,
            "time_split_s": {name: float(v) for name, v in zip(SPLIT, split)} |
                            {"prefill": prefill_s, "idle": max(0.0, makespan - busy)},
            "wasted_draft_fraction": (drafted - accepted) / drafted if drafted else 0.0,
            "extrapolated_iterations": int(steps["extrapolated"][it].sum()),
            "ttft_s": _percentiles(req["first_token"] - arrival),
            "tpot_s": _percentiles(tpot),
            "latency_s": _percentiles(req["finish"] - arrival),
            "queueing_s": _percentiles(req["admit"] - arrival),
            "memory_budget_bytes": sim.budget,
            "peak_memory_bytes": float(steps["memory"].max()) if steps["memory"].size else 0.0,
        }
        cfg = sim.cfg
        config = {"policy": cfg.policy, "s": cfg.s, "k": cfg.k, "k_policy": cfg.k_policy,
                  "max_batch": cfg.max_batch, "seed": cfg.seed, "acceptance": sim.source.kind,
                  "cost_model": sim.costs.name, "model": sim.model.name}
        requests = {"arrival": arrival, "admit": req["admit"], "first_token": req["first_token"],
                    "finish": req["finish"], "output_tokens": output, "iterations": iterations,
                    "prompt_tokens": np.array([a.prompt_tokens for a in arrivals])}
        return cls(config, summary, steps, requests)

    # ------------------------------------------------------------------------------------
    def memory_timeline(self, points: int = 500) -> dict[str, list[float]]:
        t, mem = self.steps["start"], self.steps["memory"]
        if t.size > points:
            pick = np.linspace(0, t.size - 1, points).astype(int)
            t, mem = t[pick], mem[pick]
        return {"time_s": t.tolist(), "bytes": mem.tolist()}

    def to_json(self) -> dict:
        return {"config": self.config, "summary": self.summary,
                "memory_timeline": self.memory_timeline()}

    def table(self) -> str:
        s = self.summary
        split = s["time_split_s"]
        total = sum(split.values()) or 1.0
        lines = [
            f"{s['requests']} requests, {s['output_tokens']} output tokens in "
            f"{s['makespan_s']:.2f} s: {s['throughput_tokens_per_s']:.0f} tokens/s",
            f"tokens per iteration {s['tokens_per_iteration']:.2f}, mean batch "
            f"{s['mean_batch']:.1f}, wasted drafts {s['wasted_draft_fraction'] * 100:.1f}%"
            + (f", {s['extrapolated_iterations']} extrapolated iterations"
               if s["extrapolated_iterations"] else ""),
            "time split: " + ", ".join(f"{k} {v / total * 100:.1f}%" for k, v in split.items()),
        ]
        for name in ("ttft_s", "tpot_s", "latency_s", "queueing_s"):
            p = s[name]
            if p["p50"] is None:
                continue
            unit, scale = ("ms", 1e3) if name == "tpot_s" else ("s", 1.0)
            lines.append(f"{name[:-2]:>9}: p50 {p['p50'] * scale:.3f} {unit}, p90 "
                         f"{p['p90'] * scale:.3f} {unit}, p99 {p['p99'] * scale:.3f} {unit}")
        lines.append(f"KV + draft memory: peak {s['peak_memory_bytes'] / 1e9:.1f} GB of "
                     f"{s['memory_budget_bytes'] / 1e9:.1f} GB budget")
        return "\n".join(lines)

    def chrome_trace_events(self, max_steps: int = 20000) -> list[dict]:
        """Chrome trace (Trace Event Format): engine steps split into draft / verify /
        selection / other on one track, requests as spans on their own tracks, and counters
        for batch size and memory. Times in microseconds."""
        st = self.steps
        events: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "engine"}},
            {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "requests"}}]
        for j in range(min(st["start"].size, max_steps)):
            t0 = st["start"][j] * 1e6
            if not st["is_iteration"][j]:
                events.append({"name": "prefill", "ph": "X", "pid": 1, "tid": 1, "ts": t0,
                               "dur": st["seconds"][j] * 1e6,
                               "args": {"prompts": int(st["batch"][j])}})
            else:
                for name, dur in zip(SPLIT, st["split"][j]):
                    if dur > 0:
                        events.append({"name": name, "ph": "X", "pid": 1, "tid": 1, "ts": t0,
                                       "dur": dur * 1e6,
                                       "args": {"batch": int(st["batch"][j]),
                                                "k": int(st["k_batch"][j]),
                                                "emitted": int(st["emitted"][j])}})
                        t0 += dur * 1e6
            events.append({"name": "batch", "ph": "C", "pid": 1, "ts": st["start"][j] * 1e6,
                           "args": {"sequences": int(st["batch"][j]),
                                    "memory_GB": st["memory"][j] / 1e9}})
        rq = self.requests
        for i in range(min(rq["arrival"].size, 2000)):
            events.append({"name": f"request {i}", "ph": "X", "pid": 2, "tid": i % 64 + 1,
                           "ts": rq["arrival"][i] * 1e6,
                           "dur": (rq["finish"][i] - rq["arrival"][i]) * 1e6,
                           "args": {"queued_s": float(rq["admit"][i] - rq["arrival"][i]),
                                    "output_tokens": int(rq["output_tokens"][i]),
                                    "iterations": int(rq["iterations"][i])}})
        return events

    def write_chrome_trace(self, path: str) -> None:
        write_json_atomic(path, {"traceEvents": self.chrome_trace_events(),
                                 "displayTimeUnit": "ms", "otherData": self.config})


def write_json_atomic(path: str, obj) -> None:
    with atomic_writer(path) as fh:
        json.dump(obj, fh)
