"""The operator cost model: a model's steps composed from a synthetic operator table of known
structure; the table's file format; the cost source order; the sweep run on the CPU."""
import dataclasses
import itertools
import json
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.costs import resolve_cost_source
from specsim.costs.operator_file import OperatorTable, Point, read_operator_table
from specsim.costs.operators import OperatorCostModel
from specsim.costs.provenance import engine_choices
from specsim.errors import SpecsimError
from specsim.settings import DEFAULT
from specsim.shipped import shipped_root
from specsim.specs import ModelSpec, load_hardware, load_model

HW = load_hardware("h200")
#: A small model whose every operator sits on the synthetic table's grid.
SMALL = ModelSpec("small", "llama", num_layers=2, hidden_size=1024, num_heads=8,
                  num_kv_heads=2, head_dim=128, intermediate_size=2048, vocab_size=4096,
                  layer_types=("full_attention",) * 2)


# ---- the synthetic table: affine in each axis, so interpolation between its points is exact --
def gemm_ms(n, k, m):
    return 0.004 + 2 * n * k / 3e9 + m * (n + k) * 2 / 3e9


def elementwise_ms(moved):
    return 0.002 + moved / 2e9


def graph_ms(kernels):
    return 0.005 + 0.001 * kernels


def append_ms(bkv, paged):
    return 0.002 + 1e-5 * bkv + (0.001 if paged else 0.0)


def verify_ms(q, collect, bkv, context):
    extra = {"off": 0.0, "sum": 0.02, "all": 0.05, "rows": 0.03}[collect]
    return 0.003 + extra * q + bkv * context * 1e-7 * (1 + 0.01 * q)


def sparse_ms(per, bkv, selected):
    return 0.004 + bkv * selected * (1.2e-7 if per else 1e-7)


def selection_ms(policy, rows, lists, context, s=0.05):
    """Linear in s (the sorted winners), so the table's s = 0.03 and 0.1 interpolate it."""
    scale = {"vegas": 1e-8, "last-token": 1.5e-8, "sparsespec": 3e-8 * (1 + rows / 16),
             "quest": 2e-8}[policy]
    return 0.01 + lists * context * scale * (1 + 4 * s)


BKV, CONTEXTS, SELECTED = (2, 8, 32), (1024, 4096, 16384, 65536), (256, 1024, 4096)
LISTS = (2, 64, 512)
SELECTION_S = (0.03, 0.1)


def synthetic_table(path=None) -> OperatorTable:
    points = []

    def add(op, key, at, ms):
        points.append(Point(op, key, at, [ms * 0.99, ms, ms * 1.01]))

    for n in (1024, 1536, 4096):
        for k in (1024, 2048):
            for m in (1, 4, 16, 64):
                add("gemm", {"n": n, "k": k}, {"m": m}, gemm_ms(n, k, m))
    for moved in (1024, 2**30):
        add("elementwise", {}, {"bytes": moved}, elementwise_ms(moved))
    for kernels in (1, 64):
        add("graph", {}, {"kernels": kernels}, graph_ms(kernels))
    for paged in (False, True):
        for bkv in BKV:
            add("kv_append", {"head_dim": 128, "paged": paged}, {"batch_kv_heads": bkv},
                append_ms(bkv, paged))
    for collect, qs in (("off", (1, 2, 3, 5)), ("sum", (2, 3, 5)), ("all", (2, 3, 5)),
                        ("rows", (2, 3, 5))):
        for q in qs:
            for bkv in BKV:
                for c in CONTEXTS:
                    add("verify", {"head_dim": 128, "group": 4, "q": q, "collect": collect},
                        {"batch_kv_heads": bkv, "context": c}, verify_ms(q, collect, bkv, c))
    for per in (False, True):
        for bkv in BKV:
            for n in SELECTED:
                add("sparse", {"head_dim": 128, "group": 4, "per_kv_head": per},
                    {"batch_kv_heads": bkv, "selected": n}, sparse_ms(per, bkv, n))
    for policy, group, rows_list in (("vegas", 0, (0,)), ("last-token", 0, (0,)),
                                     ("sparsespec", 4, (3, 9, 16)), ("quest", 4, (0,))):
        for rows, s in itertools.product(rows_list, SELECTION_S):
            for lists in LISTS:
                for c in CONTEXTS:
                    add("selection", {"policy": policy, "group": group, "rows": rows, "s": s,
                                      "head_dim": 128 if policy == "quest" else 0},
                        {"lists": lists, "context": c},
                        selection_ms(policy, rows, lists, c, s))
    prov = {"gpu": "NVIDIA H200", "driver": "580", "cuda": "12.8", "torch": "2.13",
            "triton": "3.6", "kernel_config_hash": "abc", "date": "2026-12-02T00:00:00Z",
            "complete": True, "timing": "cuda graph replay",
            "engine": {"settings": DEFAULT.to_json(), "settings_hash": DEFAULT.stable_hash()}}
    table = OperatorTable(prov, {"copy_bandwidth_Bps": 4.3e12, "bf16_matmul_flops": 7e14},
                          points)
    if path is not None:
        table.write(str(path))
        table = read_operator_table(str(path))
    return table


@pytest.fixture
def model():
    return OperatorCostModel(synthetic_table(), SMALL, HW)


def by_hand_layers(tokens, elementwise_bytes_per_token):
    """The per-layer GEMMs and element-wise kernels of SMALL at ``tokens`` tokens, by hand:
    q|k|v (8 + 2·2)·128 = 1536 wide, o_proj, gate|up 2·2048, down."""
    gemms = (gemm_ms(1536, 1024, tokens) + gemm_ms(1024, 1024, tokens)
             + gemm_ms(4096, 1024, tokens) + gemm_ms(1024, 2048, tokens))
    # input norm 2h, q/k norm + rotary 2·(H + 2·KVH)·hd, residual + post norm 4h, SwiGLU 3I,
    # residual 3h, in bf16
    per_token = [2 * 1024, 2 * 12 * 128, 4 * 1024, 3 * 2048, 3 * 1024]
    assert elementwise_bytes_per_token is None or per_token == elementwise_bytes_per_token
    return gemms + sum(elementwise_ms(b * 2 * tokens) for b in per_token)


def by_hand_head(tokens):
    """Embedding, final norm, LM head (4096 × 1024), fp32 cast, greedy sampling, one graph."""
    return (elementwise_ms(2 * tokens * 1024 * 2) * 2 + gemm_ms(4096, 1024, tokens)
            + elementwise_ms(tokens * 4096 * 6) + elementwise_ms(tokens * 4096 * 4)
            + graph_ms(1))


def test_a_plain_step_is_the_sum_of_its_operators(model):
    batch, context = 4, 4096
    expected = 2 * (by_hand_layers(batch, None) + verify_ms(1, "off", batch * 2, context)
                    + append_ms(batch * 2, False)) + by_hand_head(batch)
    got = model.plain_step([context] * batch)
    assert got.seconds * 1e3 == pytest.approx(expected, rel=1e-9)
    # on the grid: nothing assumed, the source named
    assert got.notes[-1].startswith("operators (") and len(
        [n for n in got.notes if "measured" in n or "modelled" in n]) == 0


