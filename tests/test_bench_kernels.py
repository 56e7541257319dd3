"""benchmarks/bench_kernels.py exercised on the CPU (``--dry-run``: Triton's interpreter, tiny
shapes, timings meaningless): every row it times on the GPU is produced, and its own
correctness check (the same kernels against the torch references) passes."""
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
