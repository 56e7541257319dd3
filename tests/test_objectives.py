"""Tune's objectives and SLOs: the parsers (hypothesis over good and bad text), the pick among
feasible settings, the closest setting when none is feasible, the Pareto front, and the
command's pick against a brute-force reading of its own rows."""
import json
import math

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.simulator.objectives import (LATENCY_METRICS, Objective, ObjectiveError, Slo,
                                          format_seconds, pareto_front, parse_duration,
                                          parse_objective, parse_slos, pick)

UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


@settings(max_examples=60, deadline=None)
@given(value=st.floats(min_value=1e-3, max_value=1e4, allow_nan=False),
       unit=st.sampled_from(sorted(UNITS)), space=st.sampled_from(["", " "]))
def test_a_duration_reads_as_its_value_in_its_unit(value, unit, space):
    text = f"{value!r}{space}{unit}"
    assert parse_duration(text) == pytest.approx(value * UNITS[unit])


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=12))
def test_any_other_duration_text_is_refused_in_one_line(text):
    try:
        seconds = parse_duration(text)
    except ObjectiveError as exc:
        assert "\n" not in str(exc) and "duration" in str(exc)
    else:
        assert seconds > 0 and math.isfinite(seconds)
        assert text.strip().endswith(("us", "µs", "ms", "s"))


@pytest.mark.parametrize("text", ["50", "ms", "-5ms", "0ms", "5 min", "1e999s"])
def test_bad_durations(text):
    with pytest.raises(ObjectiveError, match="duration"):
        parse_duration(text)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(LATENCY_METRICS)),
                       st.integers(min_value=1, max_value=10_000), min_size=1, max_size=4))
def test_slos_read_back_as_written(bounds):
    text = ",".join(f"{m}={ms}ms" for m, ms in bounds.items())
    got = parse_slos(text)
    assert {s.metric: s.limit_s for s in got} == pytest.approx(
        {m: ms / 1e3 for m, ms in bounds.items()})


@pytest.mark.parametrize("text, words", [
    ("tpot-p99", "METRIC=DURATION"), ("tpot-p98=5ms", "expected a metric"),
    ("throughput=5ms", "expected a metric"), ("tpot-p99=5ms,tpot-p99=6ms", "twice"),
    ("tpot-p99=fast", "duration")])
def test_bad_slos_are_refused_naming_what_is_wrong(text, words):
    with pytest.raises(ObjectiveError, match=words):
        parse_slos(text)


def test_objectives_are_the_listed_ones():
    assert parse_objective("TPOT-P99").name == "tpot-p99"
    assert parse_objective("throughput").maximise
    with pytest.raises(ObjectiveError, match="expected one of"):
        parse_objective("goodput")


def row(name, throughput, tpot, ttft=1.0, batch=8):
    return {"policy": name, "s": 0.05, "k": 2, "max_batch": batch, "throughput": throughput,
            "tpot_p99_s": tpot, "tpot_p50_s": None if tpot is None else tpot / 2,
            "ttft_p99_s": ttft}


ROWS = [row("a", 100, 0.010), row("b", 300, 0.030), row("c", 200, 0.020, ttft=5.0),
        row("d", 250, 0.040), row("e", 50, None)]


def test_the_pick_is_the_feasible_best_on_the_objective():
    got = pick(ROWS, Objective("throughput"), parse_slos("tpot-p99=25ms"))
    assert got["best"]["policy"] == "c" and got["runner_up"]["policy"] == "a"
    assert got["feasible"] == 2 and got["settings"] == 5 and got["closest"] is None
    got = pick(ROWS, Objective("tpot-p99"))
    assert got["best"]["policy"] == "a"      # a row without the metric never wins
    got = pick(ROWS, Objective("throughput"), parse_slos("tpot-p99=25ms,ttft-p99=2s"))
    assert got["best"]["policy"] == "a"


def test_no_feasible_setting_names_the_one_missing_the_bounds_by_least():
    got = pick(ROWS, Objective("throughput"), parse_slos("tpot-p99=8ms"))
    assert got["best"] is None and got["feasible"] == 0
    assert got["closest"]["policy"] == "a"   # 25% over, the others more


def test_the_front_holds_exactly_the_rows_no_other_beats_on_both():
    front = pareto_front(ROWS, "tpot_p99_s")
    usable = [r for r in ROWS if r["tpot_p99_s"] is not None]
    dominated = {r["policy"] for r in usable for o in usable
                 if o is not r and o["throughput"] >= r["throughput"]
                 and o["tpot_p99_s"] <= r["tpot_p99_s"]
                 and (o["throughput"], o["tpot_p99_s"]) != (r["throughput"], r["tpot_p99_s"])}
    assert [r["policy"] for r in front] == [r["policy"] for r in sorted(
        usable, key=lambda r: r["tpot_p99_s"]) if r["policy"] not in dominated]


