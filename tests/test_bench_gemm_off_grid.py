"""benchmarks/bench_gemm_off_grid.py: the catalogue's GEMM shapes off the operator table's grid
(the MoE routers and grouped expert GEMMs among them), and its report of the committed H200
measurements against the shipped table."""
import subprocess
import sys

from repo import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from bench_gemm_off_grid import catalogue_shapes  # noqa: E402

from specsim.costs.operator_file import read_operator_table  # noqa: E402


def test_the_catalogues_shapes_off_the_grid_are_found():
    table = read_operator_table(str(REPO_ROOT / "models" / "operators" / "h200.json"))
    gemms = catalogue_shapes(table)
    assert gemms[(32, 2880)] == ["gpt-oss-20b"] and gemms[(128, 2048)] == ["qwen3-30b-a3b"]
    assert (4096, 4096) not in gemms                    # on the grid
    assert set(gemms[(6144, 4096)]) == {"llama-3.1-8b", "qwen3-8b"}
    grouped = catalogue_shapes(table, "grouped_gemm")
    assert set(grouped) == {(2880, 2880), (5760, 2880), (1536, 2048), (2048, 768)}


def test_the_report_prices_every_measured_point():
    measured = REPO_ROOT / "tests" / "fixtures" / "gemm-off-grid-h200.json"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_gemm_off_grid.py"),
                           "--report", str(measured),
                           "--table", str(REPO_ROOT / "models" / "operators" / "h200.json")],
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    summaries = {line.split(":")[0]: line for line in lines if " points over " in line}
    gemm, grouped = summaries["gemm"], summaries["grouped_gemm"]
    assert gemm.startswith("gemm: 234 points over 39 shapes: MAPE")
    assert grouped.startswith("grouped_gemm: 48 points over 4 shapes: MAPE")
    # the dense GEMMs and the MoE expert GEMMs between measured widths, both read on log time
    assert float(gemm.split("MAPE ")[1].split("%")[0]) < 6.0
    assert float(grouped.split("MAPE ")[1].split("%")[0]) < 8.0
