"""benchmarks/bench_selection.py on the CPU (``--dry-run``: Triton's interpreter, two layers,
a short context, timings meaningless): every policy's every ranking path runs, and each
path's lists are the reference's."""
import json
import os
import subprocess
import sys

import pytest
import torch

from repo import REPO_ROOT


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real benchmark")
def test_bench_selection_dry_run(tmp_path):
    out = tmp_path / "selection.json"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_selection.py"),
                           "--dry-run", "--models", "qwen3-8b", "--ss", "0.1", "--batch", "2",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["policy"] for r in rows] == ["vegas", "sparsespec", "quest"]
    assert [r["rows"] for r in rows] == [2 * 2, 2 * 2 * 8, 2 * 8]     # 2 layers, batch 2
    # rows as wide as the engine's cache for 600 + 64 positions: 768 tokens, 48 pages
    assert [r["items"] for r in rows] == [768, 768, 48]
    for row in rows:
        assert set(row["paths"]) == {"topk", "one program", "chunked", "best"}
        assert all(path["same_lists"] for path in row["paths"].values()), row
    assert rows[1]["mass_us"] > 0
    assert "| qwen3-8b | 600 | 0.1 | quest |" in done.stdout