def test_seconds_are_written_in_a_readable_unit():
    assert format_seconds(0.0123) == "12.3 ms"
    assert format_seconds(2.5) == "2.50 s"
    assert format_seconds(4e-5) == "40 us"
    assert format_seconds(None) == "-"


def test_slo_excess_is_relative_and_missing_values_never_meet_a_bound():
    slo = Slo("tpot-p99", 0.02)
    assert slo.excess(row("x", 1, 0.03)) == pytest.approx(0.5)
    assert slo.excess(row("x", 1, 0.01)) == 0.0
    assert slo.excess(row("x", 1, None)) == math.inf


def test_tune_picks_under_the_objective_and_slo_across_batches(tmp_path):
    """The command's pick is the best of its own rows on the objective among those meeting
    the SLO, over plain decoding and every (policy, s, k) at each batch size; it prints TPOT;
    an SLO nothing meets exits 3 naming the closest setting."""
    from specsim.cli.main import cli
    from test_simulator import _sweep_trace
    path = _sweep_trace(tmp_path)
    args = ["tune", "--trace", path, "--arrivals", "poisson:40:12", "--output-tokens", "40",
            "--k", "2,4", "--workers", "1", "--batches", "2,8", "--policies", "vegas"]
    r = CliRunner().invoke(cli, args + ["--objective", "tpot-p99", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{"):])
    picked = doc["objective"]
    from specsim.traces.importers import load_trace
    n_s = len([s for p, s in load_trace(path).groups() if p == "vegas"])
    assert picked["settings"] == 2 * (1 + 2 * n_s) == picked["feasible"]
    assert {r_["max_batch"] for r_ in picked["tradeoff"]} <= {2, 8}
    best = picked["best"]
    assert best["tpot_p99_s"] == min(r_["tpot_p99_s"] for r_ in picked["tradeoff"])
    assert doc["plain"]["max_batch"] == best["max_batch"]   # the grid is at the pick's batch
    r = CliRunner().invoke(cli, args + ["--objective", "tpot-p99"])
    assert r.exit_code == 0 and "objective: tpot-p99:" in r.output and "TPOT p99" in r.output
    limit = best["tpot_p99_s"] * 1e3 * 0.5
    r = CliRunner().invoke(cli, args + ["--slo", f"tpot-p99={limit:.6f}ms"])
    assert r.exit_code == 3, r.output
    assert "no setting of" in r.output and "the closest" in r.output
    r = CliRunner().invoke(cli, args + ["--slo", "tpot-p99=fast"])
    assert r.exit_code == 2 and "duration" in r.output


def test_the_tradeoff_figure_draws_every_setting_the_front_the_bound_and_the_pick():
    from specsim.dashboards.tuning import tradeoff_figure
    rows = [dict(r, max_batch=b) for r, b in zip(ROWS, (8, 8, 16, 16, 8))]
    fig = tradeoff_figure(rows, "tpot-p99", pick=rows[2], bound_s=0.025)
    by_name = {t.name: t for t in fig.data}
    points = sum(len(t.x) for t in fig.data if t.mode == "markers" and t.name != "the pick")
    assert points == 4                              # the row without a TPOT is left out
    front = by_name["no other setting beats these on both"]
    assert list(front.x) == [r["tpot_p99_s"] * 1e3 for r in pareto_front(rows, "tpot_p99_s")]
    assert list(by_name["the pick"].x) == [20.0]
    assert fig.layout.shapes[0].x0 == pytest.approx(25.0)   # the SLO's bound, in ms
    empty = tradeoff_figure([row("x", 1, None)], "tpot-p99")
    assert "no setting has a tpot-p99" in empty.layout.annotations[0].text


def test_tune_writes_the_tradeoff_page(tmp_path):
    from specsim.cli.main import cli
    from test_simulator import _sweep_trace
    path = _sweep_trace(tmp_path)
    page = tmp_path / "tune.html"
    r = CliRunner().invoke(cli, ["tune", "--trace", path, "--arrivals", "poisson:40:12",
                                 "--output-tokens", "40", "--k", "2", "--workers", "1",
                                 "--policies", "vegas", "--batches", "2,4",
                                 "--prefill-chunk", "256", "--dashboard", str(page)])
    assert r.exit_code == 0, r.output
    text = page.read_text()
    assert "specsim tune: throughput against latency" in text and "tpot-p99" in text
    assert f"trade-off page written to {page}" in r.output
