"""`specsim tune --ray`: the sweep on a local Ray instance (127.0.0.1) gives the rows and the
optimum of the local process pool, each row names its Ray worker, and without ray installed
`--ray` fails in one line naming the install command. One Ray instance serves the module."""
import importlib.util
import io
import json
import os
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest
from click.testing import CliRunner
from test_simulator import _sweep_trace

from specsim.cli.main import cli, main
from specsim.simulator.tuning import SweepSpec, summarise, sweep

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason='ray is not installed (pip install "specsim[ray]")')
POLICIES, KS = ["vegas", "quest"], [2, 4, 6]


#: The tests on the module's Ray instance run on one pytest-xdist worker, which starts it
#: once.
ON_THE_RAY = pytest.mark.xdist_group("local-ray")


@pytest.fixture(scope="module")
def local_ray():
    """One private Ray instance on 127.0.0.1 with 2 CPUs for the module, shut down after."""
    from specsim.simulator.ray_sweep import ray_session
    with ray_session("local", 2) as ray:
        yield ray


def _without_worker(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "worker"}


@ON_THE_RAY
@needs_ray
def test_ray_sweep_gives_the_local_pools_rows_and_optimum(tmp_path, local_ray):
    spec = SweepSpec(_sweep_trace(tmp_path), "qwen3-8b", "h200", 1, ("all", 40, None, 100), 32)
    pool = sweep(spec, POLICIES, KS, workers=2)
    ticks = []
    on_ray = sweep(spec, POLICIES, KS, workers=2, progress=ticks.append, ray_address="local")
    assert ticks == [1] * pool["configs"] == [1] * on_ray["configs"]
    assert [_without_worker(r) for r in on_ray["rows"]] == pool["rows"]
    assert _without_worker(on_ray["plain"]) == pool["plain"]
    assert summarise(on_ray)["best"] | {"worker": None} == summarise(pool)["best"] | {
        "worker": None}
    assert {n["NodeManagerAddress"] for n in local_ray.nodes()} == {"127.0.0.1"}
    node = local_ray.get_runtime_context().get_node_id()
    for row in on_ray["rows"] + [on_ray["plain"]]:
        assert row["worker"]["node"] == node and row["worker"]["pid"] != os.getpid()
    pids = {r["worker"]["pid"] for r in on_ray["rows"] + [on_ray["plain"]]}
    assert on_ray["ray"] == {"address": "local", "workers": len(pids), "nodes": 1}


@ON_THE_RAY
@needs_ray
def test_tune_ray_local_prints_the_same_best_setting(tmp_path, local_ray):
    path = _sweep_trace(tmp_path)
    args = ["tune", "--trace", path, "--arrivals", "all:20", "--output-tokens", "60",
            "--k", "2,4"]
    local = CliRunner().invoke(cli, args + ["--workers", "1"])
    on_ray = CliRunner().invoke(cli, args + ["--ray", "local"])
    assert local.exit_code == 0, local.output
    assert on_ray.exit_code == 0, on_ray.output

    def best(output):
        return [line for line in output.splitlines() if line.startswith(("optimum:",
                                                                        "runner-up:"))]
    assert len(best(local.output)) == 2 and best(on_ray.output) == best(local.output)
    assert "computed on " in on_ray.output and "Ray workers on 1 node (local)" in on_ray.output
    doc = json.loads((r := CliRunner().invoke(cli, args + ["--ray", "--json"])).output[
        r.output.index("{"):])
    assert doc["ray"]["nodes"] == 1 and doc["best"]["worker"]["pid"] > 0


def test_tune_ray_without_ray_is_one_line_naming_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)   # `import ray` raises ImportError
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["tune", "--trace", _sweep_trace(tmp_path), "--k", "2", "--ray"])
    assert code == 1 and out.getvalue() == ""
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and 'pip install "specsim[ray]"' in lines[0], lines
