"""`specsim calibrate`'s engine side: --merge and --replace combine two runs into one file,
--setting goes with a measurement, and a checkpoint made with other engine settings is not
resumed (one line naming the settings)."""
import json

import pytest
from click.testing import CliRunner

from specsim.cli.calibrate_cmd import calibrate_cmd
from specsim.costs.calibration_file import Calibration, Measurement, read_calibration
from specsim.errors import SpecsimError
from specsim.settings import EngineSettings, engine_provenance


def provenance(date: str, settings: EngineSettings = EngineSettings()) -> dict:
    return {"gpu": "NVIDIA H200", "gpu_memory_bytes": 1, "driver": "1", "cuda": "13.0",
            "torch": "2.11", "triton": "3.6", "kernel_config_hash": "abc",
            "model_spec_hash": "def", "model": "smollm2-135m", "date": date,
            "grid": {"batches": [1, 2], "contexts": [1024, 2048], "repeats": 3},
            "engine": engine_provenance(settings, draft_timed_as_chain_of=4, cache_align=128)}


def calibration(date: str, shapes, ops=("plain", "verify", "overhead:plain"),
                settings: EngineSettings = EngineSettings(), scale: float = 1.0) -> Calibration:
    rows = [Measurement(op, b, c, 1, None, [scale * (0.1 + c / 1e4)] * 3)
            for b, c in shapes for op in ops]
    return Calibration(provenance(date, settings), {"copy_bandwidth_Bps": 4e12}, rows)


def write(cal: Calibration, path) -> str:
    cal.write(str(path))
    return str(path)


def invoke(args):
    return CliRunner().invoke(calibrate_cmd, args)


def test_merge_fills_the_shapes_the_newer_run_lacks(tmp_path):
    new = write(calibration("2026-12-01T00:00:00Z", [(1, 1024)], scale=2.0), tmp_path / "n.json")
    old = write(calibration("2026-11-01T00:00:00Z", [(1, 1024), (2, 2048)]), tmp_path / "o.json")
    out = tmp_path / "out.json"
    done = invoke(["--merge", new, old, "--out", str(out), "--note", "budget cut"])
    assert done.exit_code == 0, done.output
    assert "added from" in done.output
    merged = read_calibration(str(out))
    rows = {(m.op, m.batch, m.context): m.median_ms for m in merged.measurements}
    assert rows[("plain", 1, 1024)] == pytest.approx(2 * (0.1 + 0.1024))     # NEW's own row
    assert ("plain", 2, 2048) in rows and ("verify", 2, 2048) in rows      # OLD fills in
    assert ("overhead:plain", 2, 2048) not in rows        # loop overheads from NEW alone
    record = merged.provenance["merged"][-1]
    assert record["note"] == "budget cut" and record["date"] == "2026-11-01T00:00:00Z"


def test_merge_never_writes_onto_one_of_its_inputs(tmp_path):
    """--out naming NEW or OLD (by path or through a link) is refused before any work, and
    both files stay as they were."""
    import os

    new = write(calibration("2026-12-01T00:00:00Z", [(1, 1024)], scale=2.0), tmp_path / "n.json")
    old = write(calibration("2026-11-01T00:00:00Z", [(1, 1024), (2, 2048)]), tmp_path / "o.json")
    link = tmp_path / "link.json"
    os.symlink(old, link)
    before = {p: open(p, "rb").read() for p in (new, old)}
    for out in (new, old, str(link)):
        done = invoke(["--merge", new, old, "--out", out, "--note", "n"])
        assert done.exit_code == 2 and "is an input of this command" in done.output
    assert {p: open(p, "rb").read() for p in (new, old)} == before


def test_replace_takes_the_newer_runs_families(tmp_path):
    base = write(calibration("2026-11-01T00:00:00Z", [(1, 1024), (2, 2048)]),
                 tmp_path / "base.json")
    loop = write(calibration("2026-12-01T00:00:00Z", [(1, 1024), (2, 2048)],
                             ops=("overhead:plain",), scale=3.0), tmp_path / "loop.json")
    out = tmp_path / "out.json"
    done = invoke(["--merge", loop, base, "--replace", "overhead", "--out", str(out), "--note",
                   "host code changed", "--json"])
    assert done.exit_code == 0, done.output
    info = json.loads(done.output)
    assert info["families"] == ["overhead"] and info["rows"] == 2
    merged = read_calibration(str(out))
    overhead = [m for m in merged.measurements if m.op == "overhead:plain"]
    assert len(overhead) == 2 and all(m.median_ms > 0.6 for m in overhead)
    assert len([m for m in merged.measurements if m.op == "plain"]) == 2


