"""Combining two calibrations' rows: a merge keeps every primary row and fills only shapes it
lacks; a replacement swaps whole families; neither mixes timings of two engines."""
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration_tables import HW, MODEL, synthetic, true_ms, with_overheads
from specsim.costs.calibrated import CalibratedCostModel
from specsim.costs.calibration_file import OP_FAMILIES, Calibration, Measurement
from specsim.costs.merging import SETTING_FAMILIES, merge_calibrations, replace_ops, touches
from specsim.costs.provenance import current_choices, engine_choices
from specsim.errors import SpecsimError
from specsim.settings import LEGACY_DEFAULTS, EngineSettings

QUEST_ROWS = [Measurement(op, 16, 1024, q, s, [1.0]) for op, q, s in
              (("draft:quest", 1, 0.1), ("verify:quest", 5, None), ("selection:quest", 1, 0.1),
               ("selection:sparsespec", 1, 0.1))]


def engine(cal: Calibration, **choices) -> Calibration:
    """The calibration with its ``provenance.engine`` holding these choices (key by key)."""
    eng = {"cache_align": 128, **choices}
    return Calibration(dict(cal.provenance, engine=eng), cal.ceilings, cal.measurements)


def runs():
    """A run cut short (batches 1 and 2) and an older complete one, both with overheads."""
    old = with_overheads(synthetic(noise=0.01, seed=3))
    old = Calibration(old.provenance, old.ceilings, old.measurements + QUEST_ROWS)
    new = with_overheads(synthetic(noise=0.01, seed=4, batches=(1, 2)),
                         spec_us=lambda b: 50 + 5 * b)
    return new, old


def rows_of(cal):
    return {(m.op, m.batch, m.context, m.q, m.s) for m in cal.measurements}


@given(st.sets(st.sampled_from([1, 2, 4, 8, 16, 32]), min_size=1, max_size=5),
       st.sets(st.sampled_from([1, 2, 4, 8, 16, 32]), min_size=1),
       st.sampled_from([{}, {"c2q": "sum"}, {"ranking": "best"}, {"fused_append": True},
                        {"draft_timed_as_chain_of": 4}, {"cache_align": None}]))
@settings(max_examples=25, deadline=None)
def test_a_merge_keeps_every_primary_row_and_fills_only_missing_shapes(mine, theirs, choices):
    primary = engine(with_overheads(synthetic(batches=sorted(mine), qs=(1, 4))), **choices)
    extra = engine(with_overheads(synthetic(seed=1, batches=sorted(theirs), qs=(1, 4))))
    merged = merge_calibrations(primary, extra, "note")
    assert merged.measurements[:len(primary.measurements)] == primary.measurements
    added = merged.measurements[len(primary.measurements):]
    have = {(m.batch, m.context) for m in primary.measurements}
    assert all((m.batch, m.context) not in have for m in added)
    assert all(m in extra.measurements and not m.op.startswith("overhead") for m in added)
    assert merged.provenance["merged"][-1]["rows"] == len(added)
    assert merged.provenance["engine"] == primary.provenance["engine"]
    for op, why in merged.provenance["merged"][-1]["ops_skipped"].items():
        assert not any(m.op == op for m in added) and why


def test_a_merged_grid_prices_from_measurements():
    new, old = runs()
    merged = merge_calibrations(new, old, "older run, same kernels")
    info = merged.provenance["merged"][-1]
    assert [4, 1024] in info["shapes"] and info["note"] == "older run, same kernels"
    cost = CalibratedCostModel(merged, MODEL, HW).verify([8192] * 16, 8)
    assert cost.seconds * 1e3 == pytest.approx(true_ms("verify", 16, 8192, 8, None), rel=0.05)
    assert not any("outside" in n for n in cost.notes)
    assert CalibratedCostModel(new, MODEL, HW).verify([8192] * 16, 8).notes[-1] != \
        cost.notes[-1]                                     # the cut-short run alone: outside


@pytest.mark.parametrize("key", ["gpu", "model", "model_spec_hash"])
def test_runs_of_another_model_or_gpu_are_not_combined(key):
    new, old = runs()
    other = Calibration(dict(old.provenance, **{key: "other"}), old.ceilings, old.measurements)
    with pytest.raises(SpecsimError, match=f"different {key}"):
        merge_calibrations(new, other, "x")
    with pytest.raises(SpecsimError, match=f"different {key}"):
        replace_ops(new, other, ["verify"], "x")


