"""benchmarks/bench_traces.py at a tiny size: its generator writes valid, seeded traces of
the iterations asked for, and the program prints one table row per trace with every column
(timings themselves are not checked)."""
import importlib.util
import subprocess
import sys

import numpy as np

from repo import REPO_ROOT
from specsim.traces.format import read_trace

BENCH = REPO_ROOT / "benchmarks" / "bench_traces.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_traces", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generator_writes_the_iterations_asked_for_in_one_group(tmp_path):
    bench = _bench()
    path = tmp_path / "t.jsonl"
    size = bench.write_trace(str(path), 1003, 10, 12, True)
    assert size == path.stat().st_size
    trace = read_trace(path)
    assert sum(r.iterations for r in trace.requests) == 1003
    assert len(trace.requests) == 10 and len(trace.groups()) == 1
    for r in trace.requests:
        assert np.all(r.k == 12) and np.all(r.m <= 12)
        assert np.all(np.diff(r.context) == r.m[:-1] + 1)     # each iteration's tokens
        assert [e.size for e in r.entropy] == [12] * r.iterations
        assert len(r.accept_prob) == r.iterations
    again = tmp_path / "again.jsonl"
    bench.write_trace(str(again), 1003, 10, 12, True)
    assert again.read_bytes() == path.read_bytes()            # seeded


def test_plain_trace_has_no_per_draft_fields(tmp_path):
    path = tmp_path / "t.jsonl"
    _bench().write_trace(str(path), 50, 3, 8, False)
    assert all(r.entropy is None and r.accept_prob is None for r in read_trace(path).requests)


def test_program_prints_a_row_per_trace_against_its_targets():
    done = subprocess.run([sys.executable, str(BENCH), "--scale", "1e-5", "--costs",
                           "roofline"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].split() == ["trace", "size", "MB", "iterations", "seconds", "peak", "MiB",
                                "target", "s", "target", "MiB", "ok"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert list(rows) == ["startup", "plain", "one-request", "every-field"]
    assert len(rows["startup"]) == 5                          # no targets for the start
    for name, seconds, mib in (("plain", 5, 300), ("one-request", 5, 300),
                               ("every-field", 30, 600)):
        row = rows[name]
        assert int(row[2]) == 10                              # 1e-5 of 1M iterations
        assert float(row[3]) > 0 and float(row[4]) > 0
        assert (float(row[5]), float(row[6])) == (seconds, mib)
        assert row[7] in ("yes", "no")


def test_a_read_trace_keeps_at_most_64_bytes_an_iteration(tmp_path):
    """What simulate, tune and --holdout keep of a trace with every optional field, read
    without its per-draft fields (all but the entropy-adaptive k policy): context, k and m as
    one int64 each per iteration (24 bytes); with them, each draft's number costs 8 more."""
    from specsim.traces.importers import load_trace
    path = tmp_path / "t.jsonl"
    _bench().write_trace(str(path), 2000, 7, 8, True)

    def kept(trace):
        arrays = [a for r in trace.requests for a in (r.context, r.k, r.m)]
        arrays += [part for r in trace.requests for rows in (r.entropy, r.accept_prob)
                   if rows is not None for part in (rows.values, rows.offsets)]
        return sum(a.nbytes for a in arrays) / sum(r.iterations for r in trace.requests)

    assert kept(load_trace(str(path), per_draft=False)) <= 64
    # and one offset more per request
    assert kept(load_trace(str(path), per_draft=True)) == 24 + 2 * (8 * 8 + 8) + 2 * 8 * 7 / 2000
