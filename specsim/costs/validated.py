"""How far each cost source has been validated: a summary of the shipped validation reports,
and the line every answer prints about its own source.

``models/validation/summary.json`` is generated from the shipped reports
(``models/validation/*-report.json`` with their plans) by :func:`build_summary` (``python -m
specsim.costs.validated``; a test keeps it equal to what the reports say): one entry per
validated setup — the cost source's kind, the model, the GPU, the setup's mode, batch and
context — with its predict MAPE, worst cell, regret and the report it came from. A model's
runs by one kind of source on one GPU are those of its latest plan: an earlier plan priced it
by an earlier table or code, which VALIDATION.md keeps as history, not as what an answer
today is trusted to. :func:`validation_note` reads it, never a figure written anywhere else.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

FORMAT_KEY = "specsim_validation_summary"
SUMMARY = "models/validation/summary.json"


def _kind(entry: dict) -> str:
    """The cost source kind a report's setup was priced by (reports that predate the record
    name a calibration file in their note, or the roofline)."""
    source = entry.get("cost_source")
    if source:
        return source["kind"]
    return "calibration" if "calibrat" in (entry.get("costs") or "") else "roofline"


def build_summary(folder: str | Path) -> dict:
    """The summary of every ``*-report.json`` in ``folder`` (each beside its ``-plan.json``)."""
    folder = Path(folder)
    chosen: dict[tuple, list[dict]] = {}
    for report_path in sorted(folder.glob("*-report.json")):
        plan_path = report_path.with_name(report_path.name.replace("-report.json",
                                                                   "-plan.json"))
        plan = json.loads(plan_path.read_text())
        report = json.loads(report_path.read_text())
        for item in report["setups"]:
            setup, scores = item["setup"], (item.get("all") or {}).get("predict")
            if not scores:
                continue
            entry = {"kind": _kind(item), "model": setup["model"], "hardware": plan["hardware"],
                     "mode": setup["mode"], "batch": setup["batch"],
                     "context": setup.get("context"),
                     "configurations": sum(r.get("predict") is not None for r in item["rows"]),
                     "mape": scores["mape"], "worst": scores["worst"],
                     "regret": scores.get("regret"), "report": report_path.name,
                     "date": plan["created"]}
            key = tuple(entry[k] for k in ("kind", "model", "hardware"))
            plan_of = (entry["date"], entry["report"])       # a plan, told apart on a tie
            held = (chosen[key][0]["date"], chosen[key][0]["report"]) if key in chosen else None
            if held is None or held < plan_of:
                chosen[key] = [entry]
            elif held == plan_of:
                chosen[key].append(entry)
    entries = sorted((e for latest in chosen.values() for e in latest),
                     key=lambda e: (e["hardware"], e["kind"], e["model"], e["batch"],
                                    e["context"] or 0))
    return {FORMAT_KEY: 1, "entries": entries}


def shipped_summary() -> dict:
    """The shipped summary (empty where none ships)."""
    from specsim.shipped import shipped_file
    path = shipped_file(SUMMARY)
    if path is None:
        return {FORMAT_KEY: 1, "entries": []}
    return json.loads(Path(path).read_text())


def _shape(e: dict) -> str:
    context = "the trace's contexts" if e["context"] is None else \
        f"{e['context'] // 1024}K" if e["context"] % 1024 == 0 else str(e["context"])
    return f"batch {e['batch']} x {context}"


def _runs(entries: list[dict]) -> str:
    """When the runs were made (their days), so a reader can tell them from later engines."""
    days = sorted({e["date"][:10] for e in entries if e.get("date")})
    if not days:
        return ""
    return f" (runs of {days[0]})" if len(days) == 1 else f" (runs of {days[0]} to {days[-1]})"


def _pooled(entries: list[dict]) -> str:
    n = sum(e["configurations"] for e in entries)
    mape = sum(e["mape"] * e["configurations"] for e in entries) / n
    worst = max(e["worst"] for e in entries)
    regret = min((e["regret"] for e in entries if e["regret"] is not None), default=None)
    return (f"MAPE {mape * 100:.1f}% (worst {worst * 100:.1f}%) over {n} configurations"
            + (f", regret >= {regret:.3f}" if regret is not None else ""))


def validation_note(kind: str, model: str, hardware: str | None,
                    summary: dict | None = None) -> str:
    """What the validation runs say of a ``kind`` source pricing ``model`` on ``hardware``:
    this model's own runs, else the same source's runs of other models on that GPU, else
    that none ran (see VALIDATION.md)."""
    entries = (summary or shipped_summary())["entries"]
    same = [e for e in entries if e["kind"] == kind and e["hardware"] == hardware]
    own = [e for e in same if e["model"] == model]
    if own:
        return (f"validated on {hardware} for {model} at "
                f"{', '.join(_shape(e) for e in own)}{_runs(own)}: {_pooled(own)}; "
                f"VALIDATION.md")
    if same:
        models = sorted({e["model"] for e in same})
        return (f"this source is validated on {hardware} for {', '.join(models)}, not for "
                f"{model}{_runs(same)}: {_pooled(same)}; VALIDATION.md")
    return (f"no validation run priced by this source ({kind}) on {hardware or 'this GPU'}; "
            f"VALIDATION.md says how far each source is trusted")


def main(argv=None) -> None:
    """``python -m specsim.costs.validated [FOLDER]``: rewrite FOLDER/summary.json (default:
    the checkout's ``models/validation``) from its reports."""
    from specsim.atomic import write_text_atomic

    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0]) if argv else Path(__file__).resolve().parents[2] / SUMMARY
    folder = folder.parent if folder.name == "summary.json" else folder
    summary = build_summary(folder)
    write_text_atomic(str(folder / "summary.json"), json.dumps(summary, indent=1) + "\n")
    print(f"wrote {folder / 'summary.json'}: {len(summary['entries'])} setups")


if __name__ == "__main__":
    main()


__all__ = ["SUMMARY", "build_summary", "shipped_summary", "validation_note"]