def other_value(name: str, now):
    """A value of engine choice ``name`` other than ``now``."""
    field = {f.name: f for f in dataclasses.fields(EngineSettings)}.get(name)
    values = field.metadata["choices"] if field else (LEGACY_DEFAULTS.get(name),)
    return next((v for v in values if v != now), None)


CHANGED = sorted(n for n, v in current_choices().items() if other_value(n, v) is not None)


@pytest.mark.parametrize("name", CHANGED)
def test_a_merge_takes_no_op_an_engine_choice_changes(name):
    """Where the two runs' engines differ in one choice, no op that choice changes is taken
    from the other run (a ranking compared as each policy resolves it); every other op is."""
    now = current_choices()
    new, old = runs()
    here = engine(new, **now)
    there = engine(old, **{**now, name: other_value(name, now[name])})
    merged = merge_calibrations(here, there, "x")
    taken = {m.op for m in merged.measurements[len(new.measurements):]}
    skipped = merged.provenance["merged"][-1]["ops_skipped"]
    steps = {m.op for m in old.measurements if not m.op.startswith("overhead")}
    assert taken | set(skipped) == steps and not taken & set(skipped)
    families = SETTING_FAMILIES.get(name, OP_FAMILIES)
    if name != "ranking":
        assert set(skipped) == {op for op in steps if touches(families, op)}
    else:
        assert set(skipped) <= {op for op in steps if touches(families, op)}
    differ = merged.provenance["merged"][-1]["settings_differ"]
    assert differ[name] == [other_value(name, now[name]), now[name]]
    # beside the setting, the policies it ranks otherwise (ranking:<policy>) and nothing else
    assert set(differ) - {name} == ({f"ranking:{p}" for p in ("quest", "sparsespec")}
                                    if name == "ranking" else set())


def test_a_ranking_difference_skips_only_the_policies_it_ranks_otherwise():
    """``best`` ranks SparseSpec-L's and Quest's lists by their own kernels and Vegas' by
    torch.topk: against a topk run, Vegas' refresh is taken, their refreshes and Quest's
    draft steps (which rank pages) are not."""
    new, old = runs()
    merged = merge_calibrations(engine(new, ranking="best"), engine(old, ranking="topk"), "x")
    taken = {m.op for m in merged.measurements[len(new.measurements):]}
    assert {"selection:vegas", "draft:vegas", "verify:quest"} <= taken
    assert not taken & {"selection:sparsespec", "selection:quest", "draft:quest"}


def test_what_best_resolved_to_is_read_from_each_file(monkeypatch):
    """Files record what ``ranking=best`` resolved to per policy (``best_ranking``; files
    that do not, ``LEGACY_BEST_RANKING``). When it changes, rows of a policy ranked
    otherwise are neither merged nor kept beside the new ones, and the summary says so."""
    import specsim.costs.provenance as P
    from specsim.costs.provenance import engine_summary
    from specsim.policies import LEGACY_BEST_RANKING
    from specsim.settings import engine_provenance

    new, old = runs()
    assert engine_provenance(EngineSettings())["best_ranking"] == P.BEST_RANKING
    flipped = dict(LEGACY_BEST_RANKING, sparsespec="topk")    # what best resolves to here
    monkeypatch.setattr(P, "BEST_RANKING", flipped)
    here = engine(new, ranking="best", best_ranking=flipped)
    there = engine(old, ranking="best")           # an older file: what best meant then
    merged = merge_calibrations(here, there, "x")
    info = merged.provenance["merged"][-1]
    assert info["settings_differ"] == {"ranking:sparsespec": ["radix", "topk"]}
    assert info["ops_skipped"] == {"selection:sparsespec": "ranked by radix there, topk here"}
    with pytest.raises(SpecsimError, match="replace all of selection:sparsespec"):
        replace_ops(there, here, ["verify"], "x")
    swapped = replace_ops(there, here, ["selection"], "x")
    assert swapped.engine["best_ranking"] == flipped
    assert "sparsespec ranked by radix" in engine_summary(there)
    assert "ranked by" not in engine_summary(swapped)


