"""A calibration's held-out check: interior grid points predicted from the rest."""
import json

import pytest
from click.testing import CliRunner

from calibration_tables import (HW, MODEL, at_every_shape, synthetic, true_ms, with_overheads,
                                with_rows)
from specsim.cli.main import cli
from specsim.costs.calibration_file import Measurement, read_calibration
from specsim.costs.held_out import held_out_check
from specsim.errors import SpecsimError


def test_only_interior_points_are_held_out_and_every_row_is_used_once():
    cal = synthetic(noise=0.01, seed=3)
    report = held_out_check(cal, MODEL, HW)
    assert report["held_out"] + report["kept"] == len(cal.measurements)
    contexts = sorted({m.context for m in cal.measurements})
    for row in report["rows"]:
        assert contexts[0] < row["context"] < contexts[-1]      # interpolated, never beyond
    assert report["mape"] < 0.03
    assert report["worst"] == max(abs(r["error"]) for r in report["rows"])
    assert set(report["per_op"]) >= {"plain", "verify", "draft:vegas", "selection:vegas"}


def test_a_grid_too_small_to_hold_out_is_refused():
    with pytest.raises(SpecsimError, match="too small"):
        held_out_check(synthetic(contexts=(1024, 4096)), MODEL, HW)


def test_loop_overheads_are_scored_in_absolute_time():
    """Loop overheads are residuals near zero (a sample may be negative): their errors are
    absolute, outside the relative MAPE, and the plain step is scored alone."""
    cal = with_overheads(synthetic(noise=0.01, seed=2), noise=0.002)
    cal.measurements[-1] = Measurement("overhead:speculative", 1, 1024, 5, None, [-0.004, 0.01])
    report = held_out_check(cal, MODEL, HW)
    assert set(report["overheads"]) == {"overhead:plain", "overhead:speculative"}
    assert report["overheads"]["overhead:plain"]["mean_abs_error_ms"] < 0.01
    assert not any(op.startswith("overhead") for op in report["per_op"])
    assert report["per_op"]["plain"]["mape"] < 0.03


def test_quests_empty_refresh_is_scored_in_absolute_time():
    """Quest's refresh after a verify is empty (~10 µs: its selection runs in every draft
    step): an absolute error beside the overheads, not a relative one of a few µs."""
    base = synthetic()
    cal = with_rows(base, at_every_shape(base, "selection:quest", 1, 0.05,
                                         lambda b, c: 0.007 + 0.002 * (c == 4096)))
    report = held_out_check(cal, MODEL, HW)
    assert "selection:quest" not in report["per_op"]
    quest = report["overheads"]["selection:quest"]
    assert quest["points"] > 0 and quest["worst_abs_error_ms"] < 0.003


def test_each_op_of_its_own_is_scored_as_its_own_term():
    """A policy's own verify, a refresh by ranked rows, a per-policy overhead at two k: each
    is scored at its own q."""
    base = synthetic()
    rows = at_every_shape(base, "verify:quest", 5, None,
                          lambda b, c: true_ms("verify", b, c, 5) + 1.5)
    rows += at_every_shape(base, "selection:sparsespec", 9, 0.05, lambda b, c: 3.0 + 1e-5 * c)
    for k in (2, 8):
        rows += at_every_shape(base, "overhead:speculative:vegas", k + 1, None,
                               lambda b, c, k=k: 0.8 + 0.06 * k)
    report = held_out_check(with_rows(base, rows), MODEL, HW)
    assert report["per_op"]["verify:quest"]["mape"] < 0.02
    assert report["per_op"]["selection:sparsespec"]["mape"] < 0.05
    assert report["overheads"]["overhead:speculative:vegas"]["worst_abs_error_ms"] < 1e-3


def test_calibrate_check_command(tmp_path):
    path = tmp_path / "cal.json"
    synthetic(noise=0.01, seed=1).write(str(path))
    r = CliRunner().invoke(cli, ["calibrate", "--check", str(path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc == json.loads(json.dumps(held_out_check(read_calibration(str(path)), MODEL, HW)))
    r = CliRunner().invoke(cli, ["calibrate", "--check", str(path)])
    assert r.exit_code == 0 and f"{doc['mape'] * 100:.2f}%" in r.output
    r = CliRunner().invoke(cli, ["calibrate"])
    assert r.exit_code != 0 and "--gpu" in r.output
    (tmp_path / "bad.json").write_text("{}")
    r = CliRunner().invoke(cli, ["calibrate", "--check", str(tmp_path / "bad.json")])
    assert isinstance(r.exception, SpecsimError) and "bad.json" in str(r.exception)
