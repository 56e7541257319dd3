"""The cost source resolver: a calibration of this model on this GPU where one applies, else
the roofline, flagged with why."""
import json
import shutil

import pytest
from click.testing import CliRunner

import specsim.costs.source as source
from calibration_tables import synthetic
from specsim.costs import make_cost_model, resolve_cost_source
from specsim.cli.main import cli
from specsim.costs.calibration_file import Measurement
from specsim.costs.source import CostSource
from specsim.errors import SpecsimError
from specsim.shipped import shipped_root
from specsim.specs import load_hardware, load_model

HW = load_hardware("h200")
SHIPPED = ("llama-3.1-8b", "qwen3-4b", "qwen3-8b", "smollm2-135m")


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_model_is_priced_by_its_calibration(name):
    got = resolve_cost_source(load_model(name), HW)
    assert got.kind == "calibration" and got.cost_model.name == "calibrated"
    assert got.fallback is None and "WARNING" not in got.note
    assert got.path.endswith(f"{name}.json")
    # reports name a shipped file by its place in the repository, not this machine's path
    assert f"(models/calibrations/h200/{name}.json;" in got.note
    cost_model, note = make_cost_model(load_model(name), HW)
    assert cost_model.name == "calibrated" and note == got.note


def test_the_roofline_is_the_fallback_and_says_why():
    model = load_model("qwen3-8b")
    got = resolve_cost_source(model, HW, tp=2)
    assert got.kind == "roofline" and got.cost_model.name == "roofline"
    assert got.fallback == "tensor parallelism" and "tensor parallelism" in got.note
    # a GPU without a calibration or a table of its own: the H200's table scaled to it
    scaled = resolve_cost_source(model, load_hardware("a100-80gb"))
    assert scaled.kind == "scaled-operators" and scaled.fallback == "no calibration shipped"
    chosen = resolve_cost_source(model, HW, costs="roofline")
    assert chosen.kind == "roofline" and chosen.fallback is None
    with pytest.raises(SpecsimError, match="no shipped calibration"):
        resolve_cost_source(model, load_hardware("a100-80gb"), costs="calibrated")
    with pytest.raises(SpecsimError, match="at tp=1"):
        resolve_cost_source(model, HW, tp=2, costs="calibrated")
    with pytest.raises(SpecsimError, match="--costs must be"):
        resolve_cost_source(model, HW, costs="nonsense")


def test_a_calibration_file_given_is_used_as_given(tmp_path):
    path = tmp_path / "mine.json"
    synthetic().write(str(path))
    got = resolve_cost_source(load_model("llama-3.1-8b"), HW, costs=str(path))
    assert got.kind == "calibration" and got.path == str(path) and str(path) in got.note
    with pytest.raises(SpecsimError, match="one GPU"):
        resolve_cost_source(load_model("llama-3.1-8b"), HW, tp=2, costs=str(path))


@pytest.fixture
def catalogue(tmp_path, monkeypatch):
    """A user's catalogue with its own model (Llama-3.1-8B's shapes under a name nothing ships a
    calibration for) and no calibration yet."""
    root = tmp_path / "models"
    shutil.copytree(shipped_root("models") / "hardware", root / "hardware")
    shutil.copytree(shipped_root("models") / "llama-3.1-8b", root / "my-llama")
    monkeypatch.setenv("SPECSIM_MODELS", str(root))
    (root / "calibrations" / "h200").mkdir(parents=True)
    return root / "calibrations" / "h200" / "my-llama.json"


def every_policy(cal):
    rows = list(cal.measurements)
    for m in cal.measurements:
        if m.op == "draft:vegas":
            rows += [Measurement(f"draft:{p}", m.batch, m.context, 1, m.s, m.samples_ms)
                     for p in ("sparsespec", "streamingllm", "quest", "last-token")]
    cal.measurements = rows
    return cal


def test_auto_takes_a_calibration_only_when_it_covers_every_policy(catalogue):
    """Mixing measured and roofline prices across policies would bias their comparison: a
    calibration of some policies is used only when asked for."""
    model = load_model("my-llama")
    assert resolve_cost_source(model, HW).fallback == "no calibration shipped"
    synthetic().write(str(catalogue))                                # Vegas' drafts only
    got = resolve_cost_source(model, HW)
    assert got.kind == "operators" and "sparsespec" in got.fallback    # the H200's table
    assert str(catalogue) in got.fallback                             # how to use it anyway
    assert resolve_cost_source(model, HW, costs="calibrated").kind == "calibration"
    every_policy(synthetic()).write(str(catalogue))
    got = resolve_cost_source(model, HW)
    assert got.kind == "calibration" and got.path == str(catalogue)
    r = CliRunner().invoke(cli, ["predict", "--model", "my-llama", "--bootstrap", "50",
                                 "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["cost_model"] == "calibrated" and doc["costs"] == got.note


def test_a_source_placed_first_is_tried_first(monkeypatch):
    """The order of trust is one list: a source put before the shipped calibration (an
    operator table, say) prices where it applies, and the others are tried where it does
    not."""
    model = load_model("qwen3-8b")
    table = resolve_cost_source(model, HW, costs="roofline").cost_model

    def operator_table(model_, hardware, tp, required):
        if hardware.key != "h200":
            raise source._NotHere("no operator table")
        return CostSource(table, "operator table", "operator-table cost model")

    monkeypatch.setattr(source, "AUTO_SOURCES", (operator_table, *source.AUTO_SOURCES))
    assert resolve_cost_source(model, HW).kind == "operator table"
    got = resolve_cost_source(model, load_hardware("a100-80gb"))
    assert got.kind == "scaled-operators"
    assert got.fallback == "no operator table; no calibration shipped"