def test_a_merge_respects_how_drafts_were_timed_and_caches_padded():
    new, old = runs()
    chained = merge_calibrations(engine(new, draft_timed_as_chain_of=4), engine(old), "x")
    taken = {m.op for m in chained.measurements[len(new.measurements):]}
    assert "verify" in taken and not any(op.startswith("draft:") for op in taken)
    padded = merge_calibrations(engine(new), engine(old, cache_align=None), "x")
    taken = {m.op for m in padded.measurements[len(new.measurements):]}
    assert "draft:vegas" in taken and not any(op.endswith(":quest") for op in taken)


def test_a_merge_skips_ops_measured_at_other_q_or_excluded():
    new, old = runs()
    by_rows = Calibration(new.provenance, new.ceilings, new.measurements + [
        Measurement("selection:quest", 1, 1024, 3, 0.1, [1.0])])
    merged = merge_calibrations(by_rows, old, "q differs")
    assert not any(m.op == "selection:quest" and m.batch == 16 for m in merged.measurements)
    assert any(m.op == "draft:quest" and m.batch == 16 for m in merged.measurements)
    assert "[1]" in merged.provenance["merged"][-1]["ops_skipped"]["selection:quest"]
    merged = merge_calibrations(new, old, "gather", exclude_ops=("draft:quest",))
    assert not any(m.op == "draft:quest" and m.batch == 16 for m in merged.measurements)
    assert set(merged.provenance["merged"][-1]["ops_skipped"]) == {"draft:quest"}


def overheads_alone(seed=5, batches=(1, 4, 32), date="2026-12-01T00:00:00Z"):
    again = with_overheads(synthetic(noise=0.01, seed=seed, batches=batches),
                           spec_us=lambda b: 100 + 2 * b)
    return Calibration(dict(again.provenance, date=date), again.ceilings,
                       [m for m in again.measurements if m.op.startswith("overhead")])


def test_replacing_families_swaps_exactly_their_rows(tmp_path):
    """The new run's rows of the replaced families, every other row of the base; recorded in
    the provenance; the model prices the new rows."""
    full = with_overheads(synthetic(noise=0.01, seed=3), spec_us=lambda b: 400 + 10 * b)
    only = overheads_alone()
    out = replace_ops(full, only, ["overhead"], "host loop without a sync")
    steps = [m for m in full.measurements if not m.op.startswith("overhead")]
    assert [m for m in out.measurements if not m.op.startswith("overhead")] == steps
    assert [m for m in out.measurements if m.op.startswith("overhead")] == only.measurements
    info = out.provenance["replaced"][-1]
    assert info["families"] == ["overhead"] and info["rows"] == len(only.measurements)
    assert info["date"] == only.provenance["date"]
    assert info["replaced_rows"] == len(full.measurements) - len(steps)
    ctx = [4096] * 4
    before = CalibratedCostModel(full, MODEL, HW).iteration(ctx, 4, 0.05, "vegas").overhead_s
    after = CalibratedCostModel(out, MODEL, HW).iteration(ctx, 4, 0.05, "vegas").overhead_s
    assert after < 0.5 * before
    # one op by name: the other rows of its family stay
    one = replace_ops(full, only, ["overhead:speculative"], "one op")
    assert [m for m in one.measurements if m.op == "overhead:plain"] == \
        [m for m in full.measurements if m.op == "overhead:plain"]
    assert [m for m in one.measurements if m.op == "overhead:speculative"] == \
        [m for m in only.measurements if m.op == "overhead:speculative"]
    with pytest.raises(SpecsimError, match="no overhead rows"):
        replace_ops(full, Calibration(only.provenance, only.ceilings, steps), ["overhead"], "x")


def test_replacing_with_other_shapes_kept_keeps_only_the_unmeasured_shapes():
    full = with_overheads(synthetic(noise=0.01, seed=3))
    part = overheads_alone(batches=(1,))
    cut = replace_ops(full, part, ["overhead"], "batch 1 only")
    assert {m.batch for m in cut.measurements if m.op.startswith("overhead")} == {1}
    kept = replace_ops(full, part, ["overhead"], "batch 1 only", keep_other_shapes=True)

    def over(cal, b):
        return [m for m in cal.measurements if m.op.startswith("overhead") and m.batch == b]

    assert over(kept, 1) == over(part, 1) and over(kept, 4) == over(full, 4) != []
    assert kept.provenance["replaced"][-1]["kept_other_shapes"] is True


