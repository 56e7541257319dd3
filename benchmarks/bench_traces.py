"""Time and peak memory of `specsim predict` on large generated traces.

``plain``: 1,000,000 iterations of (context, k, m) in one (policy, s) group, 1000 requests;
``one-request``: the same in a single request (one line of 3,000,000 numbers);
``every-field``: about 200 MB, 1,000,000 iterations that also carry ``entropy`` and
``accept_prob`` per draft (k = 12). All are seeded, written into a temporary folder, and predicted by
``specsim predict --json`` in a child process, whose peak resident memory
(``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``) is read once it ends, one child per trace.

    python benchmarks/bench_traces.py              # every trace, the table against targets
    python benchmarks/bench_traces.py --scale 0.01 # 1% of the iterations (a quick look)
    python benchmarks/bench_traces.py --costs roofline  # predict without importing torch

The ``startup`` row is the same command on a trace of 100 iterations: the part of each peak
that is not the trace's.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

#: (name, iterations, requests, drafts per iteration, with per-draft fields,
#:  target seconds, target peak MiB) on a 2-core machine
TRACES = (
    ("plain", 1_000_000, 1000, 8, False, 5.0, 300.0),
    ("one-request", 1_000_000, 1, 8, False, 5.0, 300.0),
    ("every-field", 1_000_000, 1000, 12, True, 30.0, 600.0),
)
SEED = 2026


def write_trace(path: str, iterations: int, requests: int, k: int, per_draft: bool,
                seed: int = SEED) -> int:
    """Write a seeded specsim v1 trace of ``iterations`` split evenly over ``requests``
    requests (one group: vegas, s = 0.05), each drafting ``k`` per iteration; with
    ``per_draft``, every iteration also carries k entropies and k acceptance probabilities.
    Returns the file's size in bytes."""
    rng = np.random.default_rng(seed)
    header = {"specsim_trace": 1, "model": "smollm2-135m", "source": "benchmarks/bench_traces.py",
              "synthetic": True, "description": "generated for a time and memory benchmark",
              "created": "2026-12-02T00:00:00Z"}
    per_request = np.full(requests, iterations // requests)
    per_request[: iterations % requests] += 1
    with open(path, "w") as fh:
        fh.write(json.dumps(header) + "\n")
        for i, n in enumerate(per_request):
            n = int(n)
            m = np.minimum(rng.geometric(0.35, n) - 1, k)
            context = 4096 + int(rng.integers(0, 4096)) + np.concatenate(
                [[0], np.cumsum(m + 1)[:-1]])
            rec = {"type": "request", "id": f"r{i}", "policy": "vegas", "s": 0.05,
                   "context": context.tolist(), "k": [k] * n, "m": m.tolist(),
                   "prompt_id": f"p{i}"}
            if per_draft:
                rec["entropy"] = np.round(rng.gamma(2.0, 0.6, (n, k)), 5).tolist()
                rec["accept_prob"] = np.round(rng.uniform(0, 1, (n, k)), 5).tolist()
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
    return os.path.getsize(path)


def predict_child(path: str, costs: str = "auto") -> tuple[float, float, int]:
    """(seconds, peak MiB, exit status) of ``specsim predict --trace PATH --costs COSTS
    --json`` run as a child process (the only child alive, so the children's peak is its
    peak)."""
    code = ("import sys; from specsim.cli.main import main; "
            "sys.argv = ['specsim', 'predict', '--trace', sys.argv[1], '--costs', sys.argv[2], "
            "'--json']; main()")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, path, costs], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode:
        print(done.stderr.strip()[-2000:], file=sys.stderr)
    return seconds, peak_kib / 1024.0, done.returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of the iterations (and requests) to generate")
    parser.add_argument("--only", choices=[t[0] for t in TRACES], default=None)
    parser.add_argument("--costs", default="auto",
                        help="predict's --costs (auto: the shipped calibration, which imports "
                             "torch; roofline: none)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="specsim-bench-") as folder:
        # the same command on a trace of 100 iterations: what starting specsim costs
        path = os.path.join(folder, "startup.jsonl")
        size = write_trace(path, 100, 1, 8, False)
        rows.append(("startup", size, 100, *_isolated(path, args.costs), None, None))
        for name, iterations, requests, k, per_draft, t_target, mib_target in TRACES:
            if args.only and name != args.only:
                continue
            iterations = max(1, round(iterations * args.scale))
            requests = max(1, min(iterations, round(requests * args.scale)))
            path = os.path.join(folder, f"{name}.jsonl")
            size = write_trace(path, iterations, requests, k, per_draft)
            rows.append((name, size, iterations, *_isolated(path, args.costs), t_target,
                         mib_target))
            os.remove(path)
    print(table(rows))
    return 1 if any(row[5] for row in rows) else 0


def table(rows) -> str:
    """The rows (trace, bytes, iterations, seconds, peak MiB, exit status, target seconds,
    target MiB) as a text table; ``ok`` says whether both targets are met."""
    lines = [f"{'trace':<12} {'size MB':>8} {'iterations':>11} {'seconds':>8} {'peak MiB':>9} "
             f"{'target s':>9} {'target MiB':>11} {'ok':>3}"]
    for name, size, iterations, seconds, mib, rc, t_target, mib_target in rows:
        if t_target is None:
            targets, ok = f"{'':>9} {'':>11}", ""
        else:
            ok = "yes" if rc == 0 and seconds <= t_target and mib <= mib_target else "no"
            targets = f"{t_target:>9.0f} {mib_target:>11.0f}"
        lines.append(f"{name:<12} {size / 1e6:>8.1f} {iterations:>11} {seconds:>8.2f} "
                     f"{mib:>9.1f} {targets} {ok:>3}")
    return "\n".join(lines)


def _isolated(path: str, costs: str) -> tuple[float, float, int]:
    """:func:`predict_child` run from a fresh interpreter, so that an earlier child's peak
    never shows in this one's reading."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import bench_traces as b; "
            "print(json.dumps(b.predict_child(sys.argv[2], sys.argv[3])))")
    done = subprocess.run([sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__)),
                           path, costs], capture_output=True, text=True)
    if done.returncode:
        print(done.stderr.strip()[-2000:], file=sys.stderr)
        return float("nan"), float("nan"), done.returncode
    seconds, mib, rc = json.loads(done.stdout.strip().splitlines()[-1])
    return seconds, mib, rc


if __name__ == "__main__":
    sys.exit(main())
