"""`specsim calibrate --gpu`'s harness (specsim.calibrate) run on the CPU engine with a wall
clock in place of CUDA events: what it measures, how it checkpoints and resumes, and the
calibration comparison script."""
import dataclasses
import math
import time

import pytest

from calibration_tables import HW, MODEL, synthetic
from repo import REPO_ROOT
from specsim.costs.calibrated import CalibratedCostModel
from specsim.costs.calibration_file import Calibration, Measurement, read_calibration
from specsim.costs.merging import replace_ops
from specsim.costs.provenance import current_choices, engine_choices
from specsim.errors import SpecsimError
from specsim.settings import EngineSettings


@pytest.fixture(autouse=True)
def one_thread():
    """The tiny models' matmuls run on one thread: several would only wait for each other."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


def test_loop_overhead_is_timed_by_the_loops_own_clock(monkeypatch):
    """The speculative-loop overhead is what the loop's iterations spend beyond their priced
    steps: a call's fixed costs outside the loop (here building the traces is made to take
    0.3 s) must not be spread over its iterations (0.1 s each over 3), as timing the whole
    call by the wall clock would."""
    import torch

    import specsim.calibrate as C
    from specsim.engine import Engine, build_model
    from specsim.engine.run import Run

    tiny = dict(model_type="llama", vocab_size=128, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                max_position_embeddings=4096, tie_word_embeddings=True)
    model = build_model(tiny, weights="random", dtype=torch.float32, device="cpu")
    monkeypatch.setattr(C, "OVERHEAD_STEPS", 3)
    slow = Run.traces

    def slow_traces(self, *a, **kw):
        time.sleep(0.3)
        return slow(self, *a, **kw)

    monkeypatch.setattr(Run, "traces", slow_traces)
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


def calibrate_on_the_cpu(monkeypatch, overhead_steps: int) -> None:
    """`specsim calibrate --gpu`'s CUDA-only parts stubbed: the model built on the CPU in
    fp32, ample memory, a fixed copy bandwidth, wall-clock timing, short overhead loops."""
    import torch

    import specsim.calibrate as C
    import specsim.engine as E
    from specsim.engine import model as M

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (10**12, 10**12))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(C, "_ceilings", lambda torch_: {"copy_bandwidth_Bps": 4e12})
    monkeypatch.setattr(C, "OVERHEAD_STEPS", overhead_steps)
    monkeypatch.setattr(C, "_time", wall_timer())
    real_build = M.build_model
    monkeypatch.setattr(E, "build_model", lambda cfg, **kw: real_build(
        cfg, **{**kw, "device": "cpu", "dtype": torch.float32}))


def test_measure_end_to_end_on_the_cpu(tmp_path, monkeypatch):
    """The whole `specsim calibrate --gpu` flow on a tiny model with the CUDA-only parts
    stubbed: every op the cost model needs is measured (per-policy overheads at k = 2 and the
    largest, all-row verifies, SparseSpec-L's refresh by rows), the checkpoint is the final
    file, and the calibrated model built from it prices an iteration."""
    import specsim.calibrate as C

    calibrate_on_the_cpu(monkeypatch, overhead_steps=3)
    tiny = dict(model_type="llama", vocab_size=128, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                max_position_embeddings=8192, tie_word_embeddings=True)
    grid = C.CalibrationGrid(batches=[1, 2], contexts=[300, 900], qs=[1, 3, 6],
                             sparsities=[0.1], policies=["vegas", "sparsespec", "last-token"],
                             repeats=2, warmup=1)
    path = str(tmp_path / "cal.json")
    settings = EngineSettings().replace(fuse_projections=False, compile_layers=False)
    cal = C.measure(MODEL, grid, config=tiny, settings=settings, checkpoint=path,
                    progress=False)
    back = read_calibration(path)
    assert back.provenance["complete"] is True and len(back.measurements) == len(
        cal.measurements)
    # the file records the engine it timed: these settings, every other choice as it runs now
    assert back.settings == settings
    assert engine_choices(back) == {**current_choices(), **settings.to_json()}
    ops = {(m.op, m.q) for m in back.measurements}
    # one prompt's prefill at each context (the engine prefills a prompt a pass)
    assert sorted((m.batch, m.context) for m in back.measurements if m.op == "prefill") == \
        [(1, 300), (1, 900)]
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
    # the overheads alone, re-measured after a change to the loop's host code, then put into
    # the full file
    only = dataclasses.replace(grid, contexts=[300, 600, 900], only=["overhead"])
    part = C.measure(MODEL, only, config=tiny, settings=settings,
                     checkpoint=str(tmp_path / "overheads.json"), progress=False)
    assert {m.op.split(":")[0] for m in part.measurements} == {"overhead"}
    assert part.provenance["grid"]["only"] == ["overhead"] and part.provenance["complete"]
    assert {m.context for m in part.measurements} == {300, 600, 900}  # the overhead contexts
    merged = replace_ops(back, part, ["overhead"], "overheads re-measured")
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
    assert [c for c in grid.contexts if grid.shape_needed(2, c)] == grid.overhead_contexts() \
        == [500, 700, 800]
    assert all(C.CalibrationGrid(contexts=[500, 600, 700]).shape_needed(4, c)
               for c in (500, 600, 700))
    # overheads and prefills: the overhead contexts at every batch, every context at the
    # smallest batch (a prefill is one prompt), nothing else
    both = C.CalibrationGrid(batches=[1, 4], contexts=[500, 600, 700, 800],
                             only=["overhead", "prefill"])
    needed = [(b, c) for b in both.batches for c in both.contexts if both.shape_needed(b, c)]
    assert needed == [(1, 500), (1, 600), (1, 700), (1, 800), (4, 500), (4, 700), (4, 800)]

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
    # a shape measured for draft and selection alone builds no full-attention engine (its
    # cache would be filled for nothing); one measured for plain steps does
    built = []

    def counting(*args, policy="full", **kw):
        built.append(policy)
        return Engine(*args, policy=policy, **kw)

    timed = {}
    for only in (["draft", "selection"], ["plain"]):
        built.clear()
        grid = C.CalibrationGrid(batches=[2], contexts=[600], qs=[1, 6], sparsities=[0.1],
                                 policies=["vegas"], repeats=1, warmup=0, overheads=False,
                                 only=only)
        rows = C._measure_shape(torch, counting, model, grid, 2, 600)
        timed[only[0]] = {m.op for m in rows}
        assert ("full" in built) == (only == ["plain"])
    assert timed == {"draft": {"draft:vegas", "selection:vegas"}, "plain": {"plain"}}


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



@pytest.mark.parametrize("kind", ["qwen3_moe", "gpt_oss"])
def test_calibration_runs_on_moe_and_gpt_oss_models(tmp_path, monkeypatch, kind):
    """`specsim calibrate --gpu`'s flow on a tiny Qwen3-MoE (routed experts) and a tiny
    gpt-oss (sinks, window layers, YaRN, biased experts), the CUDA-only parts stubbed: every
    shape measured, prefills included, and the file prices an iteration of its own model."""
    import specsim.calibrate as C
    from specsim.specs import model_spec_from_config
    from test_engine_gpt_oss import TINY_GPT_OSS
    from test_engine_moe import TINY_MOE

    config = {"qwen3_moe": TINY_MOE, "gpt_oss": TINY_GPT_OSS}[kind]
    spec = model_spec_from_config(config, name=f"tiny-{kind}")
    calibrate_on_the_cpu(monkeypatch, overhead_steps=2)
    grid = C.CalibrationGrid(batches=[1, 2], contexts=[200, 400], qs=[1, 3],
                             sparsities=[0.1], policies=["vegas", "streamingllm"],
                             repeats=2, warmup=1)
    settings = EngineSettings().replace(fuse_projections=False, compile_layers=False)
    path = str(tmp_path / "cal.json")
    C.measure(spec, grid, config=config, settings=settings, checkpoint=path, progress=False)
    back = read_calibration(path)
    assert back.provenance["complete"] is True
    families = {m.op.split(":")[0] for m in back.measurements}
    assert families == {"plain", "verify", "draft", "selection", "overhead", "prefill"}
    assert all(m.median_ms > 0 for m in back.measurements)
    it = CalibratedCostModel(back, spec, HW).iteration([300, 300], 2, 0.1, "vegas")
    assert it.split()["draft"] > 0 and it.split()["verify"] > 0