@pytest.mark.parametrize("name", CHANGED)
def test_a_replacement_never_mixes_two_engines(name):
    """A run whose engine differs in one choice replaces a file's rows only where it replaces
    every family that choice changes, keeping no old row of them; the file then records the
    new run's engine (its settings and every choice)."""
    now = current_choices()
    value = other_value(name, now[name])
    base = engine(with_overheads(synthetic(noise=0.01, seed=3)), **now)
    new = engine(with_overheads(synthetic(noise=0.01, seed=5)), **{**now, name: value})
    families = SETTING_FAMILIES.get(name, OP_FAMILIES)
    # these synthetic files time no prefill: the family is not theirs to replace
    whole = sorted({f.split(":", 1)[0] for f in families} - {"prefill"})
    for part in (set(whole) - {f} for f in whole):
        if part:
            with pytest.raises(SpecsimError, match=f"{name}=.*would mix"):
                replace_ops(base, new, sorted(part), "part")
    with pytest.raises(SpecsimError, match="keeping the old rows at other shapes"):
        replace_ops(base, new, whole, "x", keep_other_shapes=True)
    out = replace_ops(base, new, whole, "x")
    assert out.settings == new.settings
    assert engine_choices(out) == engine_choices(new) == {**now, name: value}
    assert out.provenance["engine"]["cache_align"] == 128       # the harness' facts kept
    assert engine_choices(base) == now                          # the input is left alone


def test_replacing_under_the_same_engine_keeps_the_files_record():
    base = engine(with_overheads(synthetic(noise=0.01, seed=3)), ranking="topk")
    same = engine(synthetic(noise=0.01, seed=5), ranking="topk")
    assert replace_ops(base, same, ["plain"], "x").provenance["engine"] == \
        base.provenance["engine"]


def test_one_op_covers_a_choice_that_changes_only_it():
    """The summed Collect-2-Query changes the verify passes and Vegas' refresh alone: the
    other policies' refresh rows stay."""
    spec_rows = [Measurement("selection:sparsespec", 4, 3072, 3, 0.05, [0.2])]
    full = with_overheads(synthetic(noise=0.01, seed=3))
    base = engine(Calibration(full.provenance, full.ceilings, full.measurements + spec_rows),
                  c2q="rows")
    summed = engine(synthetic(noise=0.01, seed=5), c2q="sum")
    with pytest.raises(SpecsimError, match="not replacing selection:vegas"):
        replace_ops(base, summed, ["verify"], "verify only")
    out = replace_ops(base, summed, ["verify", "selection:vegas"], "x")
    assert out.settings.c2q == "sum"
    assert [m for m in out.measurements if m.op == "selection:sparsespec"] == spec_rows
    assert replace_ops(base, summed, ["verify", "selection"], "x").settings.c2q == "sum"


def test_a_file_with_prefills_replaces_them_with_every_other_family_a_choice_changes():
    """Prefill rows count like any family once a file has them: a run with another engine
    choice that leaves them out is refused; with them, they are replaced."""
    now = current_choices()
    name = "compile_layers"
    value = other_value(name, now[name])

    def prefills(cal, scale):
        return Calibration(cal.provenance, cal.ceilings, list(cal.measurements) + [
            Measurement("prefill", 1, c, 1, None, [scale * c / 1e3] * 3)
            for c in (1024, 4096, 16384)])

    base = prefills(engine(with_overheads(synthetic(noise=0.01, seed=3)), **now), 1.0)
    new = prefills(engine(with_overheads(synthetic(noise=0.01, seed=5)),
                          **{**now, name: value}), 2.0)
    families = sorted({f.split(":", 1)[0] for f in OP_FAMILIES})
    with pytest.raises(SpecsimError, match="would mix"):
        replace_ops(base, new, [f for f in families if f != "prefill"], "part")
    out = replace_ops(base, new, families, "whole")
    assert sorted(m.median_ms for m in out.measurements if m.op == "prefill") == \
        pytest.approx([2 * c / 1e3 for c in (1024, 4096, 16384)])
