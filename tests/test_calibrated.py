"""The calibrated cost model against synthetic tables of known structure; the file schema."""
import dataclasses
import json
import math
import os
import time

import numpy as np
import pytest

from specsim.costs.calibrated import (Calibration, CalibratedCostModel, Measurement, fit_terms,
                                      held_out_check, isotonic, merge_calibrations,
                                      read_calibration, replace_ops)
from specsim.errors import SpecsimError
from repo import REPO_ROOT
from specsim.specs import load_hardware, load_model

MODEL = load_model("llama-3.1-8b")
HW = load_hardware("h200")
KV = MODEL.kv_bytes_per_token            # all layers are full attention


def provenance(**over):
    return {"gpu": "NVIDIA H200", "gpu_memory_bytes": 150e9, "driver": "580", "cuda": "12.8",
            "torch": "2.11", "triton": "3.6", "kernel_config_hash": "abc",
            "model_spec_hash": MODEL.spec_hash(), "model": MODEL.name,
            "date": "2026-11-29T00:00:00Z", "engine": {"cache_align": 128}, **over}


def true_ms(op, batch, context, q=1, s=None):
    """Known structure: W(tokens) (a kink at 64 tokens) + K(bytes) (bandwidth 4 TB/s)."""
    tokens = batch * q
    w = 4.0 + 0.01 * tokens + (0.5 if tokens > 64 else 0.0)
    if op == "plain" or op == "verify":
        kv = batch * context * KV
        return w + kv / 4e12 * 1e3 * (1 + 0.02 * q)
    if op.startswith("draft"):
        sel = min(context, max(int(np.ceil(s * context)), 256) + 32)
        return w + batch * sel * KV / 2.5e12 * 1e3
    return 0.02 + batch * context * 1e-7     # selection


def synthetic(noise=0.0, seed=0, contexts=(1024, 2048, 4096, 8192, 16384, 32768, 65536),
              batches=(1, 2, 4, 8, 16, 32), qs=(1, 2, 3, 4, 6, 8, 12, 16)):
    rng = np.random.default_rng(seed)
    rows = []
    for b in batches:
        for c in contexts:
            def add(op, q=1, s=None):
                t = true_ms(op, b, c, q, s)
                rows.append(Measurement(op, b, c, q, s, list(t * (1 + noise * rng.standard_normal(5)))))
            add("plain")
            for q in qs:
                add("verify", q)
            add("draft:vegas", s=0.05)
            add("selection:vegas", s=0.05)
    return Calibration(provenance(), {"copy_bandwidth": 4.3e12}, rows)


def test_isotonic_pools_violators():
    assert isotonic([1, 3, 2, 4]).tolist() == [1, 2.5, 2.5, 4]
    assert isotonic([5, 4, 3], [1, 1, 2]).tolist() == pytest.approx([3.75] * 3)
    y = np.random.default_rng(0).normal(size=200).cumsum()
    assert np.all(np.diff(isotonic(y)) >= -1e-12)


def test_additive_fit_recovers_both_terms():
    tokens, kv, t = [], [], []
    for b in (1, 2, 4, 8, 16, 32, 64, 128):
        for c in (1e8, 5e8, 1e9, 5e9, 1e10):
            tokens.append(b)
            kv.append(b * c)
            t.append(0.001 + 2e-5 * b + b * c / 4e12)
    fit = fit_terms(tokens, kv, t)
    pred, inside = fit.predict(tokens, kv)
    assert inside.all()
    assert np.max(np.abs(pred / np.array(t) - 1)) < 0.02
    assert np.all(np.diff(fit.K.y) >= 0) and np.all(np.diff(fit.W.y) >= 0)
    assert fit.K(0.0) == 0.0


def test_interpolation_inside_the_grid_is_accurate_and_monotone():
    cm = CalibratedCostModel(synthetic(), MODEL, HW)
    for b, c in ((3, 3000), (12, 20000), (24, 50000)):
        got = cm.plain_step([c] * b)
        assert got.seconds * 1e3 == pytest.approx(true_ms("plain", b, c), rel=0.03)
        assert "calibrated" in got.notes[-1]
        got = cm.verify([c] * b, 8)
        assert got.seconds * 1e3 == pytest.approx(true_ms("verify", b, c, 8), rel=0.03)
        got = cm.draft_step([c] * b, 0.05, "vegas")
        assert got.seconds * 1e3 == pytest.approx(true_ms("draft:vegas", b, c, s=0.05), rel=0.03)
    times = [cm.plain_step([c] * 8).seconds for c in range(1024, 65536, 997)]
    assert np.all(np.diff(times) >= 0)                         # monotone in bytes


def test_verify_between_measured_q_stays_in_its_kernel_tile():
    """The verify kernel's configuration changes with its tile's row count (the KV head's
    group × q, to a power of two ≥ 16; Llama-3.1-8B: group 4, so q = 5–8 share a 32-row tile):
    here that tile costs 1 ms more, as the 32-row tile did on the H200. An unmeasured q is
    interpolated between measured q of its own tile, extrapolated from the tile's two nearest,
    held at the tile's only one, and only across tiles when its tile has none — and says
    which."""
    def truth(b, c, q):
        return true_ms("verify", b, c, q) + (1.0 if 16 < 4 * q <= 32 else 0.0)

    def model(qs):
        base = synthetic()
        rows = [m for m in base.measurements if m.op != "verify"] + [
            Measurement("verify", b, c, q, None, [truth(b, c, q)] * 3)
            for b in (1, 2, 4, 8, 16, 32) for c in (1024, 2048, 4096, 8192, 16384, 32768, 65536)
            for q in qs]
        return CalibratedCostModel(Calibration(base.provenance, base.ceilings, rows), MODEL, HW)

    ctx = [8192] * 8
    cm = model((1, 2, 3, 4, 6, 8, 12, 16))
    for q, how in ((7, "in its 32-row tile from measured q=6 and q=8"),
                   (5, "in its 32-row tile from measured q=6 and q=8"),     # extrapolated
                   (10, "in its 64-row tile from measured q=12 and q=16")):
        got = cm.verify(ctx, q)
        assert how in got.notes[-1], (q, got.notes)
        assert got.seconds * 1e3 == pytest.approx(truth(8, 8192, q), rel=0.01), q
    assert cm.verify(ctx, 8).notes[-1] == "calibrated (measured grid)"
    held = model((1, 2, 3, 4, 8, 12, 16)).verify(ctx, 6)
    assert "in its 32-row tile from measured q=8" in held.notes[-1]
    assert held.seconds * 1e3 == pytest.approx(truth(8, 8192, 8), rel=0.01)
    across = model((1, 2, 3, 4, 12, 16)).verify(ctx, 6)
    assert "between measured q=4 and q=12" in across.notes[-1]


def test_ragged_batches_use_their_exact_bytes():
    cm = CalibratedCostModel(synthetic(), MODEL, HW)
    ragged = cm.plain_step([2048, 30720])
    uniform = cm.plain_step([16384, 16384])
    # same tokens and same total KV bytes: the same time; a draft's budgets differ though
    assert ragged.seconds == pytest.approx(uniform.seconds)
    assert cm.draft_step([100, 32668], 0.05, "vegas").seconds != pytest.approx(
        cm.draft_step([16384, 16384], 0.05, "vegas").seconds)


def test_outside_the_grid_falls_back_and_says_so():
    cm = CalibratedCostModel(synthetic(), MODEL, HW)
    far = cm.plain_step([262144] * 32)
    assert "outside the measured grid" in far.notes[-1] and "fitted roofline" in far.notes[-1]
    truth = true_ms("plain", 32, 262144)
    assert far.seconds * 1e3 == pytest.approx(truth, rel=0.15)    # a sane line, not a cliff
    missing = cm.draft_step([4096] * 4, 0.05, "quest")
    assert "not calibrated: roofline model" in missing.notes[-1]


def test_held_out_check_on_noisy_tables():
    report = held_out_check(synthetic(noise=0.01, seed=3), MODEL, HW)
    assert report["held_out"] > 20
    assert report["mape"] < 0.03
    assert set(report["per_op"]) >= {"plain", "verify", "draft:vegas", "selection:vegas"}


