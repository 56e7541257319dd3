"""Combining two calibrations of one model on one GPU into one file: a run cut short filled in
from another (:func:`merge_calibrations`), or some op families re-measured and put in
(:func:`replace_ops`) — never mixing timings of two engines.

Two runs' rows of an op may sit in one file only when the engine ran that op alike in both:
the same settings where they touch it (:data:`SETTING_FAMILIES`), drafts timed alike
(``provenance.engine.draft_timed_as_chain_of``), Quest's caches padded alike
(``cache_align``). Each combination is recorded in the provenance (``merged``, ``replaced``),
so a reader can tell which rows came from which run.
"""
from __future__ import annotations

from specsim.costs.calibration_file import OP_FAMILIES, STEP_KINDS, Calibration, Measurement
from specsim.costs.provenance import engine_choices, rankings
from specsim.errors import SpecsimError
from specsim.policies import recorded_best_ranking

#: The op families (or single ops, ``family:policy``) each engine choice (a setting, or a
#: retired setting older files ran otherwise) changes the timing of. A choice not named here
#: is taken to change every family.
SETTING_FAMILIES = {
    "fused_append": ("plain", "draft"),             # each step's one-position K/V writes
    "ranking": ("selection", "draft"),              # each refresh; Quest's draft ranks pages
    "verify_splits": ("plain", "verify"),           # full-attention passes' chunks of keys
    "c2q": ("verify", "selection:vegas"),           # what Vegas' verify writes, its refresh
    "last_token_rows": ("verify:last-token", "selection:last-token"),   # likewise last-token's
    "shared_kv_strides": ("plain", "verify", "draft"),   # how the attention kernels read V
    "verify_append": ("verify",),                   # each verify pass's K/V (and page) writes
}


def setting_families(name: str) -> tuple[str, ...]:
    if name.startswith("ranking:"):          # one policy's resolved ranking: its refresh
        policy = name.split(":", 1)[1]       # (and Quest's draft steps, which rank pages)
        return (f"selection:{policy}",) + (("draft:quest",) if policy == "quest" else ())
    return SETTING_FAMILIES.get(name, OP_FAMILIES)


def touches(families: tuple[str, ...] | set[str], op: str) -> bool:
    """Whether ``op`` is one of ``families`` (a family name covers its ``family:policy`` ops)."""
    return op in families or op.split(":", 1)[0] in families


def choice_differences(a: Calibration, b: Calibration) -> dict[str, tuple]:
    """``{name: (a's value, b's value)}`` for every engine choice (a setting, or a retired
    setting an older file ran otherwise) the two files' engines differ in."""
    x, y = engine_choices(a), engine_choices(b)
    out = {name: (x.get(name), y.get(name)) for name in sorted(set(x) | set(y))
           if x.get(name) != y.get(name)}
    # each policy's ranking as its file resolved "best" (what it resolves to may change)
    ra, rb = rankings(x.get("ranking"), a.engine), rankings(y.get("ranking"), b.engine)
    out.update({f"ranking:{p}": (ra[p], rb[p]) for p in ra if ra[p] != rb[p]})
    return out


def _same_model_and_gpu(a: Calibration, b: Calibration) -> None:
    """Rows of two calibrations may be combined only for the same model on the same GPU."""
    for key in ("model", "model_spec_hash", "gpu"):
        x, y = a.provenance.get(key), b.provenance.get(key)
        if x != y:
            raise SpecsimError(f"cannot merge calibrations of different {key}: {x!r} vs {y!r}")


def _setting_reason(name: str, op: str, there, here) -> str | None:
    """Why ``op``'s rows timed with setting ``name`` = ``there`` do not fit a file timed with
    ``here``, or None where the setting does not change ``op``. The ranking setting speaks
    through each policy's resolved ranking (``ranking:<policy>``: ``best`` ranks some
    policies' lists as ``topk`` does, and what it resolves to is recorded per file)."""
    if name == "ranking" or not touches(setting_families(name), op):
        return None
    if name.startswith("ranking:"):
        return f"ranked by {there} there, {here} here"
    return f"{name}={there!r} there, {here!r} here"