def test_replace_refuses_to_mix_two_engines(tmp_path):
    """A run with other engine settings may replace only every family those settings touch."""
    base = write(calibration("2026-11-01T00:00:00Z", [(1, 1024)]), tmp_path / "base.json")
    other = write(calibration("2026-12-01T00:00:00Z", [(1, 1024)], ops=("verify",),
                              settings=EngineSettings(c2q="rows")), tmp_path / "rows.json")
    done = invoke(["--merge", other, base, "--replace", "verify", "--out",
                   str(tmp_path / "x.json"), "--note", "why"])
    # a SpecsimError: ``specsim``'s entry point prints it as one line
    assert isinstance(done.exception, SpecsimError) and "c2q='rows'" in str(done.exception)
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("args,message", [
    (["--merge", "N", "O", "--out", "x.json"], "--note"),
    (["--check", "x.json", "--note", "n"], "go with --merge"),
    (["--gpu", "--check", "x.json"], "exactly one"),
    (["--check", "x.json", "--setting", "c2q=rows"], "--setting goes with --gpu"),
    (["--gpu", "--out", "x.json", "--setting", "c2q=both"], "c2q takes sum, rows"),
])
def test_usage_errors_are_one_line(tmp_path, args, message):
    for name in ("N", "O", "x.json"):
        write(calibration("2026-11-01T00:00:00Z", [(1, 1024)]), tmp_path / name)
    done = invoke([str(tmp_path / a) if a in ("N", "O", "x.json") else a for a in args])
    assert done.exit_code == 2 and message in done.output, done.output


def test_help_lists_the_engine_settings_and_the_merge():
    text = " ".join(CliRunner().invoke(calibrate_cmd, ["--help"]).output.split())
    for name in EngineSettings.choices():
        assert f"{name}=" in text
    assert "--merge NEW OLD" in text and "--replace FAMILIES" in text


def test_a_checkpoint_of_other_engine_settings_is_not_resumed(tmp_path):
    """Resuming is refused in one line that names the settings that differ; the file stays."""
    import specsim.calibrate as C

    path = str(tmp_path / "cal.json")
    shapes = [(1, 1024), (2, 2048)]

    def one(batch, context):
        return [Measurement("plain", batch, context, 1, None, [1.0, 1.0, 1.0])]

    rows = EngineSettings(c2q="rows", cuda_graphs=False)
    C.measure_shapes(shapes[:1], one, provenance("2026-11-29T00:00:00Z", rows), {},
                     checkpoint=path, progress=False)
    before = open(path).read()
    with pytest.raises(SpecsimError) as refused:
        C.measure_shapes(shapes, one, provenance("2026-11-29T00:00:00Z"), {},
                         checkpoint=path, progress=False)
    message = str(refused.value)
    assert "\n" not in message
    assert "engine settings c2q=rows there, sum here; cuda_graphs=false there, true here" \
        in message
    assert open(path).read() == before
    # the same settings resume it
    cal = C.measure_shapes(shapes, one, provenance("2026-11-29T00:00:00Z", rows), {},
                           checkpoint=path, progress=False)
    assert cal.provenance["complete"] and len(cal.measurements) == 2


def test_a_refused_resume_names_retired_settings_and_other_engine_records():
    """Where no setting differs, the reason names the retired setting that does (a file
    whose verify passes wrote with torch) or the engine record's keys that differ."""
    from specsim.calibrate import engine_difference

    now = provenance("2026-12-06T00:00:00Z")["engine"]
    older = {**now, "verify_append": "torch"}
    assert engine_difference(older, now) == \
        "engine settings verify_append=torch there, fused here"
    assert engine_difference({**now, "draft_timed_as_chain_of": 1}, now) == \
        "engine (draft_timed_as_chain_of)"
