"""benchmarks/bench_selection.py on the CPU (``--dry-run``: Triton's interpreter, two layers,
a short context, timings meaningless): every policy's every ranking path runs (Quest's
one-block path too), and each path's lists are the reference's."""
import json

import pytest
import torch

from repo import benchmark, run_main


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real benchmark")
def test_bench_selection_dry_run(tmp_path, monkeypatch, capsys):
    out = tmp_path / "selection.json"
    benchmark("bench_kernels", monkeypatch)            # its DRY_RUN, which the dry run sets
    done = run_main(benchmark("bench_selection", monkeypatch).main, capsys, "--dry-run",
                    "--models", "qwen3-8b", "--ss", "0.1", "--batch", "2", "--logit-std", 3,
                    "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["policy"] for r in rows] == ["vegas", "sparsespec", "quest"]
    assert [r["rows"] for r in rows] == [2 * 2, 2 * 2 * 8, 2 * 8]     # 2 layers, batch 2
    # rows as wide as the engine's cache for 600 + 64 positions: 768 tokens, 48 pages; the
    # sequences halfway through the room
    assert [r["items"] for r in rows] == [768, 768, 48]
    assert {r["length"] for r in rows} == {632}
    paths = {"topk", "one program", "chunked", "best"}
    for row in rows:   # Quest's rows also in registers, one block a row
        assert set(row["paths"]) == paths | ({"one block"} if row["policy"] == "quest"
                                             else set())
        assert all(path["same_lists"] for path in row["paths"].values()), row
    assert rows[1]["mass_us"] > 0 and rows[1]["logit_std"] == 3.0
    assert "| qwen3-8b | 600 | 0.1 | quest |" in done.stdout


@pytest.mark.parametrize("std", ["0", "-1", "nan"])
def test_a_spread_that_is_not_positive_is_refused_in_one_line(std, monkeypatch, capsys):
    done = run_main(benchmark("bench_selection", monkeypatch).main, capsys, "--dry-run",
                    "--logit-std", std)
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.strip().splitlines()[-1].endswith(f"--logit-std must be positive, "
                                                         f"got {float(std)}")
