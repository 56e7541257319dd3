"""Plan and measurement files: reading, writing, selecting parts of a plan and joining the
measurements of its parts."""
from __future__ import annotations

import json

from specsim import atomic
from specsim.atomic import write_text_atomic
from specsim.errors import SpecsimError

FORMAT_KEY = "specsim_validation_plan"
MEASURED_KEY = "specsim_validation_measured"


def read_json(path: str, key: str) -> dict:
    """A plan (``key`` = ``FORMAT_KEY``) or measurement file (``MEASURED_KEY``), checked."""
    doc = atomic.read_json(path, "validation file")
    if not isinstance(doc, dict) or doc.get(key) != 1:
        raise SpecsimError(f"{path}: not a specsim validation file (expected \"{key}\": 1)")
    return doc


def write_json(path: str, doc: dict) -> None:
    write_text_atomic(path, json.dumps(doc, indent=1))


def select(plan: dict, setups: str | None = None, policies: str | None = None) -> dict:
    """The plan restricted to some setups and policies (comma-separated names): a part of the
    grid per process — a CUDA device-side assert ends the process that hits it."""
    out = []
    for entry in plan["setups"]:
        if setups and entry["setup"]["name"] not in setups.split(","):
            continue
        if policies:
            keep = policies.split(",")
            entry = dict(entry, configs=[c for c in entry["configs"] if c["policy"] in keep])
        out.append(entry)
    return dict(plan, setups=out)


def merge_measured(docs: list[dict]) -> dict:
    """Measurements of parts of one plan (``select``) as one file: per setup, every part's
    configurations (a configuration measured twice keeps its first); plain decoding, and the
    machine's probe, from the first part that has the setup."""
    if not docs:
        raise SpecsimError("nothing to merge")
    created = {d["plan_created"] for d in docs}
    if len(created) > 1:
        raise SpecsimError(f"measurements of different plans: {sorted(created)}")
    out = {k: v for k, v in docs[0].items() if k != "setups"}
    setups: dict[str, dict] = {}
    for doc in docs:
        for part in doc["setups"]:
            probe = {"probe": doc["probe"]} if "probe" in doc and "probe" not in part else {}
            have = setups.setdefault(part["name"], dict(part, configs=[], **probe))
            seen = {(c["policy"], c["s"], c["k"]) for c in have["configs"]}
            have["configs"] += [c for c in part["configs"]
                                if (c["policy"], c["s"], c["k"]) not in seen]
    out["setups"] = list(setups.values())
    return out