def merge_calibrations(primary: Calibration, extra: Calibration, note: str,
                       exclude_ops: tuple[str, ...] = ()) -> Calibration:
    """``primary``'s rows, all of them, plus ``extra``'s step timings (plain, verify, draft,
    selection) at the (batch, context) shapes ``primary`` did not reach — e.g. when a time
    budget cut a newer run short. Loop overheads come from ``primary`` alone (they depend on
    the loop's host code, not only the kernels). Both must describe the same model on the
    same GPU.

    An op of ``extra`` is not taken where the engine ran it otherwise there: a setting that
    changes it differs (:data:`SETTING_FAMILIES`; a policy's ranking resolved per policy),
    draft steps timed as chains of another length, Quest's ops with caches padded otherwise.
    Nor where ``primary`` measured it at other q (its series mean something else there), nor
    when it is in ``exclude_ops`` (its code changed between the runs where the kernel hash
    does not see it). ``provenance.merged`` records the other run, the rows taken and why each
    op not taken was not."""
    _same_model_and_gpu(primary, extra)
    here, there = primary.engine, extra.engine
    differ = choice_differences(extra, primary)
    chain = (there.get("draft_timed_as_chain_of"), here.get("draft_timed_as_chain_of"))
    align = (there.get("cache_align"), here.get("cache_align"))
    have = {(m.batch, m.context) for m in primary.measurements}
    mine, theirs = _qs_by_op(primary), _qs_by_op(extra)
    skipped: dict[str, str] = {}
    for op in sorted(theirs):
        family = op.split(":", 1)[0]
        if family not in STEP_KINDS:
            continue
        reasons = ["excluded"] if op in exclude_ops else []
        if family == "draft" and chain[0] != chain[1]:
            reasons.append(f"timed as chains of {chain[0]} there, {chain[1]} here")
        if op.endswith(":quest") and align[0] != align[1]:
            reasons.append(f"caches padded to {align[0]} there, {align[1]} here")
        reasons += [r for name, (a, b) in differ.items()
                    if (r := _setting_reason(name, op, a, b)) is not None]
        if op in mine and theirs[op] != mine[op]:
            reasons.append(f"measured at q {sorted(theirs[op])} there, {sorted(mine[op])} here")
        if reasons:
            skipped[op] = "; ".join(reasons)
    added = [m for m in extra.measurements
             if (m.batch, m.context) not in have and m.family in STEP_KINDS
             and m.op not in skipped]
    prov = dict(primary.provenance)
    prov["merged"] = list(prov.get("merged", [])) + [{
        "date": extra.provenance.get("date"),
        "kernel_config_hash": extra.provenance.get("kernel_config_hash"),
        "torch": extra.provenance.get("torch"), "triton": extra.provenance.get("triton"),
        "shapes": [list(x) for x in sorted({(m.batch, m.context) for m in added})],
        "ops": sorted({m.op for m in added}), "rows": len(added), "note": note,
        "settings_differ": {name: list(pair) for name, pair in differ.items()},
        "ops_skipped": skipped}]
    return Calibration(prov, dict(primary.ceilings), list(primary.measurements) + added)


def _qs_by_op(calibration: Calibration) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for m in calibration.measurements:
        out.setdefault(m.op, set()).add(m.q)
    return out


