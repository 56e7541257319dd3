"""benchmarks/bench_kernels.py and bench_prefill.py exercised on the CPU (``--dry-run``:
Triton's interpreter, tiny shapes, timings meaningless): every row each times on the GPU is
produced, and its own correctness check (against the torch references) passes."""
import json
import os
import subprocess
import sys

import pytest
import torch

from repo import REPO_ROOT


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real benchmark")
def test_bench_kernels_dry_run(tmp_path):
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_kernels.py"),
                           "--dry-run", "--head-dims", "128", "--q-lens", "1,16",
                           "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "bench_kernels.json").read_text())
    errors = results["errors hd128"]
    assert {"verify q=8 sum", "logits q=16 sum", "verify q=16 sep", "sparse"} <= set(errors)
    assert all(e < 1e-4 for e in errors.values()), errors       # fp32 in the interpreter
    shape = next(v for k, v in results.items() if k.startswith("hd128 "))
    timed = {"verify q=1", "verify q=16", "verify q=16 +c2q sum", "verify q=16 +all",
             "sparse s=.07 seq sorted", "select vegas sum",
             "select sparsespec (radix)"}
    assert timed <= set(shape)
    assert all("error" not in shape[name] for name in timed)
    assert "targets:" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real benchmark")
def test_bench_prefill_dry_run(tmp_path):
    """benchmarks/bench_prefill.py on the CPU: its correctness check of every path and peer
    against the definition passes, and every (shape, path, implementation) row is timed."""
    out = tmp_path / "bench_prefill.json"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_prefill.py"),
                           "--dry-run", "--repeats", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert len(results["checks"]) == 2 * 3 * 2              # engine and flex, every path
    assert all(c["max_abs_err"] < 1e-4 for c in results["checks"])
    timed = {(r["shape"], r["path"], r["impl"]) for r in results["rows"] if r["ms"]}
    # engine and flex on every path; SDPA's causal kernel where no window; building flex's
    # mask for a new prompt length on the window path
    assert len(timed) == 2 * (3 * 2 + 2 + 1)