def test_verify_and_draft_steps_are_the_sums_of_theirs(model):
    batch, context, q = 4, 4096, 3
    tokens = batch * q
    # Vegas' verify collects its summed row; the q rows' K/V are written by the append
    # operator, once a layer
    expected = 2 * (by_hand_layers(tokens, None) + verify_ms(q, "sum", batch * 2, context)
                    + append_ms(batch * 2, False)) + by_hand_head(tokens)
    assert model.verify([context] * batch, q).seconds * 1e3 == pytest.approx(expected, rel=1e-9)
    # StreamingLLM's verify collects nothing: cheaper by the collection alone
    saved = 2 * (verify_ms(q, "sum", 8, context) - verify_ms(q, "off", 8, context))
    assert (model.verify([context] * 4, q).seconds
            - model.policy_verify([context] * 4, q, "streamingllm").seconds) * 1e3 == \
        pytest.approx(saved, rel=1e-9)
    # last-token's collects every row summed over the heads, SparseSpec-L's every head's rows
    for policy, collect in (("last-token", "rows"), ("sparsespec", "all")):
        extra = 2 * (verify_ms(q, collect, 8, context) - verify_ms(q, "sum", 8, context))
        assert (model.policy_verify([context] * 4, q, policy).seconds
                - model.verify([context] * 4, q).seconds) * 1e3 == \
            pytest.approx(extra, rel=1e-9)
    # a draft step attends to Vegas' selected positions (5% of 4096 → 256 ranked + 32 recent)
    selected = 288
    sparse = np.interp(selected, SELECTED, [sparse_ms(False, 8, n) for n in SELECTED])
    expected = 2 * (by_hand_layers(batch, None) + sparse + append_ms(8, False)) + \
        by_hand_head(batch)
    assert model.draft_step([context] * batch, 0.05, "vegas").seconds * 1e3 == \
        pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("policy", ["vegas", "quest"])
def test_a_fused_verify_append_is_one_launch_a_layer_and_keeps_quests_pages(policy):
    """As the engine runs now, a verify pass's q rows are written by the append operator at
    its batch · KV heads, once a layer, and Quest's page bounds with them (no element-wise
    recomputation of the pages); the retired torch writes, as older calibrations ran, keep
    both modelled as element-wise kernels. A calibration's steps are composed as its own
    engine wrote them."""
    from calibration_tables import MODEL, synthetic
    from specsim.costs.fitted import _rows

    batch, context, q = 4, 4096, 3
    kv_rows = batch * q * 2 * 128 * 2 * 2
    torch_writes = OperatorCostModel(synthetic_table(), SMALL, HW, verify_append="torch")
    fused = OperatorCostModel(synthetic_table(), SMALL, HW)
    assert fused.verify_append == "fused"
    ctx = [context] * batch
    saved = 2 * (3 * elementwise_ms(2 * kv_rows) - append_ms(batch * 2, policy == "quest"))
    if policy == "quest":       # 14 element-wise kernels a layer over the written pages' bounds
        saved += 2 * 14 * elementwise_ms(batch * 2 * 128 * 2 * 4)
    got = (torch_writes.policy_verify(ctx, q, policy).seconds
           - fused.policy_verify(ctx, q, policy).seconds) * 1e3
    assert got == pytest.approx(saved, rel=1e-9)
    # one position (plain and draft steps) is written alike either way
    assert fused.plain_step(ctx).seconds == torch_writes.plain_step(ctx).seconds
    # composed as each calibration ran: the same steps, priced by each one's setting
    cal = synthetic(batches=(4,), contexts=(4096,), qs=(1, 3))      # an older file: torch
    fused_cal = dataclasses.replace(cal, provenance={**cal.provenance, "engine": {
        **cal.provenance["engine"], "verify_append": "fused"}})
    verify_of = {}
    for c in (cal, fused_cal):
        _, points, _ = _rows(synthetic_table(), MODEL, c, HW)
        verify_of[engine_choices(c)["verify_append"]] = [p[1] for p in points["verify:vegas"]]
    # (q = 1 rows alike, the q = 3 rows cheaper where the calibration's verify was fused)
    pairs = list(zip(verify_of["torch"], verify_of["fused"]))
    assert all(t >= f for t, f in pairs)
    assert sum(t > f for t, f in pairs) == sum(m.op == "verify" and m.q > 1
                                               for m in cal.measurements) > 0


def test_selection_is_the_policys_operator_for_every_list(model):
    batch, context = 4, 16384
    # Vegas: one list per layer and sequence
    got = model.selection([context] * batch, 0.05, "vegas", 4)
    assert got.seconds * 1e3 == pytest.approx(selection_ms("vegas", 0, 2 * batch, context)
                                              + graph_ms(1), rel=1e-9)
    # SparseSpec-L: per layer, sequence and KV head, ranked by min(k + 1, 16) rows; at k = 3,
    # 4 rows: linear between the measured 3 and 9
    lists = 2 * batch * 2
    want = (selection_ms("sparsespec", 3, lists, context) * 5 / 6
            + selection_ms("sparsespec", 9, lists, context) / 6)
    got = model.selection([context] * batch, 0.05, "sparsespec", 3)
    assert got.seconds * 1e3 == pytest.approx(want + graph_ms(1), rel=1e-6)
    # at k = 1, 2 rows: below SparseSpec-L's measured rows, held at 3 (the other policies'
    # rows = 0 points are not its own), not left unmeasured
    got = model.selection([context] * batch, 0.05, "sparsespec", 1)
    assert got.seconds * 1e3 == pytest.approx(selection_ms("sparsespec", 3, lists, context)
                                              + graph_ms(1), rel=1e-6)
    assert any("rows=2 s=0.05 head_dim=0: held at the nearest measured rows=3" in n
               for n in got.notes)
    # last-token: its verify summed each row over the heads, so its refresh (the picked
    # row, then its ranking) is the measured operator at any number of heads
    at_lists = selection_ms("last-token", 0, 2 * batch, context)
    for heads in (8, 32):
        wide = OperatorCostModel(synthetic_table(), dataclasses.replace(SMALL, num_heads=heads),
                                 HW)
        assert wide.selection([context] * batch, 0.05, "last-token", 4).seconds * 1e3 == \
            pytest.approx(at_lists + graph_ms(1), rel=1e-9)
    # StreamingLLM and Quest refresh nothing; Quest scores its pages inside each draft step
    assert model.selection([context] * batch, 0.05, "streamingllm", 4).seconds == 0.0
    assert model.selection([context] * batch, 0.05, "quest", 4).seconds == 0.0
    quest = model.draft_step([context] * batch, 0.05, "quest").seconds
    assert quest - model.draft_step([context] * batch, 0.05, "sparsespec").seconds > \
        2 * selection_ms("quest", 0, batch * 2, context) / 1e3 * 0.5