def replace_ops(base: Calibration, new: Calibration, families: list[str], note: str,
                keep_other_shapes: bool = False) -> Calibration:
    """``base`` with every row of the op ``families`` (``plain``, ``verify``, ``draft``,
    ``selection``, ``overhead``: the op name before its first ':') replaced by ``new``'s rows
    of those families: e.g. the loop overheads re-measured alone after a change to the loop's
    host code, the kernels' timings kept. An entry with a ':' names one op exactly
    (``draft:quest``: Quest's draft steps alone; ``verify`` alone would also take the
    policies' own verify). Same model and GPU; recorded under ``provenance.replaced``.

    ``keep_other_shapes``: keep ``base``'s rows of an op at the (batch, context) shapes
    ``new`` did not measure it at (a re-measurement a time budget cut short, of kernels that
    did not change) — not for ops whose every row changed meaning.

    Where ``new`` ran with other engine settings, every family those settings change
    (:data:`SETTING_FAMILIES`) must be replaced whole, and the file's ``provenance.engine``
    then records ``new``'s settings; anything less would mix two engines in one file and is
    refused."""
    _same_model_and_gpu(base, new)
    wanted = set(families)

    def chosen(m: Measurement) -> bool:
        return touches(wanted, m.op)

    taken = [m for m in new.measurements if chosen(m)]
    covered = {m.op if m.op in wanted else m.family for m in taken}
    missing = sorted(f for f in wanted - covered if _held(base, f))
    if missing:
        raise SpecsimError(f"the new calibration has no {', '.join(missing)} rows to put in")
    measured = {(m.op, m.batch, m.context) for m in taken}
    kept = [m for m in base.measurements if not chosen(m)
            or (keep_other_shapes and (m.op, m.batch, m.context) not in measured)]
    prov = dict(base.provenance)
    if _check_replaced_choices(base, new, wanted, keep_other_shapes):
        prov["engine"] = _engine_as_in(base.engine, new)
    prov["replaced"] = list(prov.get("replaced", [])) + [{
        "families": sorted(wanted), "rows": len(taken), "kept_other_shapes": keep_other_shapes,
        "replaced_rows": len(base.measurements) - len(kept),
        "date": new.provenance.get("date"),
        "kernel_config_hash": new.provenance.get("kernel_config_hash"),
        "torch": new.provenance.get("torch"), "triton": new.provenance.get("triton"),
        "engine": new.provenance.get("engine"), "note": note}]
    return Calibration(prov, dict(base.ceilings), kept + taken)


def _check_replaced_choices(old: Calibration, new: Calibration, wanted: set[str],
                            keep_other_shapes: bool) -> bool:
    """Whether the two engines' choices differ; raises where the replaced ``wanted`` families
    do not cover all that a differing choice changes (or old rows are kept at other shapes)."""
    differ = choice_differences(new, old)
    for name, (value, before) in differ.items():
        touched = [f for f in setting_families(name) if _held(old, f)]
        uncovered = [f for f in touched if f not in wanted and f.split(":", 1)[0] not in wanted]
        if uncovered or keep_other_shapes:
            why = (f"not replacing {', '.join(uncovered)}" if uncovered
                   else "keeping the old rows at other shapes")
            raise SpecsimError(
                f"the new calibration ran with {name}={value!r}, the old one with "
                f"{name}={before!r}; {why} would mix the two in one file: replace all of "
                f"{', '.join(touched)} without keeping other shapes")
    return bool(differ)


def _held(calibration: Calibration, family: str) -> bool:
    """Whether ``family`` counts for ``calibration``: every family does, but prefill only
    where the file has prefill rows (files measured before prefills were timed have none:
    nothing of theirs to replace, nothing to mix)."""
    return family != "prefill" or any(m.op == "prefill" for m in calibration.measurements)


def _engine_as_in(engine: dict, new: Calibration) -> dict:
    """``provenance.engine`` with ``new``'s engine choices in place of the file's own (each
    under its own key, and the settings object with its hash), the harness' other facts
    kept."""
    choices = engine_choices(new)
    out = {k: v for k, v in engine.items()
           if k not in choices and k not in ("settings", "settings_hash", "best_ranking")}
    out.update(choices)
    out["best_ranking"] = recorded_best_ranking(new.engine)
    out["settings"] = new.settings.to_json()
    out["settings_hash"] = new.settings.stable_hash()
    return out
