"""The engine's settings object: no module reads engine behaviour from the environment, and
the settings parse, hash and round-trip through a calibration's provenance (shipped files,
older flat files, files naming retired settings)."""
import ast
import json
from dataclasses import fields

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from repo import REPO_ROOT
from specsim.errors import SpecsimError
from specsim.settings import (ADDED_SETTINGS, DEFAULT, ENGINE_FACTS, LEGACY_DEFAULTS, RETIRED,
                              EngineSettings, engine_provenance, retired_settings)

#: The environment variables specsim reads: the user's cache and catalogue folders, the CLI's
#: traceback switch, and Triton's interpreter switch.
#: Variables that locate files or choose how errors print, never what the engine does; the
#: Hugging Face ones find a user's hub cache where the hub library puts it (read when a model is
#: looked up by its id). The Ray ones are set for Ray's own processes by `tune --ray local`
#: (no usage stats, servers on the loopback address), and the second put back after ray.init.
ALLOWED_ENVIRONMENT = {"SPECSIM_CACHE", "SPECSIM_MODELS", "SPECSIM_DEBUG", "TRITON_INTERPRET",
                       "HF_HUB_CACHE", "HF_HOME", "RAY_USAGE_STATS_ENABLED",
                       "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}


def environment_reads(source: str) -> list[tuple[int, str]]:
    """(line, variable) of every read of ``os.environ`` / ``os.getenv`` in ``source``: item
    access, ``.get``/``.setdefault``/``.pop``, ``getenv``, membership tests; the variable is
    the literal first argument or key (``?`` when it is not a literal)."""
    tree = ast.parse(source)
    out = []

    def name_of(node):
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) \
            else "?"

    def is_environ(node):
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
            (isinstance(node, ast.Name) and node.id == "environ")

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_environ(node.value):
            out.append((node.lineno, name_of(node.slice)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if is_environ(node.func.value) and node.func.attr in ("get", "setdefault", "pop"):
                out.append((node.lineno, name_of(node.args[0]) if node.args else "?"))
            elif node.func.attr == "getenv":
                out.append((node.lineno, name_of(node.args[0]) if node.args else "?"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "getenv":
            out.append((node.lineno, name_of(node.args[0]) if node.args else "?"))
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            out.append((node.lineno, name_of(node.left)))
    return out


def test_the_scan_finds_every_kind_of_read():
    source = ("import os\nfrom os import environ, getenv\n"
              "a = os.environ['A']\nb = os.environ.get('B', 1)\nc = os.getenv('C')\n"
              "d = environ.setdefault('D', '1')\ne = 'E' in os.environ\nf = getenv('F')\n"
              "g = os.environ.get(name)\n")
    assert [v for _, v in environment_reads(source)] == ["A", "B", "C", "D", "E", "F", "?"]


def test_no_module_reads_engine_behaviour_from_the_environment():
    offending = []
    for top in ("specsim", "cli"):
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            for line, name in environment_reads(path.read_text()):
                if name not in ALLOWED_ENVIRONMENT:
                    offending.append(f"{path.relative_to(REPO_ROOT)}:{line}: {name}")
    assert not offending, "environment reads outside " + ", ".join(sorted(ALLOWED_ENVIRONMENT)) \
        + ":\n" + "\n".join(offending)


def test_every_setting_documents_its_choices_default_and_measurement():
    for f in fields(EngineSettings):
        choices, meaning = f.metadata["choices"], f.metadata["meaning"]
        assert choices[0] == f.default, f.name                # the default listed first
        assert len(set(choices)) == len(choices) >= 2, f.name
        for choice in choices:                                # each choice explained
            assert f"{str(choice)}:" in meaning or f"{str(choice).lower()}:" in meaning, \
                (f.name, choice)
        assert any(ch.isdigit() for ch in meaning), f"{f.name}: no measurement"
    help_text = EngineSettings.help_text()
    assert all(f"{f.name}=" in help_text for f in fields(EngineSettings))


def all_settings():
    return st.builds(EngineSettings, **{f.name: st.sampled_from(f.metadata["choices"])
                                        for f in fields(EngineSettings)})


@given(all_settings())
def test_json_round_trip_and_hash(settings):
    doc = json.loads(json.dumps(settings.to_json()))
    back = EngineSettings.from_json(doc)
    assert back == settings and back.stable_hash() == settings.stable_hash()
    assert len(settings.stable_hash()) == 16
    int(settings.stable_hash(), 16)
    # the hash depends on the values, not on the order a file lists them in
    assert EngineSettings.from_json(dict(reversed(list(doc.items())))).stable_hash() == \
        settings.stable_hash()


@given(all_settings(), all_settings())
def test_equal_settings_hash_equal_and_different_ones_differ(a, b):
    assert (a.stable_hash() == b.stable_hash()) == (a == b)
    assert set(a.differences(b)) == {f.name for f in fields(a)
                                     if getattr(a, f.name) != getattr(b, f.name)}


def test_a_setting_retired_after_settings_objects_began_reads_as_each_file_ran():
    """A setting added after files began recording a settings object, then retired
    (:data:`ADDED_SETTINGS`): a file whose object does not name it ran the value the engine
    had before it (reported as a retired alternative), one that names it (in the object or
    as its own key) ran that, and a file written now records how the engine runs."""
    assert ADDED_SETTINGS and set(ADDED_SETTINGS) <= set(RETIRED)
    for name, before in ADDED_SETTINGS.items():
        now = RETIRED[name][0]
        assert before != now and LEGACY_DEFAULTS[name] == before
        older = {"settings": DEFAULT.to_json()}
        assert retired_settings(older) == {name: (before, now)}
        assert retired_settings({**older, name: now}) == {}
        assert retired_settings({"settings": {**DEFAULT.to_json(), name: now}}) == {}
        assert retired_settings({"settings": {**DEFAULT.to_json(), name: before}}) == \
            {name: (before, now)}
        assert EngineSettings.from_provenance({"settings": {**DEFAULT.to_json(),
                                                            name: before}}) == DEFAULT
        assert engine_provenance(DEFAULT)[name] == now


@given(all_settings(), st.data())
def test_parse_applies_each_assignment(base, data):
    """``name=value`` in any case, dashes for underscores, later assignments win."""
    names = data.draw(st.lists(st.sampled_from([f.name for f in fields(EngineSettings)]),
                               max_size=4))
    expected = base
    assignments = []
    for name in names:
        value = data.draw(st.sampled_from(EngineSettings.choices()[name]))
        spelled = data.draw(st.sampled_from([str(value), str(value).lower(),
                                             str(value).upper()]))
        key = data.draw(st.sampled_from([name, name.replace("_", "-")]))
        assignments.append(f"{key}={spelled}")
        expected = expected.replace(**{name: value})
    assert EngineSettings.parse(assignments, base) == expected


@hypothesis_settings(max_examples=50)
@given(st.text(max_size=30))
def test_parse_refuses_anything_else_in_one_line(text):
    name, _, value = text.partition("=")
    choices = EngineSettings.choices().get(name.strip().replace("-", "_"))
    if choices and value.strip().lower() in {str(c).lower() for c in choices}:
        return
    with pytest.raises(SpecsimError) as caught:
        EngineSettings.parse([text])
    assert "\n" not in str(caught.value).strip()


def test_values_of_the_wrong_type_are_refused():
    with pytest.raises(SpecsimError, match="cuda_graphs"):
        EngineSettings(cuda_graphs=1)
    with pytest.raises(SpecsimError, match="c2q"):
        EngineSettings(c2q="both")
    with pytest.raises(SpecsimError, match="unknown engine setting"):
        EngineSettings.from_json({"no_such": 1})


@given(all_settings(), st.fixed_dictionaries({}, optional={
    "draft_timed_as_chain_of": st.sampled_from([1, 4]), "cache_align": st.sampled_from([128])}))
def test_a_measurements_provenance_gives_back_its_settings(settings, facts):
    engine = json.loads(json.dumps(engine_provenance(settings, **facts)))
    assert EngineSettings.from_provenance(engine) == settings
    assert engine["settings_hash"] == settings.stable_hash()
    assert retired_settings(engine) == {}             # runs as the engine runs now
    for name, value in settings.to_json().items():    # flat keys too, as older files name them
        assert engine[name] == value
    # a file that lost the settings object reads the same from its flat keys
    flat = {k: v for k, v in engine.items() if k not in ("settings", "settings_hash")}
    assert EngineSettings.from_provenance(flat) == settings


def shipped_engines():
    return sorted((REPO_ROOT / "models" / "calibrations").rglob("*.json"))


@pytest.mark.parametrize("path", shipped_engines(), ids=lambda p: p.name)
def test_every_shipped_calibration_reads(path):
    engine = json.loads(path.read_text())["provenance"]["engine"]
    settings = EngineSettings.from_provenance(engine)
    for name in ("c2q", "ranking", "fuse_projections", "compile_layers", "cuda_graphs"):
        assert getattr(settings, name) == engine.get(name, LEGACY_DEFAULTS[name]), name
    assert retired_settings(engine) == {}, "a shipped file times a retired alternative"


@given(st.fixed_dictionaries({}, optional={
    **{name: st.sampled_from(EngineSettings.choices()[name])
       for name in ("c2q", "ranking", "fuse_projections", "compile_layers", "cuda_graphs")},
    "fused_append": st.booleans(), "verify_splits": st.sampled_from(["sm", "waves"]),
    "draft_chain": st.just(True), "draft_timed_as_chain_of": st.just(4),
    "cache_align": st.just(128)}))
def test_older_flat_files_read_with_their_retired_settings_reported(engine):
    """Files from before the settings object: each recorded setting read from its own key,
    missing ones as those runs went (``LEGACY_DEFAULTS``), retired settings accepted and
    reported where they ran otherwise than the engine runs now."""
    settings = EngineSettings.from_provenance(engine)
    for name in ("c2q", "ranking", "fuse_projections", "compile_layers", "cuda_graphs"):
        assert getattr(settings, name) == engine.get(name, LEGACY_DEFAULTS[name])
    reported = retired_settings(engine)
    for name, (now, _) in RETIRED.items():
        ran = engine.get(name, LEGACY_DEFAULTS[name])
        assert (name in reported) == (ran != now)
        if name in reported:
            assert reported[name] == (ran, now)


def test_retired_keys_in_a_settings_object_are_accepted_and_reported():
    engine = {"settings": {**DEFAULT.to_json(), "combine": "block", "linear": "torch",
                           "verify_append": "fused"}}
    assert EngineSettings.from_provenance(engine) == DEFAULT
    assert retired_settings(engine) == {"combine": ("block", "loop")}


def test_unknown_keys_are_errors():
    with pytest.raises(SpecsimError, match="unknown engine setting warp_speed"):
        EngineSettings.from_provenance({"warp_speed": 9})
    with pytest.raises(SpecsimError, match="unknown engine setting warp_speed"):
        EngineSettings.from_provenance({"settings": {"warp_speed": 9}})
    with pytest.raises(ValueError, match="not engine facts"):
        engine_provenance(DEFAULT, colour="blue")
    assert set(ENGINE_FACTS) >= {"draft_chain", "cache_align", "draft_timed_as_chain_of"}