@given(st.floats(0.01, 0.2))
def test_selection_follows_s_between_the_measured_and_holds_beyond(s):
    """The refresh sorts its s·C winners: priced linearly in s between the table's fractions
    (0.03, 0.1), held at the nearest beyond them, and said so."""
    model = OperatorCostModel(synthetic_table(), SMALL, HW)
    batch, context = 4, 16384
    got = model.selection([context] * batch, s, "vegas", 4)
    held = min(max(s, SELECTION_S[0]), SELECTION_S[-1])
    assert got.seconds * 1e3 == pytest.approx(
        selection_ms("vegas", 0, 2 * batch, context, held) + graph_ms(1), rel=1e-9)
    assert any("held at the nearest measured s=" in n for n in got.notes) == (held != s)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4096), min_size=2, max_size=6, unique=True),
       st.lists(st.integers(64, 1 << 18), min_size=2, max_size=6, unique=True),
       st.sampled_from(["vegas", "last-token", "sparsespec", "quest"]))
def test_the_sweep_times_a_selection_on_both_sides_of_every_path_switch(lists, contexts,
                                                                       policy):
    """Between two neighbouring points of a selection's sweep the radix ranking keeps one path
    (chunked or one program per row) but for a step of one list layout (8 lists) or one item
    (Quest: a page), so interpolating between them never mixes two paths; the grid's own
    points stay and nothing is added outside its range."""
    from specsim.kernels.topk_select import chunked_path
    from specsim.operator_sweep import LIST_STEP, OperatorGrid, selection_axes
    from specsim.policies import get_policy

    grid = OperatorGrid(selection_lists=lists, selection_contexts=contexts)
    got_lists, got_contexts = selection_axes(grid, policy)
    assert set(lists) <= set(got_lists) and set(contexts) <= set(got_contexts)
    assert min(got_lists) == min(lists) and max(got_lists) == max(lists)
    assert min(got_contexts) == min(contexts) and max(got_contexts) == max(contexts)
    page = get_policy(policy).page_size
    for a, b in itertools.pairwise(got_lists):
        for c in got_contexts:
            items = -(-c // page)
            assert chunked_path(a, items) == chunked_path(b, items) or b - a <= LIST_STEP
    for a, b in itertools.pairwise(got_contexts):
        for n in got_lists:
            assert chunked_path(n, -(-a // page)) == chunked_path(n, -(-b // page)) \
                or -(-b // page) - -(-a // page) <= 1


def test_the_default_sweep_spans_the_path_switches_it_times_around():
    """The shipped grid's lists and contexts cross the switch (so the added points matter):
    Qwen3-8B's 576 summed rows at batch 16 lie between the sides 520 and 2048, one program
    per row, not between 512 (chunked) and 2048."""
    from specsim.kernels.topk_select import CHUNKED_FROM, CHUNKED_ROWS
    from specsim.operator_sweep import OperatorGrid, selection_axes

    lists, contexts = selection_axes(OperatorGrid(), "vegas")
    assert CHUNKED_ROWS in lists and 520 in lists
    assert {CHUNKED_FROM, CHUNKED_FROM + 1} <= set(contexts)
    quest_contexts = selection_axes(OperatorGrid(), "quest")[1]
    assert {16 * CHUNKED_FROM, 16 * (CHUNKED_FROM + 1)} <= set(quest_contexts)


def test_an_older_table_times_its_selections_at_its_one_s(tmp_path):
    """A table measured before selections were keyed by s (its ``method.selection_s``, else
    0.05) reads with that s in their keys; other s are held at it, with a note."""
    table = synthetic_table()
    table.points = [p for p in table.points if p.op != "selection" or p.key["s"] == 0.1]
    doc = table.to_json()
    for row in doc["points"]:
        if row["op"] == "selection":
            del row["key"]["s"]
    for method, s in (({"selection_s": 0.1}, 0.1), (None, 0.05)):
        if method:
            doc["provenance"]["method"] = method
        else:
            doc["provenance"].pop("method", None)
        path = tmp_path / f"old-{s}.json"
        path.write_text(json.dumps(doc))
        old = read_operator_table(str(path))
        assert {p.key["s"] for p in old.points if p.op == "selection"} == {s}
    old = OperatorCostModel(read_operator_table(str(tmp_path / "old-0.1.json")), SMALL, HW)
    got = old.selection([16384] * 4, 0.03, "vegas", 4)
    assert got.seconds * 1e3 == pytest.approx(
        selection_ms("vegas", 0, 8, 16384, 0.1) + graph_ms(1), rel=1e-9)
    assert any("held at the nearest measured s=0.1" in n for n in got.notes)


@pytest.mark.parametrize("policy", ["vegas", "sparsespec", "quest", "streamingllm",
                                    "last-token"])
def test_every_cost_grows_with_batch_and_context(model, policy):
    """Inside and beyond the measured ranges: never cheaper for more sequences or longer
    ones."""
    batches, contexts = (1, 2, 4, 8, 16, 64), (512, 2048, 8192, 32768, 131072, 262144)

    def costs(b, c):
        ctx = [c] * b
        it = model.iteration(ctx, 4, 0.05, policy)
        return np.array([model.plain_step(ctx).seconds, it.verify.seconds,
                         it.draft_step.seconds, it.selection.seconds, it.seconds])

    table = np.array([[costs(b, c) for c in contexts] for b in batches])
    assert np.all(np.diff(table, axis=0) >= -1e-15)
    assert np.all(np.diff(table, axis=1) >= -1e-15)


def test_what_lies_outside_the_measured_ranges_says_so(model):
    inside = model.plain_step([4096] * 4)
    beyond = model.plain_step([262144] * 4)
    assert not any("beyond" in n for n in inside.notes)
    assert any("verify head_dim=128 group=4 q=1 collect=off: beyond the measured range" in n
               for n in beyond.notes)
    # a model of other widths: a GEMM beyond the measured widths grows as its roofline
    wide = OperatorCostModel(synthetic_table(), ModelSpec(
        "wide", "llama", 2, 1024, 8, 2, 128, 8192, 4096, layer_types=("full_attention",) * 2),
        HW)
    notes = wide.plain_step([4096] * 4).notes
    assert any("gemm n=16384 k=1024: beyond the measured widths" in n for n in notes)
    # an unmeasured group: between measured ones, else the nearest, said
    odd = OperatorCostModel(synthetic_table(), ModelSpec(
        "odd", "llama", 2, 1024, 12, 2, 128, 2048, 4096, layer_types=("full_attention",) * 2),
        HW)
    assert any("held at the nearest measured group=4" in n
               for n in odd.plain_step([4096] * 4).notes)


def test_an_unmeasured_q_reads_the_points_of_its_own_collection(model):
    """A verify pass at a q its collection was not measured at reads that collection's
    points, never another's: q = 1 collecting the summed row (measured from q = 2; q = 1 only
    collecting nothing) is held at q = 2, not priced as bytes over the bandwidth; q = 4 lies
    halfway between q = 3 and 5."""
    batch, context = 4, 4096
    m = model.model

    def point(q, collect):
        got = model._at_key("verify", (m.head_dim, m.group_size, q, collect),
                            (batch * m.num_kv_heads, context))
        assert got is not None
        return got[0]

    held, notes = model._attention(1, "sum", batch, context)
    assert held == point(2, "sum") and held != point(1, "off")
    assert any("q=1 collect=sum: held at the nearest measured q=2" in n for n in notes)
    assert not any("not measured" in n for n in notes)
    between, _ = model._attention(4, "sum", batch, context)
    assert between == pytest.approx((point(3, "sum") + point(5, "sum")) / 2, rel=1e-12)
    assert model._attention(1, "off", batch, context)[0] == point(1, "off")
    with pytest.raises(SpecsimError, match="expected fused or torch"):
        OperatorCostModel(synthetic_table(), SMALL, HW, verify_append="fuse")


def test_quests_page_scoring_is_read_at_the_models_head_dim(tmp_path):
    """Quest scores page bounds as wide as the model's heads: a model of head_dim 64 reads the
    scoring points measured at 64 where the table has them, else is held at 128 and says so;
    an older table, whose selection keys lack head_dim, reads Quest's at 128 and the others'
    at 0."""
    hd64 = dataclasses.replace(SMALL, head_dim=64)
    table = synthetic_table()
    held = OperatorCostModel(table, hd64, HW)._selection_op("quest", 8, 16384, 0, 0.05)
    assert held[0] == OperatorCostModel(table, SMALL, HW)._selection_op(
        "quest", 8, 16384, 0, 0.05)[0]
    assert any("head_dim=64: held at the nearest measured head_dim=128" in n for n in held[1])
    halved = [dataclasses.replace(p, key={**p.key, "head_dim": 64},
                                  samples_ms=[t / 2 for t in p.samples_ms])
              for p in table.points if p.op == "selection" and p.key["policy"] == "quest"]
    both = dataclasses.replace(table, points=table.points + halved)
    own = OperatorCostModel(both, hd64, HW)._selection_op("quest", 8, 16384, 0, 0.05)
    assert own[0] == pytest.approx(held[0] / 2, rel=1e-12) and not any("held" in n
                                                                         for n in own[1])
    synthetic_table(tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    for row in doc["points"]:
        if row["op"] == "selection":
            del row["key"]["head_dim"]
    (tmp_path / "older.json").write_text(json.dumps(doc))
    older = read_operator_table(str(tmp_path / "older.json"))
    assert {(p.key["policy"], p.key["head_dim"]) for p in older.points if p.op == "selection"} \
        == {("vegas", 0), ("last-token", 0), ("sparsespec", 0), ("quest", 128)}


def test_a_gemm_between_measured_widths_lies_between_them(model):
    lo, _ = model.gemm(16, 1024, 1024)
    mid, notes = model.gemm(16, 1280, 1024)
    hi, _ = model.gemm(16, 1536, 1024)
    assert lo < mid < hi and not any("outside" in n for n in notes)


def gemm_only(time_of) -> OperatorCostModel:
    """A cost model over a table of GEMMs alone, timed by ``time_of(n, k, m)`` seconds, on
    widths 512..4096 (powers of two) and m 1..64."""
    points = [Point("gemm", {"n": n, "k": k}, {"m": m}, [time_of(n, k, m) * 1e3] * 3)
              for n in (512, 1024, 2048, 4096) for k in (512, 1024, 2048, 4096)
              for m in (1, 4, 16, 64)]
    prov = dict(synthetic_table().provenance)
    return OperatorCostModel(OperatorTable(prov, synthetic_table().probe, points), SMALL, HW)


def test_a_gemm_between_widths_is_exact_where_time_is_its_bytes_or_its_launch():
    """Log time over log widths: a time proportional to n·k (a decode GEMM reading its
    weights), or flat (launch-bound), is priced exactly between measured widths."""
    bytes_bound = gemm_only(lambda n, k, m: 3e-12 * n * k * (1 + m / 64))
    launch = gemm_only(lambda n, k, m: 4e-6)
    for n, k in ((2560, 768), (640, 3000), (1536, 1536)):
        for m in (1, 16, 40):
            assert bytes_bound.gemm(m, n, k)[0] == pytest.approx(3e-12 * n * k * (1 + m / 64))
            assert launch.gemm(m, n, k)[0] == pytest.approx(4e-6)


def test_a_gemm_narrower_than_measured_is_held_and_a_wider_one_grows_as_its_floor():
    model = gemm_only(lambda n, k, m: 2e-6 + 3e-12 * n * k)
    # an MoE router (n = 32): never cheaper than the narrowest GEMM measured
    held, notes = model.gemm(4, 32, 1024)
    assert held == pytest.approx(model.gemm(4, 512, 1024)[0])
    assert any("below the measured widths, the time at n=512 k=1024 held" in n for n in notes)
    # an LM head (n far beyond): the widest measured time grown by its bytes
    wide, notes = model.gemm(4, 65536, 2048)
    edge = model.gemm(4, 4096, 2048)[0]
    ratio = model._gemm_roof(4, 65536, 2048) / model._gemm_roof(4, 4096, 2048)
    assert wide == pytest.approx(edge * ratio) and ratio > 10
    assert any("beyond the measured widths" in n for n in notes)


def test_a_corner_the_grid_skipped_is_its_nearest_shape_grown():
    """Widths on either side of a shape whose weight is over the sweep's cap (so the table
    lacks it): that corner is its nearest measured shape grown by its bytes, so the price
    still rises across it, and says so."""
    full = gemm_only(lambda n, k, m: 3e-12 * n * k)
    table = full.table
    holed = OperatorCostModel(OperatorTable(table.provenance, table.probe, [
        p for p in table.points if (p.key["n"], p.key["k"]) != (4096, 4096)]), SMALL, HW)
    prices = [holed.gemm(4, 3000, k)[0] for k in (2048, 2500, 3000, 3500, 4000)]
    assert all(b > a for a, b in zip(prices, prices[1:]))
    assert prices[-1] == pytest.approx(full.gemm(4, 3000, 4000)[0], rel=0.02)
    assert any("gemm n=4096 k=4096 not measured: n=4096 k=2048 scaled" in n
               or "gemm n=4096 k=4096 not measured: n=2048 k=4096 scaled" in n
               for n in holed.gemm(4, 3000, 3000)[1])


@given(n=st.integers(300, 6000), k=st.integers(300, 6000), dn=st.integers(1, 2000),
       dk=st.integers(0, 2000), m=st.sampled_from([1, 3, 16, 50]))
@settings(max_examples=60, deadline=None)
def test_a_gemm_costs_no_less_for_more_weights(n, k, dn, dk, m):
    """Priced time never falls as n or k grows, over a table rising in both above a launch
    floor, inside the measured widths, below and beyond them."""
    model = gemm_only(lambda n_, k_, m_: 3e-6 + 2e-12 * n_ * k_ * (1 + m_ / 32))
    base = model.gemm(m, n, k)[0]
    assert model.gemm(m, n + dn, k + dk)[0] >= base * (1 - 1e-9)


# ---- the file ------------------------------------------------------------------------------
def test_a_table_reads_back_as_written(tmp_path):
    table = synthetic_table(tmp_path / "h200.json")
    assert table.settings == DEFAULT and len(table.points) == len(synthetic_table().points)
    doc = json.loads((tmp_path / "h200.json").read_text())
    assert doc["specsim_operators"] == 1 and doc["points"][0]["samples_ms"]
    assert OperatorCostModel(table, SMALL, HW).plain_step([4096] * 4).seconds == \
        OperatorCostModel(synthetic_table(), SMALL, HW).plain_step([4096] * 4).seconds


@pytest.mark.parametrize("written", ["torch", "fused"])
def test_a_table_written_while_verify_append_was_a_setting_reads(tmp_path, written):
    """A table whose settings object names the since-retired verify_append, hashed as files
    were then (the setting left out at its old value torch), reads with the engine's
    settings; a hash that matches neither form is still refused."""
    import hashlib

    synthetic_table(tmp_path / "h200.json")
    doc = json.loads((tmp_path / "h200.json").read_text())
    settings = {**DEFAULT.to_json(), "verify_append": written}
    hashed = {k: v for k, v in settings.items() if (k, v) != ("verify_append", "torch")}
    text = json.dumps(hashed, sort_keys=True, separators=(",", ":"))
    doc["provenance"]["engine"] = {"settings": settings,
                                   "settings_hash": hashlib.sha256(text.encode()).hexdigest()[:16]}
    (tmp_path / "old.json").write_text(json.dumps(doc))
    table = read_operator_table(str(tmp_path / "old.json"))
    assert table.settings == DEFAULT
    doc["provenance"]["engine"]["settings_hash"] = DEFAULT.stable_hash() if written == "fused" \
        else "0" * 16
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(SpecsimError, match="settings_hash does not match"):
        read_operator_table(str(tmp_path / "bad.json"))


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("probe"), "missing probe"),
    (lambda d: d["probe"].update(copy_bandwidth_Bps=0), "probe.copy_bandwidth_Bps"),
    (lambda d: d["provenance"].pop("gpu"), "provenance lacks gpu"),
    (lambda d: d["provenance"]["engine"].update(settings_hash="0"), "settings_hash"),
    (lambda d: d["provenance"]["engine"]["settings"].update(c2q="both"), "c2q"),
    (lambda d: d["points"][3].update(op="conv"), r"points\[3\]\.op: unknown operator"),
    (lambda d: d["points"][0]["key"].pop("n"), r"points\[0\]\.key must hold n, k"),
    (lambda d: d["points"][0]["at"].update(m=-1), r"points\[0\]\.at\.m must be a positive"),
    (lambda d: d["points"][0].update(samples_ms=[]), r"points\[0\]\.samples_ms"),
    (lambda d: d["points"][0].update(samples_ms=[1e300]), r"samples_ms .* \[0, 60000\] ms"),
    (lambda d: d.update(specsim_operators=2), "expected \"specsim_operators\": 1"),
])
def test_a_bad_table_is_one_line_naming_the_field(tmp_path, change, message):
    path = tmp_path / "t.json"
    synthetic_table(path)
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecsimError, match=message) as err:
        read_operator_table(str(path))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


# ---- the source order ----------------------------------------------------------------------
@pytest.fixture
def catalogue(tmp_path, monkeypatch):
    """A user's catalogue with an H200 operator table and a model nothing calibrates."""
    root = tmp_path / "models"
    shutil.copytree(shipped_root("models") / "hardware", root / "hardware")
    shutil.copytree(shipped_root("models") / "llama-3.2-3b", root / "my-llama")
    (root / "operators").mkdir()
    synthetic_table(root / "operators" / "h200.json")
    monkeypatch.setenv("SPECSIM_MODELS", str(root))
    return root


def test_sources_are_tried_calibration_then_operators_then_scaled_then_roofline(catalogue):
    calibrated = resolve_cost_source(load_model("qwen3-8b"), load_hardware("h200"))
    assert calibrated.kind == "calibration" and calibrated.fallback is None
    operators = resolve_cost_source(load_model("my-llama"), load_hardware("h200"))
    assert operators.kind == "operators" and operators.cost_model.name == "operators"
    assert operators.path.endswith("operators/h200.json")
    assert "composed from measured operators" in operators.note
    assert "not calibrated: no calibration shipped" in operators.note
    assert operators.fallback == "no calibration shipped"
    scaled = resolve_cost_source(load_model("my-llama"), load_hardware("a100-80gb"))
    assert scaled.kind == "scaled-operators" and scaled.path.endswith("operators/h200.json")
    assert "no operator table shipped for 'a100-80gb'" in scaled.note
    # forced, and given as a path
    forced = resolve_cost_source(load_model("qwen3-8b"), load_hardware("h200"),
                                 costs="operators")
    assert forced.kind == "operators" and forced.cost_model.model.name == "qwen3-8b"
    given = resolve_cost_source(load_model("qwen3-8b"), load_hardware("h200"),
                                costs=str(catalogue / "operators" / "h200.json"))
    assert given.kind == "operators"
    assert resolve_cost_source(load_model("my-llama"), load_hardware("a100-80gb"),
                               costs="operators").kind == "scaled-operators"
    tp = resolve_cost_source(load_model("my-llama"), load_hardware("h200"), tp=2)
    assert tp.kind == "roofline" and "tensor parallelism" in tp.note
    with pytest.raises(SpecsimError, match="no shipped operator table for 'h200' at tp=1"):
        resolve_cost_source(load_model("my-llama"), load_hardware("h200"), tp=2,
                            costs="operators")


def test_without_any_operator_table_the_roofline_answers(monkeypatch):
    """No table for the hardware and none to scale: the resolver answers as before tables."""
    from specsim.costs import source
    monkeypatch.setattr(source, "shipped_operator_table", lambda hardware: None)
    monkeypatch.setattr(source, "other_gpu_table", lambda hardware: None)
    got = resolve_cost_source(load_model("llama-3.2-3b"), load_hardware("a100-80gb"))
    assert got.kind == "roofline" and got.fallback == "no calibration shipped"


# ---- the sweep on the CPU ------------------------------------------------------------------
#: The tests of the one sweep run on one pytest-xdist worker, which measures it once.
ON_THE_SWEEP = pytest.mark.xdist_group("operator-sweep")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    import torch

    from specsim.operator_sweep import OperatorGrid, measure_operators
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("sweep") / "cpu.json"
    try:
        table = measure_operators(OperatorGrid.tiny(), str(path), progress=False)
    finally:
        torch.set_num_threads(threads)
    return path, table


@ON_THE_SWEEP
def test_the_sweep_writes_a_table_that_prices_a_model(swept):
    path, table = swept
    back = read_operator_table(str(path))
    assert back.provenance["complete"] and back.provenance["groups_left"] == 0
    assert back.provenance["engine"]["settings_hash"] == DEFAULT.stable_hash()
    assert {p.op for p in back.points} == {"gemm", "grouped_gemm", "moe_routing",
                                            "elementwise", "graph", "kv_append", "verify",
                                            "sparse", "selection", "prefill_attention"}
    assert all(len(p.samples_ms) == 2 for p in back.points)
    tiny = ModelSpec("tiny", "llama", 2, 128, 8, 2, 64, 128, 128,
                     layer_types=("full_attention",) * 2)
    cm = OperatorCostModel(back, tiny, HW)
    plain = cm.plain_step([100, 100])
    assert plain.seconds > 0 and plain.notes[0].startswith("operators (")
    prefill = cm.prefill([40, 20], [0, 30])
    assert prefill.seconds > 0 and not any("prefill_attention" in n for n in prefill.notes)
    parts, _ = cm.forward_parts([100, 100], 1)
    assert set(parts) >= {"gemm qkv", "attention", "kv append", "elementwise", "graph replay"}
    for policy in ("vegas", "sparsespec", "quest"):
        it = cm.iteration([100, 100], 2, 0.1, policy)
        assert it.seconds > 0 and not any("roofline" in n for n in it.draft_step.notes)
    # a policy whose selection the table lacks is the roofline's, and says so
    missing = cm.selection([100, 100], 0.1, "last-token", 2)
    assert missing.seconds == cm.roofline.selection([100, 100], 0.1, "last-token", 2).seconds
    assert ("selection policy=last-token group=0 rows=0 s=0.1 head_dim=0 not measured: "
            "roofline model") in missing.notes


@ON_THE_SWEEP
def test_the_sweep_resumes_its_own_table_and_refuses_another(swept, tmp_path, monkeypatch):
    import specsim.operator_sweep as S

    shared, table = swept
    path = tmp_path / "ops.json"            # the resume writes: the shared table stays as swept
    path.write_bytes(shared.read_bytes())
    monkeypatch.setattr(S, "MEASURES", {})         # a complete table measures nothing more
    again = S.measure_operators(S.OperatorGrid.tiny(), str(path), progress=False)
    assert len(again.points) == len(table.points) and again.provenance["resumed"]
    assert len(again.provenance["group_seconds"]) == len(S._groups(S.OperatorGrid.tiny()))
    # a grid that adds groups resumes, measuring only those
    wider = S.OperatorGrid.tiny()
    wider.qs = [1, 2, 3]
    measured = []
    monkeypatch.setattr(S, "MEASURES", {op: lambda *a, op=op: measured.append(op) or []
                                        for op in ("verify",)})
    S.measure_operators(wider, str(path), progress=False)
    assert measured == ["verify"] * (len(S._groups(wider)) - len(S._groups(S.OperatorGrid.tiny())))
    # an older table, its selections timed at its method's one s, resumes: the grid's s are
    # new groups
    doc = json.loads(path.read_text())
    doc["provenance"]["method"]["selection_s"] = 0.05
    del doc["provenance"]["engine"]["best_ranking"]    # older: best as it resolved then
    for row in doc["points"]:
        if row["op"] == "selection":
            del row["key"]["s"]
    older = tmp_path / "older.json"
    older.write_text(json.dumps(doc))
    keys = []
    monkeypatch.setattr(S, "MEASURES", {"selection": lambda *a: keys.append(a[-2]) or []})
    import specsim.policies as P
    monkeypatch.setattr(P, "BEST_RANKING", P.LEGACY_BEST_RANKING)     # as it resolved then
    resumed = S.measure_operators(S.OperatorGrid.tiny(), str(older), progress=False)
    assert sorted(k["s"] for k in keys) == sorted(
        g[1]["s"] for g in S._groups(S.OperatorGrid.tiny()) if g[0] == "selection")
    assert {p.key["s"] for p in resumed.points if p.op == "selection"} == {0.05}
    # once "best" resolves otherwise, only a run that re-measures the selections resumes
    flipped = {p: "topk" if how == "radix" else "radix"
               for p, how in P.LEGACY_BEST_RANKING.items()}
    monkeypatch.setattr(P, "BEST_RANKING", flipped)
    with pytest.raises(SpecsimError, match=r"measured otherwise \(engine\)"):
        S.measure_operators(S.OperatorGrid.tiny(), str(older), progress=False)
    again = S.measure_operators(S.OperatorGrid.tiny(), str(older), progress=False,
                                only=("selection",))
    assert again.provenance["engine"]["best_ranking"] == flipped
    monkeypatch.undo()
    # one that times points otherwise is refused
    other = S.OperatorGrid.tiny()
    other.repeats = 3
    with pytest.raises(SpecsimError, match=r"measured otherwise \(method\)"):
        S.measure_operators(other, str(path), progress=False)


@ON_THE_SWEEP
def test_only_remeasures_those_operators_and_keeps_the_others(swept, tmp_path, monkeypatch):
    import specsim.operator_sweep as S

    path, table = swept
    copy = tmp_path / "ops.json"
    copy.write_bytes(path.read_bytes())
    measured = []

    def fake(torch, device, timer, grid, settings, key, ats):
        measured.append(key["policy"])
        return [(at, [1.0, 1.0]) for at in ats]

    monkeypatch.setattr(S, "MEASURES", dict(S.MEASURES, selection=fake))
    again = S.measure_operators(S.OperatorGrid.tiny(), str(copy), progress=False,
                                only=("selection",))
    selections = [g for g in S._groups(S.OperatorGrid.tiny()) if g[0] == "selection"]
    assert len(measured) == len(selections)
    assert {p.median_ms for p in again.points if p.op == "selection"} == {1.0}
    kept = [p.to_json() for p in again.points if p.op != "selection"]
    assert kept == [p.to_json() for p in table.points if p.op != "selection"]
    assert again.provenance["remeasured"][-1]["operators"] == ["selection"]
    assert "kernel_config_hash_before" not in again.provenance["remeasured"][-1]
    assert again.provenance["complete"]
    # after a change to the kernels' source only a run naming its operators resumes the table
    monkeypatch.setattr(S, "_kernel_hash", lambda: "changed")
    with pytest.raises(SpecsimError, match=r"measured otherwise \(kernel_config_hash\)"):
        S.measure_operators(S.OperatorGrid.tiny(), str(copy), progress=False)
    after = S.measure_operators(S.OperatorGrid.tiny(), str(copy), progress=False,
                                only=("selection",))
    assert after.provenance["kernel_config_hash"] == "changed"
    assert after.provenance["remeasured"][-1]["kernel_config_hash_before"] == \
        again.provenance["kernel_config_hash"]
    with pytest.raises(SpecsimError, match="unknown operator"):
        S.measure_operators(S.OperatorGrid.tiny(), str(copy), progress=False, only=("moe",))


def grouped_ms(n, k, rows, groups):
    return 0.006 + groups * n * k * 2 / 3e9 + rows * (n + k) * 2 / 3e9


def test_an_moe_model_is_priced_by_the_grouped_gemm_where_the_table_has_it():
    """Routed experts: the grouped GEMM of the token-expert pairs over the touched experts
    (uniform routing), linear in (pairs per touched expert, touched experts) between the
    measured points; without the operator, one GEMM per touched expert."""
    import dataclasses

    from specsim.costs.operator_file import Point

    moe = dataclasses.replace(SMALL, name="small-moe", num_experts=16, experts_per_token=4,
                              moe_intermediate_size=512)
    bare = synthetic_table()
    table = synthetic_table()
    for n, k in ((1024, 1024), (1024, 512), (512, 1024)):
        for groups in (4, 16):
            for per in (1, 4, 16):
                ms = grouped_ms(n, k, per * groups, groups)
                table.points.append(Point("grouped_gemm", {"n": n, "k": k},
                                          {"rows": per * groups, "groups": groups},
                                          [ms, ms, ms]))
    grouped = OperatorCostModel(table, moe, HW)
    parts, _ = grouped.forward_parts([4096] * 2, 1)
    tokens, a, e = 2, 4, 16
    touched = e * (1 - (1 - a / e) ** tokens)
    per = tokens * a / touched
    # gate|up is 2·512 = 1024 wide over k = 1024 (measured): bilinear in (per, touched)
    assert "grouped gemm gate_up" in parts and "gemm gate_up" not in parts
    w_per = (per - 1) / (4 - 1)
    w_touched = (touched - 4) / (16 - 4)

    def at_touched(p):
        return (1 - w_touched) * grouped_ms(1024, 1024, 4 * p, 4) + \
            w_touched * grouped_ms(1024, 1024, 16 * p, 16)

    expected = (1 - w_per) * at_touched(1) + w_per * at_touched(4)
    assert parts["grouped gemm gate_up"] == pytest.approx(expected / 1e3 * moe.num_layers)
    assert any("as the engine's grouped GEMM" in w for w in grouped.warnings)
    loop = OperatorCostModel(bare, moe, HW)
    parts, _ = loop.forward_parts([4096] * 2, 1)
    assert "gemm gate_up" in parts and "grouped gemm gate_up" not in parts
    assert any("the table lacks the engine's grouped GEMM" in w for w in loop.warnings)


def test_a_grouped_gemm_table_of_the_older_layout_is_read_on_its_own_axes_with_a_note():
    """Points of fewer pairs than experts (an older sweep: only ``rows`` experts got a pair)
    are read on the file's (pairs, experts) axes, and the answer says to re-measure them."""
    import dataclasses

    from specsim.costs.operator_file import Point

    moe = dataclasses.replace(SMALL, name="small-moe", num_experts=16, experts_per_token=4,
                              moe_intermediate_size=512)
    table = synthetic_table()
    for rows, groups, ms in ((8, 8, 0.010), (8, 32, 0.012), (64, 8, 0.020), (64, 32, 0.050)):
        table.points.append(Point("grouped_gemm", {"n": 1024, "k": 1024},
                                  {"rows": rows, "groups": groups}, [ms] * 3))
    priced = OperatorCostModel(table, moe, HW)
    seconds, notes = priced.grouped_gemm(64, 20, 1024, 1024)
    assert seconds == pytest.approx(0.035e-3)
    assert any("older layout" in n and "--only grouped_gemm" in n for n in notes)
    assert priced.grouped_gemm(8, 8, 1024, 1024)[0] == pytest.approx(0.010e-3)


def test_a_grouped_gemm_between_widths_is_read_on_log_time_as_a_gemm_is():
    """Expert widths off the grid (Qwen3-30B-A3B's down projection, 2048 x 768): log time
    over log widths at the same (pairs per expert, experts) point, exact where the time is
    the touched experts' weight bytes; beyond the widest measured width grown by its floor."""
    import dataclasses

    from specsim.costs.operator_file import Point

    moe = dataclasses.replace(SMALL, name="small-moe", num_experts=16, experts_per_token=4,
                              moe_intermediate_size=512)
    table = synthetic_table()

    def weights_ms(n, k, groups):
        return groups * n * k * 2 / 3e9

    for n in (512, 1024, 2048):
        for k in (512, 1024, 2048):
            for groups in (4, 16):
                for per in (1, 16):
                    table.points.append(Point("grouped_gemm", {"n": n, "k": k},
                                              {"rows": per * groups, "groups": groups},
                                              [weights_ms(n, k, groups)] * 3))
    priced = OperatorCostModel(table, moe, HW)
    for n, k in ((2048, 768), (768, 1536), (1536, 1536)):
        seconds, notes = priced.grouped_gemm(8 * 16, 16, n, k)
        assert seconds == pytest.approx(weights_ms(n, k, 16) / 1e3)
    wide, notes = priced.grouped_gemm(16, 16, 4096, 1024)
    assert wide > priced.grouped_gemm(16, 16, 2048, 1024)[0]
    assert any("beyond the measured widths" in n for n in notes)


def test_an_moe_layer_is_priced_with_its_measured_routing():
    """Routing, dispatch and combine per MoE layer: measured, linear between the measured
    experts, top and hidden around the model's and in the tokens; unmeasured, six element-wise
    kernels and a note that says so."""
    import dataclasses

    from specsim.costs.operator_file import Point

    def routing_ms(experts, top, hidden, tokens):
        return 0.02 + 1e-4 * experts + 3e-3 * top + 1e-6 * hidden * tokens

    moe = dataclasses.replace(SMALL, name="small-moe", num_experts=16, experts_per_token=4,
                              moe_intermediate_size=512)
    table = synthetic_table()
    for e in (8, 32):
        for top in (2, 8):
            for h in (512, 4096):
                table.points += [Point("moe_routing", {"experts": e, "top": top, "hidden": h},
                                       {"tokens": t}, [routing_ms(e, top, h, t)] * 3)
                                 for t in (1, 16)]
    priced = OperatorCostModel(table, moe, HW)
    seconds, notes = priced.moe_routing(2, 16, 4, moe.hidden_size)
    # every function above is linear in each argument: the interpolation is exact
    assert seconds == pytest.approx(routing_ms(16, 4, moe.hidden_size, 2) / 1e3)
    parts, _ = priced.forward_parts([4096] * 2, 1)
    assert parts["moe routing"] == pytest.approx(seconds * moe.num_layers)
    bare = OperatorCostModel(synthetic_table(), moe, HW)
    seconds, notes = bare.moe_routing(2, 16, 4, moe.hidden_size)
    assert seconds > 0 and any("moe_routing not measured" in n for n in notes)


def test_calibrate_gpu_operators_measures_into_out(tmp_path, monkeypatch):
    """The command's wiring, its sweep run on the CPU (the tiny grid at one key of each
    operator: ``swept`` measures all of it): the table written to --out, --repeats given sets
    the samples per point, --operators alone is refused."""
    import functools

    import torch
    from click.testing import CliRunner

    import specsim.operator_sweep as S
    from specsim.cli import calibrate_cmd
    from specsim.cli.main import cli

    out = tmp_path / "ops.json"
    tiny = S.OperatorGrid.tiny
    monkeypatch.setattr(S, "OperatorGrid", lambda: dataclasses.replace(
        tiny(), groups=[2], qs=[1], collects=["off"], batch_kv_heads=[2], contexts=[64],
        selected=[16], selection_policies=["vegas"], selection_lists=[2],
        selection_contexts=[64]))
    monkeypatch.setattr(S, "measure_operators",
                        functools.partial(S.measure_operators, device="cpu", progress=False))
    monkeypatch.setattr(calibrate_cmd, "_require_cuda", lambda: None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = CliRunner().invoke(cli, ["calibrate", "--gpu", "--operators", "--repeats", "3",
                                       "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert got.exit_code == 0, got.output
    table = read_operator_table(str(out))
    assert f"wrote {len(table.points)} operator points to {out}" in got.output
    assert {len(p.samples_ms) for p in table.points} == {3}
    assert {p.op for p in table.points} == set(S.MEASURES)
    refused = CliRunner().invoke(cli, ["calibrate", "--operators", "--out", str(out)])
    assert refused.exit_code != 0


def test_the_timer_cycles_through_copies_of_the_inputs():
    """Back-to-back calls read distinct copies of their inputs (a model's layers each read
    their own), enough of them to exceed the L2 cache, at most one per timed call."""
    import torch

    from specsim.operator_sweep import ROTATE_BYTES, OperatorGrid, _Timer, copies

    grid = OperatorGrid(repeats=2, warmup=0, inner=6)
    for footprint in (1, 2**20, 2**26, 2**30):
        n = copies(footprint, grid)
        assert 1 <= n <= grid.graph_inner
        assert n == grid.graph_inner or n * footprint >= ROTATE_BYTES
    called = []
    got = _Timer(torch, torch.device("cpu"))([lambda: called.append(0),
                                               lambda: called.append(1)], grid)
    assert len(got) == 2 and called == [0, 1] * 6


def test_a_table_not_timed_as_the_engine_runs_says_so():
    table = synthetic_table()
    table.provenance["timing"] = "wall clock"
    table.provenance["timed_eagerly"] = ["gemm {'n': 1024, 'k': 1024}: RuntimeError"]
    warnings = OperatorCostModel(table, SMALL, HW).warnings
    assert any("timed by wall clock" in w for w in warnings)
    assert any("1 operator(s) timed eagerly" in w for w in warnings)
    assert OperatorCostModel(synthetic_table(), SMALL, HW).warnings == []


def test_composition_error_scores_each_measured_step_against_its_composed_price(tmp_path):
    """``calibrate --check CAL --compose TABLE``: every plain, verify, draft and selection row
    of the calibration priced from the operators, error = composed / measured − 1; loop
    overheads are not composed."""
    from click.testing import CliRunner

    from calibration_tables import MODEL, synthetic
    from specsim.cli.main import cli
    from specsim.costs.composition import composed_step, composition_error

    cal = synthetic(batches=(1, 4), contexts=(4096, 16384), qs=(1, 3))
    om = OperatorCostModel.as_calibrated(synthetic_table(), MODEL, HW, cal)   # as it ran
    report = composition_error(cal, om)
    assert set(report["per_op"]) == {"plain", "verify", "draft:vegas", "selection:vegas"}
    assert len(report["points"]) == len(cal.measurements)
    row = next(m for m in cal.measurements if m.op == "verify" and m.q == 3 and m.batch == 4)
    want = om.verify([row.context] * 4, 3).seconds / (row.median_ms / 1e3) - 1
    assert composed_step(om, "verify", 4, row.context, 3) == om.verify([row.context] * 4,
                                                                       3).seconds
    assert any(p["error"] == pytest.approx(want) for p in report["points"])
    errors = [p["error"] for p in report["points"] if p["op"] == "plain"]
    assert report["per_op"]["plain"]["mape"] == pytest.approx(np.mean(np.abs(errors)))
    cal_path, table_path = tmp_path / "cal.json", tmp_path / "ops.json"
    cal.write(str(cal_path))
    synthetic_table(table_path)
    got = CliRunner().invoke(cli, ["calibrate", "--check", str(cal_path), "--compose",
                                   str(table_path), "--json"])
    assert got.exit_code == 0, got.output
    doc = json.loads(got.output)
    assert doc["fitted"]["all"]["points"] == len(cal.measurements)
    assert doc["operators_alone"]["all"] == pytest.approx(report["all"], rel=1e-4)
    # residuals fitted on the other shipped H200 calibrations, never this model's own
    assert doc["fitted_on"] and MODEL.name not in doc["fitted_on"]
    assert CliRunner().invoke(cli, ["calibrate", "--gpu", "--compose", str(table_path),
                                    "--out", "x"]).exit_code != 0


def test_window_layers_are_priced_as_the_engine_runs_them():
    """A sliding-window layer (gpt-oss) runs the verify kernel over its rows' last W + q − 1
    keys, collecting nothing, and drafts with the same kernel over its window W (not the
    policy's lists); full layers are priced as before."""
    import dataclasses

    from specsim.policies import get_policy

    windowed = dataclasses.replace(SMALL, layer_types=("sliding_attention", "full_attention"),
                                   sliding_window=2048)
    cm = OperatorCostModel(synthetic_table(), windowed, HW)
    batch, context, q = 4, 16384, 3
    parts, _ = cm.forward_parts([context] * batch, q, collect="sum")
    assert parts["attention"] * 1e3 == pytest.approx(
        verify_ms(q, "sum", 8, context) + verify_ms(q, "off", 8, 2048 + q - 1), rel=1e-9)
    parts, _ = cm.forward_parts([context] * batch, 1, draft="vegas", s=0.05)
    selected = float(get_policy("vegas").selected_array(np.array([context]), 0.05)[0])
    sparse = np.interp(selected, SELECTED, [sparse_ms(False, 8, n) for n in SELECTED])
    assert parts["attention"] * 1e3 == pytest.approx(sparse + verify_ms(1, "off", 8, 2048),
                                                     rel=1e-9)
    # a context inside the window: every key
    parts, _ = cm.forward_parts([1500] * batch, q, collect="sum")
    assert parts["attention"] * 1e3 == pytest.approx(
        verify_ms(q, "sum", 8, 1500) + verify_ms(q, "off", 8, 1500), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(lists=st.floats(1.0, 31.0), slope_us=st.floats(0.0, 5.0), floor_us=st.floats(5.0, 200.0))
def test_a_selection_over_fewer_lists_than_measured_follows_its_two_smallest_points(
        lists, slope_us, floor_us):
    """Quest's page scoring over 2 sequences x 4 KV heads (8 lists) where the table starts at
    32: on the line through the 32- and 128-list points, never above the 32-list time nor
    below it shrunk in proportion; an attention kernel's grid is held there instead."""
    from specsim.costs.operators import _grid

    def points(op, key, lists_axis="lists"):
        return [Point(op, key, {lists_axis: n, "context": c},
                      [(floor_us + slope_us * n) * c / 65536 / 1e3] * 3)
                for n in (32, 128, 512) for c in (16384, 65536)]

    selection = _grid("selection", points("selection", {"policy": "quest", "group": 4,
                                                        "rows": 0}))
    t, note = selection(lists, 65536)
    t32 = (floor_us + 32 * slope_us) / 1e6
    line = (floor_us + lists * slope_us) / 1e6
    assert t == pytest.approx(max(line, t32 * lists / 32))
    assert t32 * lists / 32 - 1e-15 <= t <= t32 + 1e-15
    assert "extrapolated along its two smallest points" in note
    verify = _grid("verify", points("verify", {"head_dim": 128, "group": 4, "q": 1,
                                               "collect": "off"}, "batch_kv_heads"))
    held, note = verify(lists, 65536)
    assert held == pytest.approx(t32) and "held at its smallest point" in note