def test_file_round_trip_and_rejections(tmp_path):
    path = tmp_path / "cal.json"
    cal = synthetic()
    cal.write(str(path))
    back = read_calibration(str(path))
    assert len(back.measurements) == len(cal.measurements)
    assert back.measurements[0].median_ms == pytest.approx(cal.measurements[0].median_ms, rel=1e-6)
    doc = json.loads(path.read_text())
    assert {"median_ms", "p10_ms", "p90_ms", "samples_ms"} <= set(doc["measurements"][0])
    text = path.read_text()
    (tmp_path / "trunc.json").write_text(text[: len(text) // 2])
    with pytest.raises(SpecsimError, match="truncated"):
        read_calibration(str(tmp_path / "trunc.json"))
    for mutate, message in (
            (lambda d: d.pop("provenance"), "missing provenance"),
            (lambda d: d["provenance"].pop("triton"), "provenance lacks triton"),
            (lambda d: d.update(measurements=[]), "no measurements"),
            (lambda d: d["measurements"][0].update(samples_ms=[-1.0]), "positive"),
            (lambda d: d["measurements"][0].update(op="prefill"), "unknown op"),
            (lambda d: d["measurements"][0].update(op="draft"), "needs a policy"),
            (lambda d: d.update(specsim_calibration=7), "expected")):
        d = json.loads(text)
        mutate(d)
        (tmp_path / "bad.json").write_text(json.dumps(d))
        with pytest.raises(SpecsimError, match=message):
            read_calibration(str(tmp_path / "bad.json"))


def test_calibration_from_another_model_is_flagged():
    cal = synthetic()
    cal.provenance["model_spec_hash"] = "0000"
    cm = CalibratedCostModel(cal, MODEL, HW)
    assert any("measured on model" in w for w in cm.warnings)
    assert not CalibratedCostModel(synthetic(), MODEL, HW).warnings


def test_calibration_from_an_older_engine_is_flagged():
    """Files measured before session 6's engine (no padded caches in the provenance: the
    Llama-3.1-8B and Qwen3-4B files shipped until session 9) say their speculative costs are
    not the validated ones, wherever they are used (predict's cost note carries it); the
    files shipped now are all current."""
    from specsim.costs import make_cost_model
    from specsim.specs import load_model

    old = synthetic()
    del old.provenance["engine"]
    (warning,) = CalibratedCostModel(old, MODEL, HW).warnings
    assert "older engine" in warning and "overheads run high" in warning
    for name in SHIPPED:
        _, note = make_cost_model(load_model(name), HW, 1, "auto")
        assert note.startswith("calibrated") and "older engine" not in note, name


SHIPPED = ("llama-3.1-8b", "qwen3-4b", "qwen3-8b", "smollm2-135m")


@pytest.mark.skipif(bool({"SPECSIM_FUSED_APPEND", "SPECSIM_RANKING", "SPECSIM_VERIFY_SPLITS",
                          "SPECSIM_C2Q"} & set(os.environ)),
                    reason="engine settings overridden in the environment")
def test_shipped_calibrations_time_the_engine_defaults():
    """Every shipped H200 file was measured with the engine's default one-position append and
    ranking: flipping a default without re-measuring them would price every prediction on a
    path the engine no longer runs. Predict's cost note names the settings."""
    from specsim.costs import engine_summary, make_cost_model
    from specsim.engine.decode import CACHE_ALIGN, FUSED_APPEND
    from specsim.kernels.selection import RANKING
    from specsim.engine.selection import C2Q
    from specsim.kernels.verify_attention import VERIFY_SPLITS
    for name in SHIPPED:
        cal = read_calibration(str(REPO_ROOT / "models" / "calibrations" / "h200"
                                   / f"{name}.json"))
        engine = cal.provenance["engine"]
        assert (engine.get("fused_append", False), engine.get("ranking", "topk"),
                engine.get("cache_align"), engine.get("verify_splits", "sm"),
                engine.get("c2q", "rows")) == \
            (FUSED_APPEND, RANKING, CACHE_ALIGN, VERIFY_SPLITS, C2Q), name
        _, note = make_cost_model(load_model(name), HW, 1, "auto")   # and predict says so
        assert "fused cache append, best ranking, whole-wave chunks" in note, note
    old = synthetic()
    del old.provenance["engine"]
    assert engine_summary(old) == \
        "torch cache writes, topk ranking, chunks per multiprocessor"   # files before them
    old.provenance["engine"] = {"c2q": "sum"}
    assert engine_summary(old).endswith("summed Collect-2-Query")
    # the roofline beneath the fits prices Vegas' refresh as the file's engine ran it
    assert CalibratedCostModel(old, MODEL, HW).roofline.c2q == "sum"
    del old.provenance["engine"]
    assert CalibratedCostModel(old, MODEL, HW).roofline.c2q == "rows"


def test_calibrate_check_command(tmp_path):
    from click.testing import CliRunner

    from specsim.cli.main import cli
    path = tmp_path / "cal.json"
    synthetic(noise=0.01, seed=1).write(str(path))
    r = CliRunner().invoke(cli, ["calibrate", "--check", str(path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["mape"] < 0.03 and doc["held_out"] > 0 and "verify" in doc["per_op"]
    r = CliRunner().invoke(cli, ["calibrate", "--check", str(path)])
    assert r.exit_code == 0 and "MAPE" in r.output and "worst" in r.output
    r = CliRunner().invoke(cli, ["calibrate"])
    assert r.exit_code != 0 and "exactly one of --gpu" in r.output
    r = CliRunner().invoke(cli, ["calibrate", "--gpu", "--out", str(tmp_path / "x.json"),
                                 "--only", "overheads"])
    assert r.exit_code == 2 and "expected some of plain, verify" in r.output


def test_shipped_calibration_is_used_by_default(tmp_path, monkeypatch):
    import shutil

    from click.testing import CliRunner

    from specsim.cli.main import cli
    from specsim.costs import make_cost_model
    from repo import REPO_ROOT
    catalog = tmp_path / "models"
    shutil.copytree(REPO_ROOT / "models" / "hardware", catalog / "hardware")
    shutil.copytree(REPO_ROOT / "models" / "llama-3.1-8b", catalog / "llama-3.1-8b")
    monkeypatch.setenv("SPECSIM_MODELS", str(catalog))
    model, hw = load_model("llama-3.1-8b"), load_hardware("h200")
    cm, note = make_cost_model(model, hw)
    assert cm.name == "roofline" and "no calibration shipped" in note
    with pytest.raises(SpecsimError, match="no shipped calibration"):
        make_cost_model(model, hw, costs="calibrated")
    (catalog / "calibrations" / "h200").mkdir(parents=True)
    shipped = catalog / "calibrations" / "h200" / "llama-3.1-8b.json"
    synthetic().write(str(shipped))                      # measures vegas only
    cm, note = make_cost_model(model, hw)
    assert cm.name == "roofline" and "does not cover" in note and "sparsespec" in note
    assert make_cost_model(model, hw, costs="calibrated")[0].name == "calibrated"
    full = synthetic()
    for m in list(full.measurements):
        if m.op == "draft:vegas":
            for p in ("sparsespec", "streamingllm", "quest", "last-token"):
                full.measurements.append(Measurement(f"draft:{p}", m.batch, m.context, 1, m.s,
                                                     m.samples_ms))
    full.write(str(shipped))
    cm, note = make_cost_model(model, hw)
    assert cm.name == "calibrated" and "calibrations/h200/llama-3.1-8b.json" in note
    assert make_cost_model(model, hw, tp=2)[0].name == "roofline"       # measured on one GPU
    assert make_cost_model(model, load_hardware("a100-80gb"))[0].name == "roofline"
    assert make_cost_model(model, hw, costs="roofline")[0].name == "roofline"
    r = CliRunner().invoke(cli, ["predict", "--model", "llama-3.1-8b", "--bootstrap", "50",
                                 "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["cost_model"] == "calibrated" and doc["costs"].startswith("calibrated")
    with pytest.raises(SpecsimError, match="--costs must be"):
        make_cost_model(model, hw, costs="nonsense")
    # the repository's own shipped files are named relative to it (reports get committed)
    monkeypatch.delenv("SPECSIM_MODELS")
    note = make_cost_model(load_model("qwen3-8b"), hw)[1]
    assert "(models/calibrations/h200/qwen3-8b.json;" in note, note


def with_overheads(cal, plain_us=lambda b: 40 + 2 * b, spec_us=lambda b: 90 + 5 * b, noise=0.0):
    """Add measured loop overheads (µs, by batch; one sample slightly negative-capable)."""
    rng = np.random.default_rng(7)
    rows = list(cal.measurements)
    for b in sorted({m.batch for m in rows}):
        for c in sorted({m.context for m in rows}):
            rows.append(Measurement("overhead:plain", b, c, 1, None,
                                    list(plain_us(b) / 1e3 + noise * rng.standard_normal(3))))
            rows.append(Measurement("overhead:speculative", b, c, 5, None,
                                    list(spec_us(b) / 1e3 + noise * rng.standard_normal(3))))
    return Calibration(cal.provenance, cal.ceilings, rows)


def wall_timer(before_each=None):
    """A CPU stand-in for ``calibrate._time``: each call timed by the wall clock (after
    ``before_each()``, which may record the state the call starts from)."""
    def timer(torch_, fn, repeats, warmup, after=None):
        out = []
        for i in range(warmup + repeats):
            if before_each:
                before_each()
            start = time.perf_counter()
            fn()
            if i >= warmup:
                out.append(time.perf_counter() - start)
            if after:
                after()
        return out
    return timer


def assert_op_rejected(path, index: int, op: str):
    """Measurement ``index`` of the calibration file ``path`` renamed to an unknown ``op``: the
    file is refused, naming it."""
    doc = json.loads(path.read_text())
    doc["measurements"][index]["op"] = op
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecsimError, match="nonsense"):
        read_calibration(str(path))


def test_measured_loop_overheads_enter_plain_steps_and_iterations():
    bare, cal = CalibratedCostModel(synthetic(), MODEL, HW), CalibratedCostModel(
        with_overheads(synthetic()), MODEL, HW)
    ctx = [8192] * 4
    assert cal.plain_step(ctx).seconds - bare.plain_step(ctx).seconds == pytest.approx(48e-6,
                                                                                     rel=1e-3)
    assert "overhead:plain measured" in cal.plain_step(ctx).notes[-1]
    it, it0 = cal.iteration(ctx, 6, 0.05, "vegas"), bare.iteration(ctx, 6, 0.05, "vegas")
    assert it.overhead_s == pytest.approx(110e-6, rel=1e-3)
    assert it0.overhead_s == HW.overheads.iteration          # roofline's constant without one
    assert it.seconds - it0.seconds == pytest.approx(110e-6 - HW.overheads.iteration, rel=1e-3)
    # a residual that comes out negative is clipped at zero, never makes a step cheaper
    neg = CalibratedCostModel(with_overheads(synthetic(), plain_us=lambda b: -30.0), MODEL, HW)
    assert neg.plain_step(ctx).seconds == pytest.approx(bare.plain_step(ctx).seconds)


def test_loop_overhead_measured_at_two_draft_lengths_is_linear_in_k():
    """overhead:speculative:vegas measured at k = 2 and 8 (q = 3, 9): iterations pay the line
    through them at every k — between, at, and beyond (k = 15: extrapolated, noted); a file
    with one k keeps a constant; the held-out check scores each k at its own k."""
    cal = synthetic()
    rows = list(cal.measurements)
    line = lambda k: 0.8 + 0.06 * k                       # ms: the host's work grows with k
    for b in sorted({m.batch for m in rows}):
        for c in sorted({m.context for m in rows}):
            for k in (2, 8):
                rows.append(Measurement("overhead:speculative:vegas", b, c, k + 1, None,
                                        [line(k)] * 3))
    two = CalibratedCostModel(Calibration(cal.provenance, cal.ceilings, rows), MODEL, HW)
    ctx = [8192] * 4
    for k in (2, 5, 8, 15):
        it = two.iteration(ctx, k, 0.05, "vegas")
        assert it.overhead_s * 1e3 == pytest.approx(line(k), rel=1e-3), k
    assert "interpolated" in two._overhead("overhead:speculative:vegas", np.asarray(ctx), 5)[1]
    assert "extrapolated from k=2, 8" in two._overhead("overhead:speculative:vegas",
                                                       np.asarray(ctx), 15)[1]
    one = CalibratedCostModel(Calibration(cal.provenance, cal.ceilings, [
        r for r in rows if not (r.op.startswith("overhead") and r.q == 9)]), MODEL, HW)
    for k in (2, 15):
        assert one.iteration(ctx, k, 0.05, "vegas").overhead_s * 1e3 == pytest.approx(line(2))
    report = held_out_check(Calibration(cal.provenance, cal.ceilings, rows), MODEL, HW)
    assert report["overheads"]["overhead:speculative:vegas"]["worst_abs_error_ms"] < 1e-3


def test_per_policy_loop_overhead_wins_over_the_generic_one(tmp_path):
    """Quest's rollback refreshes page bounds: its measured overhead is its own; a policy
    without one falls back to the policy-agnostic overhead of older files."""
    cal = with_overheads(synthetic())
    rows = list(cal.measurements)
    for b in sorted({m.batch for m in rows}):
        for c in sorted({m.context for m in rows}):
            rows.append(Measurement("overhead:speculative:quest", b, c, 5, None, [0.5] * 3))
    model = CalibratedCostModel(Calibration(cal.provenance, cal.ceilings, rows), MODEL, HW)
    ctx = [8192] * 4
    assert model.iteration(ctx, 6, 0.05, "quest").overhead_s == pytest.approx(0.5e-3, rel=1e-3)
    assert model.iteration(ctx, 6, 0.05, "vegas").overhead_s == pytest.approx(110e-6, rel=1e-3)
    path = tmp_path / "cal.json"
    Calibration(cal.provenance, cal.ceilings, rows).write(str(path))
    assert read_calibration(str(path)).measurements[-1].op == "overhead:speculative:quest"
    assert_op_rejected(path, -1, "overhead:speculative:nonsense")


def test_merging_a_cut_short_run_with_an_older_one():
    """The newer run measured batch 1 and 2 only (its time budget ran out); the older run's
    step timings fill in the other batches, its overheads are not taken, and the provenance
    says which rows came from where."""
    old = with_overheads(synthetic(noise=0.01, seed=3))
    new = with_overheads(synthetic(noise=0.01, seed=4, batches=(1, 2)),
                         spec_us=lambda b: 50 + 5 * b)
    for cal in (old, new):    # runs without engine settings: each case below sets its own
        del cal.provenance["engine"]
    merged = merge_calibrations(new, old, "older run, same kernels")
    new_rows = {(m.op, m.batch, m.context, m.q) for m in new.measurements}
    assert merged.measurements[:len(new.measurements)] == new.measurements
    extra = merged.measurements[len(new.measurements):]
    assert {m.batch for m in extra} == {4, 8, 16, 32}
    assert not any(m.op.startswith("overhead") for m in extra)
    assert not {(m.op, m.batch, m.context, m.q) for m in extra} & new_rows
    info = merged.provenance["merged"][-1]
    assert info["rows"] == len(extra) and [4, 1024] in info["shapes"]
    assert info["note"] == "older run, same kernels" and "overhead:plain" not in info["ops"]
    # the merged grid prices batch 16 from measurements, not the fitted-roofline fallback
    fitted = CalibratedCostModel(merged, MODEL, HW)
    cost = fitted.verify([8192] * 16, 8)
    assert cost.seconds * 1e3 == pytest.approx(true_ms("verify", 16, 8192, 8, None), rel=0.05)
    assert not any("outside" in n for n in cost.notes)
    assert any(m.op.startswith("draft:") for m in extra) and info["draft_steps"] == "taken"
    other = Calibration(dict(old.provenance, gpu="NVIDIA H100"), old.ceilings, old.measurements)
    with pytest.raises(SpecsimError, match="different gpu"):
        merge_calibrations(new, other, "x")
    # drafts timed one step at a time there, as chains of 4 here: not mixed
    chained = Calibration(dict(new.provenance, engine={"draft_timed_as_chain_of": 4}),
                          new.ceilings, new.measurements)
    merged = merge_calibrations(chained, old, "older run, single-step drafts")
    extra = merged.measurements[len(new.measurements):]
    assert extra and not any(m.op.startswith("draft:") for m in extra)
    assert any(m.op == "verify" for m in extra)
    assert merged.provenance["merged"][-1]["draft_steps"].startswith("skipped")
    # caches padded to 128 positions here, not there: Quest's steps (its page count) not mixed
    aligned = Calibration(dict(new.provenance, engine={"cache_align": 128}),
                          new.ceilings, new.measurements)
    quest_old = Calibration(old.provenance, old.ceilings, old.measurements + [
        Measurement(op, 16, 1024, q, s, [1.0]) for op, q, s in
        (("draft:quest", 1, 0.1), ("verify:quest", 5, None), ("selection:quest", 1, 0.1))])
    merged = merge_calibrations(aligned, quest_old, "older run, unpadded caches")
    extra = merged.measurements[len(new.measurements):]
    assert any(m.op == "draft:vegas" for m in extra)
    assert not any(m.op.endswith(":quest") for m in extra)
    assert merged.provenance["merged"][-1]["quest_steps"].startswith("skipped")
    merged = merge_calibrations(new, quest_old, "both unpadded")
    assert sum(m.op.endswith(":quest") for m in merged.measurements) == 3
    # one-position writes fused here, not there: its plain and draft steps are not taken
    fused = Calibration(dict(new.provenance, engine={"fused_append": True}), new.ceilings,
                        new.measurements)
    merged = merge_calibrations(fused, old, "torch writes there")
    extra = merged.measurements[len(new.measurements):]
    assert extra and not any(m.op == "plain" or m.op.startswith("draft:") for m in extra)
    assert any(m.op == "verify" for m in extra)
    info = merged.provenance["merged"][-1]
    assert info["plain_steps"].startswith("skipped: fused append") and \
        info["draft_steps"].startswith("skipped: fused append")
    # lists ranked another way here (SPECSIM_RANKING=best: radix for SparseSpec-L and Quest):
    # those policies' refreshes and Quest's draft steps are not taken, Vegas' are
    ranked_old = Calibration(old.provenance, old.ceilings, quest_old.measurements + [
        Measurement("selection:sparsespec", 16, 1024, 1, 0.1, [1.0]),
        Measurement("selection:vegas", 16, 1024, 1, 0.1, [1.0])])
    best = Calibration(dict(new.provenance, engine={"ranking": "best"}), new.ceilings,
                       new.measurements)
    merged = merge_calibrations(best, ranked_old, "topk there")
    taken = {m.op for m in merged.measurements[len(new.measurements):]}
    assert {"selection:vegas", "verify:quest"} <= taken
    assert not taken & {"selection:sparsespec", "selection:quest", "draft:quest"}
    assert merged.provenance["merged"][-1]["ops_skipped"]["draft:quest"] == \
        "ranked by topk there, radix here"
    # an op measured at other q here (a series that means something else), or excluded by
    # name (its code changed between the runs), is not taken
    by_rows = Calibration(new.provenance, new.ceilings, new.measurements + [
        Measurement("selection:quest", 1, 1024, 3, 0.1, [1.0])])
    merged = merge_calibrations(by_rows, quest_old, "q differs")
    assert not any(m.op == "selection:quest" and m.batch == 16 for m in merged.measurements)
    assert any(m.op == "draft:quest" and m.batch == 16 for m in merged.measurements)
    assert "measured at q [1] there, [3] here" in \
        merged.provenance["merged"][-1]["ops_skipped"]["selection:quest"]
    merged = merge_calibrations(new, quest_old, "gather", exclude_ops=("draft:quest",))
    assert not any(m.op == "draft:quest" and m.batch == 16 for m in merged.measurements)
    assert merged.provenance["merged"][-1]["ops_skipped"] == {"draft:quest": "excluded"}


def test_replacing_the_loop_overheads_of_a_shipped_calibration(tmp_path):
    """Overheads re-measured alone (a change to the loop's host code) go into a full file:
    its overhead rows are the new run's, every other row stays, the provenance says so, and
    the model prices the new overheads; a run without such rows, or of another GPU, is
    refused."""
    full = with_overheads(synthetic(noise=0.01, seed=3), spec_us=lambda b: 400 + 10 * b)
    again = with_overheads(synthetic(noise=0.01, seed=5, batches=(1, 4, 32)),
                           spec_us=lambda b: 100 + 2 * b)
    only = Calibration(dict(again.provenance, date="2026-12-01T00:00:00Z"), again.ceilings,
                       [m for m in again.measurements if m.op.startswith("overhead")])
    out = replace_ops(full, only, ["overhead"], "host loop without the forced-m sync")
    steps = [m for m in full.measurements if not m.op.startswith("overhead")]
    assert [m for m in out.measurements if not m.op.startswith("overhead")] == steps
    assert [m for m in out.measurements if m.op.startswith("overhead")] == only.measurements
    info = out.provenance["replaced"][-1]
    assert info["families"] == ["overhead"] and info["rows"] == len(only.measurements)
    assert info["date"] == "2026-12-01T00:00:00Z" and info["replaced_rows"] == \
        len(full.measurements) - len(steps)
    ctx = [4096] * 4
    before = CalibratedCostModel(full, MODEL, HW).iteration(ctx, 4, 0.05, "vegas").overhead_s
    after = CalibratedCostModel(out, MODEL, HW).iteration(ctx, 4, 0.05, "vegas").overhead_s
    assert after < 0.5 * before
    path = tmp_path / "out.json"
    out.write(str(path))
    assert read_calibration(str(path)).provenance["replaced"][-1]["note"].startswith("host")
    # one op by name: the other rows of its family stay
    one = replace_ops(full, only, ["overhead:speculative"], "one op")
    assert [m for m in one.measurements if m.op == "overhead:speculative"] == \
        [m for m in only.measurements if m.op == "overhead:speculative"]
    assert [m for m in one.measurements if m.op == "overhead:plain"] == \
        [m for m in full.measurements if m.op == "overhead:plain"]
    # a budget-cut re-measurement: with keep_other_shapes the shapes it missed keep their rows
    part = Calibration(only.provenance, only.ceilings,
                       [m for m in only.measurements if m.batch == 1])
    cut = replace_ops(full, part, ["overhead"], "batch 1 only")
    assert {m.batch for m in cut.measurements if m.op.startswith("overhead")} == {1}
    kept = replace_ops(full, part, ["overhead"], "batch 1 only", keep_other_shapes=True)
    over = lambda cal, b: [m for m in cal.measurements  # noqa: E731
                           if m.op.startswith("overhead") and m.batch == b]
    assert over(kept, 1) == over(part, 1) and over(kept, 4) == over(full, 4) != []
    assert kept.provenance["replaced"][-1]["kept_other_shapes"] is True
    with pytest.raises(SpecsimError, match="no overhead rows"):
        replace_ops(full, Calibration(only.provenance, only.ceilings, steps), ["overhead"], "x")
    with pytest.raises(SpecsimError, match="different gpu"):
        replace_ops(full, Calibration(dict(only.provenance, gpu="NVIDIA H100"), only.ceilings,
                                      only.measurements), ["overhead"], "x")


def test_replacing_every_family_an_engine_setting_touches_takes_the_setting():
    """Round D: plain, draft, selection and overhead rows re-measured with the fused append
    and the best ranking replace a file's own; its provenance then says the engine ran that
    way (a later merge or resume reads it). Replacing only part of what a setting touches,
    or keeping old rows at other shapes, would mix two engines in one file: refused."""
    full = with_overheads(synthetic(noise=0.01, seed=3))
    old_engine = {"cache_align": 128, "ranking": "topk"}
    base = Calibration(dict(full.provenance, engine=old_engine), full.ceilings,
                       full.measurements)
    new_engine = dict(old_engine, ranking="best", fused_append=True)
    again = synthetic(noise=0.01, seed=5)
    new = Calibration(dict(again.provenance, engine=new_engine), again.ceilings,
                      [m for m in again.measurements if not m.op.startswith("verify")])
    families = sorted({m.op.split(":")[0] for m in new.measurements})
    out = replace_ops(base, new, families, "round D")
    assert out.provenance["engine"] == new_engine
    assert base.provenance["engine"] == old_engine          # the input is left alone
    assert [m for m in out.measurements if m.op.startswith("verify")] == \
        [m for m in base.measurements if m.op.startswith("verify")]
    with pytest.raises(SpecsimError, match="fused_append=True.*not replacing draft"):
        replace_ops(base, new, ["plain"], "plain only")
    with pytest.raises(SpecsimError, match="ranking='best'.*not replacing draft"):
        replace_ops(base, Calibration(dict(new.provenance, engine=dict(old_engine,
                                                                       ranking="best")),
                                      new.ceilings, new.measurements), ["selection"], "x")
    with pytest.raises(SpecsimError, match="keeping the old rows at other shapes"):
        replace_ops(base, new, families, "x", keep_other_shapes=True)
    # the same settings: nothing to carry over, the file's own provenance stays
    same = Calibration(dict(new.provenance, engine=old_engine), new.ceilings, new.measurements)
    assert replace_ops(base, same, ["plain"], "x").provenance["engine"] == old_engine
    # whole-wave chunks change both full-attention families: plain and verify go together
    waves = Calibration(dict(again.provenance, engine=dict(old_engine, verify_splits="waves")),
                        again.ceilings, again.measurements)
    with pytest.raises(SpecsimError, match="verify_splits='waves'.*not replacing plain"):
        replace_ops(base, waves, ["verify"], "verify only")
    assert replace_ops(base, waves, ["plain", "verify"], "x").provenance["engine"][
        "verify_splits"] == "waves"
    # the summed Collect-2-Query changes the verify passes and Vegas' refresh alone: the
    # other policies' refresh rows (measured at other contexts, say) stay
    spec_rows = [Measurement("selection:sparsespec", 4, 3072, 3, 0.05, [0.2])]
    base = Calibration(base.provenance, base.ceilings, base.measurements + spec_rows)
    summed = Calibration(dict(again.provenance, engine=dict(old_engine, c2q="sum")),
                         again.ceilings, again.measurements)
    with pytest.raises(SpecsimError, match="c2q='sum'.*not replacing selection:vegas"):
        replace_ops(base, summed, ["verify"], "verify only")
    out = replace_ops(base, summed, ["verify", "selection:vegas"], "x")
    assert out.provenance["engine"]["c2q"] == "sum"
    assert [m for m in out.measurements if m.op == "selection:sparsespec"] == spec_rows
    assert [m for m in out.measurements if m.op == "selection:vegas"] == \
        [m for m in summed.measurements if m.op == "selection:vegas"]
    assert replace_ops(base, summed, ["verify", "selection"], "x").provenance["engine"][
        "c2q"] == "sum"                         # a whole family covers its ops


def test_overheads_in_files_and_the_held_out_check(tmp_path):
    cal = with_overheads(synthetic(noise=0.01, seed=2), noise=0.002)
    cal.measurements[-1] = Measurement("overhead:speculative", 1, 1024, 5, None, [-0.004, 0.01])
    path = tmp_path / "cal.json"
    cal.write(str(path))
    back = read_calibration(str(path))          # negative residual samples are allowed
    assert sum(m.op.startswith("overhead") for m in back.measurements) == sum(
        m.op.startswith("overhead") for m in cal.measurements)
    report = held_out_check(back, MODEL, HW)
    assert set(report["overheads"]) == {"overhead:plain", "overhead:speculative"}
    assert report["overheads"]["overhead:plain"]["mean_abs_error_ms"] < 0.01
    assert "overhead:plain" not in report["per_op"]        # not in the relative MAPE
    assert report["per_op"]["plain"]["mape"] < 0.03        # the step alone, not + overhead
    d = json.loads(path.read_text())
    d["measurements"][-1]["op"] = "overhead:draft"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(SpecsimError, match="unknown op 'overhead:draft'"):
        read_calibration(str(tmp_path / "bad.json"))


def test_sparsities_between_the_measured_ones_are_interpolated():
    """Drafts measured at s = 0.03 and 0.1 only: s = 0.05 is interpolated between the two
    measured grids in the positions it selects (the known structure is linear in selected
    bytes, so it is recovered where the 256-position floor makes it non-linear in s, at 3000),
    and a selection at s = 0.05 is interpolated linearly in s between its two fits; both
    say so."""
    rows = []
    for b in (1, 2, 4, 8, 16):
        for c in (1024, 2048, 4096, 8192, 16384, 32768, 65536):
            rows.append(Measurement("plain", b, c, 1, None, [true_ms("plain", b, c)] * 3))
            for s in (0.03, 0.1):
                rows.append(Measurement("draft:vegas", b, c, 1, s,
                                        [true_ms("draft:vegas", b, c, 1, s)] * 3))
                rows.append(Measurement("selection:vegas", b, c, 1, s, [0.1 + 3 * s] * 3))
    cm = CalibratedCostModel(Calibration(provenance(), {}, rows), MODEL, HW)
    for c in (3000, 20000, 50000):
        got = cm.draft_step([c] * 4, 0.05, "vegas")
        assert got.seconds * 1e3 == pytest.approx(true_ms("draft:vegas", 4, c, 1, 0.05),
                                                  rel=0.002)
        assert "interpolated between measured s=0.03 and s=0.1 (measured grid)" in got.notes[-1]
    sel = cm.selection([20000] * 4, 0.05, "vegas", 4)
    assert sel.seconds * 1e3 == pytest.approx(0.1 + 3 * 0.05, rel=1e-6)
    assert "interpolated between measured s=0.03 and s=0.1" in sel.notes[-1]


def test_quest_drafts_are_priced_on_page_metadata_plus_selected_bytes():
    """A Quest draft step reads every page's min/max key (bytes ∝ the context, whatever s) and
    then the selected tokens (∝ s): with both in the known structure, drafts measured at
    s = 0.03 and 0.1 predict s = 0.05 and the measured points themselves."""
    from specsim.policies import get_policy
    pol = get_policy("quest")
    per = MODEL.kv_bytes_per_token_layer() * MODEL.num_layers

    def quest_ms(b, c, s):
        tokens = b * (pol.selected(c, s) + math.ceil(c / pol.page_size))
        return 2.0 + 0.01 * b + tokens * per / 3e12 * 1e3

    rows = []
    for b in (1, 4, 16):
        for c in (4096, 16384, 32768, 65536, 131072):
            rows.append(Measurement("plain", b, c, 1, None, [true_ms("plain", b, c)] * 3))
            for s in (0.03, 0.1):
                rows.append(Measurement("draft:quest", b, c, 1, s, [quest_ms(b, c, s)] * 3))
    cm = CalibratedCostModel(Calibration(provenance(), {}, rows), MODEL, HW)
    for b, c, s in ((4, 32768, 0.1), (4, 32768, 0.03), (4, 50000, 0.05), (16, 20000, 0.07)):
        got = cm.draft_step([c] * b, s, "quest").seconds * 1e3
        assert got == pytest.approx(quest_ms(b, c, s), rel=0.03), (b, c, s)


def test_calibration_measures_shapes_coarse_to_fine():
    """A time budget may end the run after any shape: every prefix of the order should span
    the grid (both ends of both axes first), not finish one batch size before the next."""
    from specsim.calibrate import shape_order
    batches, contexts = [1, 4, 16], [4096, 16384, 32768, 65536, 131072]
    order = shape_order(batches, contexts)
    assert sorted(order) == sorted((b, c) for b in batches for c in contexts)
    assert set(order[:4]) == {(1, 4096), (1, 131072), (16, 4096), (16, 131072)}
    first = order[:len(order) // 2]
    assert {b for b, _ in first} == set(batches)
    assert {c for _, c in first} >= {4096, 32768, 131072}
    assert shape_order([8], [1024]) == [(8, 1024)]


def test_policy_measurement_on_the_cpu_engine(monkeypatch):
    """The GPU harness's per-policy block, run eagerly on the CPU engine with a wall-clock
    timer in place of CUDA events: every op it records, drafts timed as a chain per step, the
    cache and the selection lists left as they were after every timed call."""
    import torch

    import specsim.calibrate as C
    from specsim.engine import Engine, build_model

    calls = []

    wall_time = wall_timer(lambda: calls.append((
        engine_ref[0].cache.lengths.clone(),
        None if engine_ref[0].selection.counts is None
        else engine_ref[0].selection.counts.clone())))

    engine_ref = []
    real_engine = Engine

    def recording_engine(*a, **kw):
        engine_ref[:] = [real_engine(*a, **kw)]
        return engine_ref[0]

    monkeypatch.setattr(C, "_time", wall_time)
    monkeypatch.setattr(C, "OVERHEAD_STEPS", 3)
    tiny = dict(model_type="qwen3", vocab_size=128, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=128, max_position_embeddings=4096, rope_theta=10000.0,
                tie_word_embeddings=False)
    model = build_model(tiny, weights="random", dtype=torch.float32, device="cpu")
    grid = C.CalibrationGrid(batches=[2], contexts=[600], qs=[1, 3, 6], sparsities=[0.1],
                             policies=["vegas", "quest", "sparsespec"], repeats=2, warmup=1)
    prompts = [[0] * 600] * 2
    room = 6 * (C.OVERHEAD_STEPS + 2) + 8
    rows = []
    for policy in grid.policies:
        rows += C._measure_policy(torch, recording_engine, model, grid, 2, 600, prompts, room,
                                  policy, 0.1)
        engine = engine_ref[0]
        # the draft chain and its undo leave lengths and lists as the refresh made them
        lengths = engine.cache.lengths.clone()
        with torch.inference_mode():
            engine.draft_chain(4)
        assert torch.equal(engine.cache.lengths, lengths)
    # Quest first in the grid: the shared verify still comes from a page-free engine
    quest_first = C.CalibrationGrid(batches=[2], contexts=[600], qs=[1, 3, 6],
                                    sparsities=[0.1], policies=["quest", "vegas"], repeats=1,
                                    warmup=0)
    got = C._measure_policy(torch, recording_engine, model, quest_first, 2, 600, prompts, room,
                            "quest", 0.1)
    assert not any(m.op == "verify" for m in got) and any(m.op == "verify:quest" for m in got)
    ops = {(m.op, m.q, m.s) for m in rows}
    assert ops == {("verify", 1, None), ("verify", 3, None), ("verify", 6, None),
                   ("draft:vegas", 1, 0.1), ("selection:vegas", 1, 0.1),
                   ("overhead:speculative:vegas", 3, None),     # k = 2 and 8 (> k_max 5)
                   ("overhead:speculative:vegas", 6, None),
                   ("draft:quest", 1, 0.1), ("selection:quest", 1, 0.1),
                   ("verify:quest", C.OVERHEAD_K + 1, None),
                   ("overhead:speculative:quest", 3, None),
                   ("overhead:speculative:quest", 6, None),
                   # SparseSpec-L: its refresh at 3, 9 and 16 ranked rows; its own verify (all
                   # rows collected) at q = 3 and 9, 13, 16 cut to the grid's largest, 6
                   ("draft:sparsespec", 1, 0.1), ("selection:sparsespec", 3, 0.1),
                   ("selection:sparsespec", 9, 0.1), ("selection:sparsespec", 16, 0.1),
                   ("verify:sparsespec", 3, None), ("verify:sparsespec", 6, None),
                   ("overhead:speculative:sparsespec", 3, None),
                   ("overhead:speculative:sparsespec", 6, None)}
    assert all(len(m.samples_ms) == 2 and m.median_ms > 0 for m in rows
               if not m.op.startswith("overhead"))
    # every timed call started from the same cache lengths and list counts
    firsts = {(tuple(l.tolist()), None if c is None else tuple(c.flatten().tolist()))
              for l, c in calls}
    assert len({l for l, _ in firsts}) == 1
    counts = {c for _, c in firsts if c is not None}
    # one state per list layout: Vegas' per-sequence lists, SparseSpec-L's per-KV-head ones
    assert len(counts) == len({len(c) for c in counts}) == 2


def test_a_policys_own_verify_adds_its_measured_difference(tmp_path):
    """Quest's verify (page bounds updated on every K write) measured at q = 5, 1.5 ms above
    the shared verify: Quest's iterations pay it at every k, other policies do not; the
    held-out check scores it as its own term; an unknown policy in the op is rejected."""
    cal = synthetic()
    rows = list(cal.measurements)
    for b in sorted({m.batch for m in rows}):
        for c in sorted({m.context for m in rows}):
            t = true_ms("verify", b, c, 5) + 1.5
            rows.append(Measurement("verify:quest", b, c, 5, None, [t] * 3))
            rows.append(Measurement("draft:quest", b, c, 1, 0.05,
                                    [true_ms("draft", b, c, 1, 0.05)] * 3))
    both = Calibration(cal.provenance, cal.ceilings, rows)
    model, bare = CalibratedCostModel(both, MODEL, HW), CalibratedCostModel(cal, MODEL, HW)
    ctx = [8192] * 4
    for k in (2, 7, 15):
        quest = model.iteration(ctx, k, 0.05, "quest").verify.seconds
        shared = bare.verify(ctx, k + 1).seconds
        assert quest - shared == pytest.approx(1.5e-3, rel=0.05), k
        assert model.iteration(ctx, k, 0.05, "vegas").verify.seconds == pytest.approx(shared)
    assert "verify:quest measured" in model.iteration(ctx, 4, 0.05, "quest").verify.notes[-1]
    report = held_out_check(both, MODEL, HW)
    assert report["per_op"]["verify:quest"]["mape"] < 0.02
    path = tmp_path / "cal.json"
    both.write(str(path))
    assert any(m.op == "verify:quest" for m in read_calibration(str(path)).measurements)
    assert_op_rejected(path, -2, "verify:nonsense")


def test_selection_and_quest_pages_are_priced_on_the_longest_sequence():
    """Every refresh ranks each slot's buffer to the length it was sized for (the longest
    sequence: SparseSpec-L's too, whose attention-mass kernel skips past each length but whose
    top-K does not — measured on SmolLM2's ragged batch), and Quest scores the pages of that
    whole buffer: in a ragged batch a short sequence costs as much as the longest there. Every
    draft step is priced on its measured grid at the longest sequence too (its split plan is
    sized for the longest list); its selected bytes (the fit outside the grid) and the loop
    overheads stay per sequence."""
    cal = synthetic()
    rows = list(cal.measurements) + [
        Measurement("draft:quest", b, c, 1, 0.05, [true_ms("draft", b, c, 1, 0.05)] * 3)
        for b in (1, 2, 4, 8, 16, 32) for c in (1024, 2048, 4096, 8192, 16384, 32768, 65536)]
    model = CalibratedCostModel(Calibration(cal.provenance, cal.ceilings, rows), MODEL, HW)
    ragged, longest = [2048, 16384, 4096, 16384], [16384] * 4
    assert model.selection(ragged, 0.05, "vegas", 4).seconds == pytest.approx(
        model.selection(longest, 0.05, "vegas", 4).seconds)
    assert model._op_bytes("selection:sparsespec", np.array(ragged), 0.05) == model._op_bytes(
        "selection:sparsespec", np.array(longest), 0.05)
    assert model._op_bytes("overhead:speculative:vegas", np.array(ragged), None) < \
        model._op_bytes("overhead:speculative:vegas", np.array(longest), None)
    from specsim.policies import get_policy
    per, layers = MODEL.kv_bytes_per_token_layer(), MODEL.num_layers
    quest = get_policy("quest")
    pages = model._op_bytes("draft:quest", np.array(ragged), 0.05) / (per * layers) \
        - quest.selected_array(np.array(ragged), 0.05).sum()
    assert pages == pytest.approx(4 * 16384 / quest.page_size)       # not Σ ceil(L_b / 16)
    # Quest's draft (page scoring over the buffer, not a bandwidth-bound read of its rows) and
    # Vegas' are priced on their measured grids, at the longest sequence
    quest_step = model.draft_step(ragged, 0.05, "quest")
    assert quest_step.seconds == pytest.approx(model.draft_step(longest, 0.05, "quest").seconds)
    assert quest_step.seconds * 1e3 == pytest.approx(true_ms("draft", 4, 16384, 1, 0.05))
    assert quest_step.notes[-1] == "calibrated (measured grid)"
    vegas_step = model.draft_step(ragged, 0.05, "vegas")
    assert vegas_step.notes[-1] == "calibrated (measured grid)"
    assert vegas_step.seconds == pytest.approx(model.draft_step(longest, 0.05, "vegas").seconds)
    assert vegas_step.seconds * 1e3 == pytest.approx(true_ms("draft", 4, 16384, 1, 0.05))
    # past the grid's longest context the fit prices it, in each sequence's own bytes
    beyond = model.draft_step([2048, 100000], 0.05, "vegas")
    assert beyond.notes[-1] == "calibrated"
    assert beyond.seconds < model.draft_step([100000] * 2, 0.05, "vegas").seconds
    # the selected part is per sequence: a ragged batch reads less than four longest ones
    assert model._op_bytes("draft:vegas", np.array(ragged), 0.05) < model._op_bytes(
        "draft:vegas", np.array(longest), 0.05)


def test_loop_overhead_is_timed_by_the_loops_own_clock(monkeypatch):
    """The speculative-loop overhead is what the loop's iterations spend beyond their priced
    steps: a call's fixed costs outside the loop (here building the traces is made to take
    0.3 s) must not be spread over its iterations (0.1 s each over 3), as wall time did."""
    import torch

    import specsim.calibrate as C
    from specsim.engine import Engine, build_model
    from specsim.engine import decode

    tiny = dict(model_type="llama", vocab_size=128, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                max_position_embeddings=4096, tie_word_embeddings=True)
    model = build_model(tiny, weights="random", dtype=torch.float32, device="cpu")
    monkeypatch.setattr(C, "OVERHEAD_STEPS", 3)
    slow = decode._Run.traces

    def slow_traces(self, *a, **kw):
        time.sleep(0.3)
        return slow(self, *a, **kw)

    monkeypatch.setattr(decode._Run, "traces", slow_traces)
    prompts = [[0] * 200] * 2
    with torch.inference_mode():
        engine = Engine(model, batch=2, max_len=400, policy="vegas", s=0.2, k_max=5)
        engine.prefill(prompts, "random")
        got = C._loop_overhead(torch, engine, prompts, speculative=True, k=2, repeats=1)
    assert len(got) == 1 and got[0] < 0.03


def _prov(**over):
    prov = {"gpu": "NVIDIA H200", "gpu_memory_bytes": 1, "driver": "1", "cuda": "13.0",
            "torch": "2.11", "triton": "3.6", "kernel_config_hash": "abc",
            "model_spec_hash": "def", "model": "smollm2-135m", "date": "2026-11-29T00:00:00Z",
            "grid": {"batches": [1, 2], "contexts": [1024, 2048], "repeats": 3,
                     "shapes_skipped_for_memory": 0},
            "engine": {"cache_align": 128}}
    prov.update(over)
    return prov


def test_calibration_checkpoints_every_shape_and_resumes(tmp_path):
    """A run cut short after two shapes leaves them in its file; the same run again measures
    only the other two, and the file says it is complete; a file made with other settings is
    refused (not overwritten), and so is a truncated one."""
    import specsim.calibrate as C

    shapes = C.shape_order([1, 2], [1024, 2048])
    path = str(tmp_path / "cal.json")
    calls = []

    def one(batch, context):
        if len(calls) == 2 and not resumed:
            raise KeyboardInterrupt          # the call's time limit, mid-shape
        calls.append((batch, context))
        return [Measurement("plain", batch, context, 1, None, [batch + context / 1e3] * 3)]

    resumed = False
    with pytest.raises(KeyboardInterrupt):
        C.measure_shapes(shapes, one, _prov(), {"copy_bandwidth_Bps": 1.0}, checkpoint=path,
                         progress=False)
    kept = read_calibration(path)
    assert {(m.batch, m.context) for m in kept.measurements} == set(shapes[:2])
    assert kept.provenance["complete"] is False and kept.provenance["shapes_left"] == 2
    resumed = True
    cal = C.measure_shapes(shapes, one, _prov(date="2026-11-30T00:00:00Z"),
                           {"copy_bandwidth_Bps": 1.0}, checkpoint=path, progress=False)
    assert calls == shapes                               # each shape measured exactly once
    back = read_calibration(path)
    assert back.provenance["complete"] is True and back.provenance["shapes_left"] == 0
    assert back.provenance["resumed"] == ["2026-11-29T00:00:00Z"]
    assert sorted((m.batch, m.context) for m in back.measurements) == sorted(shapes)
    assert len(cal.measurements) == 4
    # a finished file: nothing left to do
    C.measure_shapes(shapes, one, _prov(), {}, checkpoint=path, progress=False)
    assert calls == shapes
    # other settings: refused with the reason, file untouched
    before = open(path).read()
    for other, reason in ((_prov(torch="2.12"), "torch"),
                          (_prov(grid={"batches": [1], "contexts": [1024], "repeats": 3}),
                           "grid"),
                          (_prov(engine={"cache_align": None}), "engine")):
        with pytest.raises(SpecsimError, match=f"other settings.*{reason}"):
            C.measure_shapes(shapes, one, other, {}, checkpoint=path, progress=False)
    assert open(path).read() == before
    (tmp_path / "cut.json").write_text(before[: len(before) // 2])
    with pytest.raises(SpecsimError, match="cut.json"):
        C.measure_shapes(shapes, one, _prov(), {}, checkpoint=str(tmp_path / "cut.json"),
                         progress=False)


def test_measure_shapes_time_budget_says_what_is_left():
    import specsim.calibrate as C

    shapes = C.shape_order([1, 2], [1024, 2048])

    def one(batch, context):
        time.sleep(0.05)
        return [Measurement("plain", batch, context, 1, None, [1.0] * 3)]

    cal = C.measure_shapes(shapes, one, _prov(), {}, time_budget_s=0.01, progress=False)
    assert len(cal.measurements) == 1
    assert cal.provenance["complete"] is False and cal.provenance["shapes_left"] == 3


def test_overheads_are_measured_at_three_contexts():
    import specsim.calibrate as C

    grid = C.CalibrationGrid(contexts=[4096, 16384, 32768, 65536, 131072])
    assert grid.overhead_contexts() == [4096, 32768, 131072]
    assert grid.overheads_at(32768) and not grid.overheads_at(16384)
    assert C.CalibrationGrid(contexts=[600]).overhead_contexts() == [600]
    assert C.CalibrationGrid(contexts=[1024, 2048], overheads=False).overhead_contexts() == []


def test_all_row_collectors_verify_and_sparsespec_refresh_depend_on_k():
    """last-token's verify measured on its own engine at q = 3, 9, 13 (+0.1, +0.3, +2.0 ms
    over the shared verify): linear between, held beyond; SparseSpec-L's refresh measured at 3
    and 16 ranked rows: min(k + 1, 16) rows, linear between; files with one figure keep it."""
    cal = synthetic()
    rows = list(cal.measurements)
    extra = {3: 0.1, 9: 0.3, 13: 2.0}
    refresh = {3: 3.0, 16: 5.6}
    for b in sorted({m.batch for m in rows}):
        for c in sorted({m.context for m in rows}):
            for q, e in extra.items():
                t = true_ms("verify", b, c, q) + e
                rows.append(Measurement("verify:last-token", b, c, q, None, [t] * 3))
            for r, t in refresh.items():
                rows.append(Measurement("selection:sparsespec", b, c, r, 0.05, [t] * 3))
    model = CalibratedCostModel(Calibration(cal.provenance, cal.ceilings, rows), MODEL, HW)
    bare = CalibratedCostModel(cal, MODEL, HW)
    ctx = [8192] * 4
    for k, want in ((2, 0.1), (5, 0.2), (10, 0.3 + 1.7 * 2 / 4), (12, 2.0), (15, 2.0), (1, 0.1)):
        got = model.iteration(ctx, k, 0.05, "last-token").verify.seconds
        assert (got - bare.verify(ctx, k + 1).seconds) * 1e3 == pytest.approx(want, abs=0.02), k
    assert model.iteration(ctx, 8, 0.05, "vegas").verify.seconds == \
        pytest.approx(bare.verify(ctx, 9).seconds)
    # a policy that collects nothing measured below the shared verify is priced below it
    below = rows + [Measurement("verify:streamingllm", b, c, q, None,
                                [true_ms("verify", b, c, q) - 0.7] * 3)
                    for b in sorted({m.batch for m in rows})
                    for c in sorted({m.context for m in rows}) for q in (3, 9, 16)]
    lean = CalibratedCostModel(Calibration(cal.provenance, cal.ceilings, below), MODEL, HW)
    for k in (2, 6, 15):
        got = lean.iteration(ctx, k, 0.05, "streamingllm").verify.seconds
        assert (got - bare.verify(ctx, k + 1).seconds) * 1e3 == pytest.approx(-0.7, abs=0.02)
    for k, want in ((2, 3.0), (8, 3.0 + 2.6 * 6 / 13), (15, 5.6), (30, 5.6)):
        got = model.iteration(ctx, k, 0.05, "sparsespec").selection.seconds * 1e3
        assert got == pytest.approx(want, rel=0.03), k
    report = held_out_check(Calibration(cal.provenance, cal.ceilings, rows), MODEL, HW)
    assert report["per_op"]["selection:sparsespec"]["mape"] < 0.05
    assert report["per_op"]["verify:last-token"]["mape"] < 0.05


def test_measure_end_to_end_on_the_cpu(tmp_path, monkeypatch):
    """The whole `specsim calibrate --gpu` flow on a tiny model with the CUDA-only parts
    stubbed: every op the cost model needs is measured (per-policy overheads at k = 2 and the
    largest, all-row verifies, SparseSpec-L's refresh by rows), the checkpoint is the final
    file, and the calibrated model built from it prices an iteration."""
    import torch

    import specsim.calibrate as C
    import specsim.engine as E
    from specsim.engine import model as M

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (10**12, 10**12))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(C, "_ceilings", lambda torch_: {"copy_bandwidth_Bps": 4e12})
    monkeypatch.setattr(C, "OVERHEAD_STEPS", 3)

    monkeypatch.setattr(C, "_time", wall_timer())
    real_build = M.build_model
    monkeypatch.setattr(E, "build_model", lambda config, **kw: real_build(
        config, **{**kw, "device": "cpu", "dtype": torch.float32}))
    tiny = dict(model_type="llama", vocab_size=128, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                max_position_embeddings=8192, tie_word_embeddings=True)
    grid = C.CalibrationGrid(batches=[1, 2], contexts=[300, 900], qs=[1, 3, 6],
                             sparsities=[0.1], policies=["vegas", "sparsespec", "last-token"],
                             repeats=2, warmup=1)
    path = str(tmp_path / "cal.json")
    cal = C.measure(MODEL, grid, config=tiny, fuse=False, compile=False, checkpoint=path,
                    progress=False)
    back = read_calibration(path)
    assert back.provenance["complete"] is True and len(back.measurements) == len(
        cal.measurements)
    from specsim.engine.decode import FUSED_APPEND
    from specsim.kernels.selection import RANKING
    from specsim.engine.selection import C2Q
    from specsim.kernels.verify_attention import VERIFY_SPLITS
    engine = back.provenance["engine"]
    assert (engine["ranking"], engine["fused_append"], engine["verify_splits"],
            engine["c2q"]) == (RANKING, FUSED_APPEND, VERIFY_SPLITS, C2Q)
    ops = {(m.op, m.q) for m in back.measurements}
    for policy in grid.policies:
        assert {(f"overhead:speculative:{policy}", 3), (f"overhead:speculative:{policy}", 6)} \
            <= ops
    assert {("verify:last-token", 3), ("verify:last-token", 6), ("verify:sparsespec", 3),
            ("selection:sparsespec", 3), ("selection:sparsespec", 16)} <= ops
    assert ("verify:vegas", 3) not in ops
    it = CalibratedCostModel(back, MODEL, HW).iteration([600, 600], 4, 0.1, "sparsespec")
    split = it.split()
    assert split["draft"] > 0 and split["verify"] > 0 and split["selection"] > 0
    assert split["other"] >= 0                      # a residual, clamped at 0
    # the overheads alone, as round B re-measures them, then put into the full file
    only = dataclasses.replace(grid, contexts=[300, 600, 900], only=["overhead"])
    part = C.measure(MODEL, only, config=tiny, fuse=False, compile=False,
                     checkpoint=str(tmp_path / "overheads.json"), progress=False)
    assert {m.op.split(":")[0] for m in part.measurements} == {"overhead"}
    assert part.provenance["grid"]["only"] == ["overhead"] and part.provenance["complete"]
    assert {m.context for m in part.measurements} == {300, 600, 900}  # the overhead contexts
    merged = replace_ops(back, part, ["overhead"], "round B")
    assert len(merged.measurements) == len(part.measurements) + sum(
        not m.op.startswith("overhead") for m in back.measurements)
    CalibratedCostModel(merged, MODEL, HW).iteration([600, 600], 4, 0.1, "vegas")


def test_a_grid_can_measure_some_op_families_only(monkeypatch):
    """``only``: the loop overheads alone (after a change to the loop's host code) are
    measured at the overhead contexts only, and nothing else is timed; draft and selection
    alone skip the verify passes and the overheads; an unknown family is refused."""
    import torch

    import specsim.calibrate as C
    from specsim.engine import Engine, build_model

    with pytest.raises(ValueError, match="unknown op families"):
        C.CalibrationGrid(only=["overheads"])
    with pytest.raises(ValueError, match="measures nothing"):
        C.CalibrationGrid(only=["overhead"], overheads=False)
    grid = C.CalibrationGrid(batches=[2], contexts=[500, 600, 700, 800], only=["overhead"])
    assert [c for c in grid.contexts if grid.shape_needed(c)] == grid.overhead_contexts() \
        == [500, 700, 800]
    assert all(C.CalibrationGrid(contexts=[500, 600, 700]).shape_needed(c)
               for c in (500, 600, 700))

    monkeypatch.setattr(C, "_time", wall_timer())
    monkeypatch.setattr(C, "OVERHEAD_STEPS", 3)
    tiny = dict(model_type="llama", vocab_size=128, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                max_position_embeddings=4096, tie_word_embeddings=True)
    model = build_model(tiny, weights="random", dtype=torch.float32, device="cpu")
    prompts, room = [[0] * 600] * 2, 6 * (C.OVERHEAD_STEPS + 2) + 8
    ops = {}
    for only in (["overhead"], ["draft", "selection"]):
        grid = C.CalibrationGrid(batches=[2], contexts=[600], qs=[1, 6], sparsities=[0.1],
                                 policies=["vegas"], repeats=1, warmup=0, only=only)
        rows = C._measure_policy(torch, Engine, model, grid, 2, 600, prompts, room, "vegas",
                                 0.1)
        ops[only[0]] = {(m.op, m.q) for m in rows}
    assert ops["overhead"] == {("overhead:speculative:vegas", 3),
                               ("overhead:speculative:vegas", 6)}
    assert ops["draft"] == {("draft:vegas", 1), ("selection:vegas", 1)}


def test_selection_refresh_is_priced_on_its_measured_grid():
    """A refresh's time is not additive in batch and context (ranking rows of a length that
    changes algorithm: here the per-position rate rises 60% past 8K): the model interpolates
    its measured (batch, context) grid instead — exact at the measured points, linear between
    contexts and between batches, linear in s between two measured sparsities, a ragged Vegas
    batch at its longest context, noisy medians made non-decreasing, and outside the grid the
    fitted fallback, said so."""
    from specsim.costs.calibrated import MeasuredGrid

    def t_ms(b, c, s):
        return 0.02 + b * c * 1e-7 * (1.6 if c > 8192 else 1.0) * (1 + 2 * s)

    base = synthetic()
    rows = [m for m in base.measurements if not m.op.startswith("selection")]
    for s in (0.03, 0.1):
        for b in (1, 4, 16):
            for c in (2048, 4096, 8192, 16384, 32768):
                rows.append(Measurement("selection:vegas", b, c, 1, s, [t_ms(b, c, s)] * 3))
    model = CalibratedCostModel(Calibration(base.provenance, base.ceilings, rows), MODEL, HW)

    def ms(contexts, s=0.03):
        return model.selection(contexts, s, "vegas", 4).seconds * 1e3

    assert ms([16384] * 4) == pytest.approx(t_ms(4, 16384, 0.03), rel=1e-9)
    assert ms([8192] * 16) == pytest.approx(t_ms(16, 8192, 0.03), rel=1e-9)
    assert ms([12288] * 4) == pytest.approx((t_ms(4, 8192, .03) + t_ms(4, 16384, .03)) / 2)
    assert ms([16384] * 10) == pytest.approx(t_ms(4, 16384, .03) + (t_ms(16, 16384, .03)
                                             - t_ms(4, 16384, .03)) * 6 / 12)
    assert ms([16384] * 4, s=0.05) == pytest.approx(
        t_ms(4, 16384, 0.03) + (t_ms(4, 16384, 0.1) - t_ms(4, 16384, 0.03)) * 2 / 7)
    assert ms([2048, 16384, 4096, 16384]) == pytest.approx(ms([16384] * 4))
    cost = model.selection([16384] * 32, 0.03, "vegas", 4)        # batch 32 > 16: not on it
    assert any("outside" in n for n in cost.notes)
    assert any("measured grid" in n for n in model.selection([16384] * 4, 0.03, "vegas",
                                                              4).notes)
    noisy = MeasuredGrid.of([Measurement("selection:vegas", 2, c, 1, 0.03, [y])
                              for c, y in ((1024, 1.0), (2048, 3.0), (4096, 2.0), (8192, 4.0))])
    assert noisy.by_batch[2].y.tolist() == pytest.approx([1e-3, 2.5e-3, 2.5e-3, 4e-3])
    assert noisy(2, 512) is None and noisy(3, 2048) is None


def test_held_out_check_scores_quests_empty_refresh_in_microseconds(tmp_path):
    """Quest's refresh after a verify is empty (~10 µs: its selection runs in every draft
    step), so it is reported with the overheads as an absolute error, not as a relative one
    of a few microseconds."""
    base = synthetic()
    rows = list(base.measurements) + [
        Measurement("selection:quest", b, c, 1, 0.05, [0.007 + 0.002 * (c == 4096)] * 3)
        for b in (1, 2, 4, 8, 16, 32) for c in (1024, 2048, 4096, 8192, 16384, 32768, 65536)]
    report = held_out_check(Calibration(base.provenance, base.ceilings, rows), MODEL, HW)
    assert "selection:quest" not in report["per_op"]
    quest = report["overheads"]["selection:quest"]
    assert quest["points"] > 0 and quest["worst_abs_error_ms"] < 0.003


def test_compare_calibrations_script(tmp_path, capsys):
    """scripts/compare_calibrations.py: new / old medians per verify tile and batch (the
    check before a launch setting becomes the default), failing past --fail-above."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "compare_calibrations", REPO_ROOT / "scripts" / "compare_calibrations.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    old = synthetic(contexts=(4096, 32768), batches=(1, 4), qs=(1, 8))
    rows = []
    for m in old.measurements:
        factor = {("plain", 1): 1.2, ("verify", 8): 0.9}.get(
            (m.op, m.batch if m.op == "plain" else m.q), 1.0)
        rows.append(dataclasses.replace(m, samples_ms=[x * factor for x in m.samples_ms]))
    new = Calibration(old.provenance, old.ceilings, rows)
    old.write(str(tmp_path / "old.json"))
    new.write(str(tmp_path / "new.json"))
    ratios = script.compare(old, new)
    group = MODEL.num_heads // MODEL.num_kv_heads
    off = (MODEL.head_dim, 16, "off")
    c2q8 = (MODEL.head_dim, max(16, 1 << math.ceil(math.log2(group * 8))), "separate")
    assert ratios[off + (1,)] == pytest.approx([1.2, 1.2])          # plain at batch 1
    assert ratios[off + (4,)] == pytest.approx([1.0, 1.0])
    assert ratios[c2q8 + (4,)] == pytest.approx([0.9, 0.9])        # Collect-2-Query q = 8
    assert ratios[(MODEL.head_dim, 16, "main", 1)] == pytest.approx([1.0, 1.0])   # q = 1
    assert script.main([str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 0
    assert script.main([str(tmp_path / "old.json"), str(tmp_path / "new.json"),
                        "--fail-above", "1.05"]) == 1
    assert "exceeds 1.05" in capsys.readouterr().out
    # plain at batch 1 (+20%) is a WAVE_CONFIGS tile at hd128 ("off", 16 rows): still gated
    changed = (MODEL.head_dim, 16, "off") in script.WAVE_CONFIGS
    assert script.main([str(tmp_path / "old.json"), str(tmp_path / "new.json"),
                        "--fail-above", "1.05", "--changed-only"]) == (1 if changed else 0)
    slower = [dataclasses.replace(m, samples_ms=[x * 1.1 for x in m.samples_ms])
              if m.op == "verify" and m.q == 1 else m for m in old.measurements]
    Calibration(old.provenance, old.ceilings, slower).write(str(tmp_path / "drift.json"))
    capsys.readouterr()
    # a tile outside WAVE_CONFIGS 10% slower: drift, reported, gated only without the flag
    assert script.main([str(tmp_path / "old.json"), str(tmp_path / "drift.json"),
                        "--fail-above", "1.05", "--changed-only"]) == 0
    assert "drift between the runs): mean ratios 1.100..1.100" in capsys.readouterr().out
    assert script.main([str(tmp_path / "old.json"), str(tmp_path / "drift.json"),
                        "--fail-above", "1.05"]) == 1
    # a file measured with the summed Collect-2-Query: Vegas' collecting tiles are "sum" ones
    # (WAVE_CONFIGS tiles: gated), the plain tiles keep their mode
    prov = {**old.provenance, "engine": {**old.provenance.get("engine", {}), "c2q": "sum"}}
    summed = script.compare(old, Calibration(prov, old.ceilings, rows))
    sum8 = c2q8[:2] + ("sum",)
    assert summed[sum8 + (4,)] == pytest.approx([0.9, 0.9]) and c2q8 + (4,) not in summed
    assert summed[(MODEL.head_dim, 16, "sum", 1)] == pytest.approx([1.0, 1.0])   # q = 1
    assert summed[off + (1,)] == pytest.approx([1.2, 1.2])
    assert sum8 in script.WAVE_CONFIGS
    # the shared verify timed on another policy (the grid's first but Quest) kept its tiles
    other = {**prov, "grid": {**prov.get("grid", {}), "policies": ["quest", "sparsespec"]}}
    assert c2q8 + (4,) in script.compare(old, Calibration(other, old.ceilings, rows))
