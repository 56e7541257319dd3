"""What a calibration's provenance says to the one who uses it: the engine settings it timed,
in words, and warnings where it is used away from where it was measured."""
from __future__ import annotations

from specsim.costs.calibration_file import Calibration
from specsim.policies import (BEST_RANKING, RANKED_POLICIES, recorded_best_ranking,
                              resolve_ranking)
from specsim.settings import RETIRED, EngineSettings, retired_values
from specsim.specs import ModelSpec

#: How each engine choice's values read in a cost note, in the order the note lists them; a
#: value mapped to None is not mentioned. A choice without words here is named
#: (``name=value``) where it differs from how the engine runs now.
CHOICE_WORDS = {
    "fused_append": {True: "fused cache append", False: "torch cache writes"},
    "ranking": "{} ranking",
    "verify_splits": {"sm": "chunks per multiprocessor", "waves": "whole-wave chunks"},
    "c2q": {"sum": "summed Collect-2-Query", "rows": None},
    "last_token_rows": {"sum": None, "heads": "last-token's per-head rows"},
    "shared_kv_strides": {True: "V addressed by K's strides", False: None},
    "cuda_graphs": {True: None, False: "eager launches"},
    "fuse_projections": {True: None, False: "unfused projections"},
    "compile_layers": {True: None, False: "eager layers"},
    "verify_append": {"fused": None, "torch": "torch verify writes"},
}


def engine_choices(calibration: Calibration) -> dict:
    """Every choice of the engine that timed the file's steps, by name: its settings
    (:class:`EngineSettings`) and the value of each retired setting (:data:`RETIRED`: an
    alternative the engine no longer offers, which an older file may have run)."""
    return {**calibration.settings.to_json(), **retired_values(calibration.engine)}


def current_choices() -> dict:
    """:func:`engine_choices` of the engine as it runs now, with the default settings."""
    return {**EngineSettings().to_json(), **{name: now for name, (now, _) in RETIRED.items()}}


def rankings(ranking: str | None, engine: dict | None = None) -> dict[str, str]:
    """Each ranked policy's ranking under setting ``ranking``: "best" resolved as the file's
    ``provenance.engine`` records it (files that do not: :data:`LEGACY_BEST_RANKING`), or,
    without ``engine``, as the engine resolves it now."""
    best = BEST_RANKING if engine is None else recorded_best_ranking(engine)
    return {policy: resolve_ranking(policy, ranking, best) for policy in RANKED_POLICIES}


def engine_summary(calibration: Calibration) -> str:
    """The engine choices a calibration timed, as a cost note says them (``fused cache
    append, best ranking, whole-wave chunks, summed Collect-2-Query``)."""
    choices, now = engine_choices(calibration), current_choices()
    words = []
    for name in [*(n for n in CHOICE_WORDS if n in choices),
                 *(n for n in choices if n not in CHOICE_WORDS)]:
        value, how = choices[name], CHOICE_WORDS.get(name)
        if how is None:
            said = None if value == now.get(name) else f"{name}={value}"
        elif isinstance(how, str):
            said = how.format(value)
        else:
            said = how.get(value, f"{name}={value}")
        if said:
            words.append(said)
    if choices["ranking"] == now["ranking"]:      # "best" resolved otherwise than it is now
        ran, current = rankings(choices["ranking"], calibration.engine), rankings(now["ranking"])
        words += [f"{policy} ranked by {how}" for policy, how in ran.items()
                  if how != current[policy]]
    return ", ".join(words)


def _may_have_a_gpu() -> bool:
    """Whether this machine may have a CUDA GPU (torch already loaded, or an NVIDIA driver
    present), without importing torch to find out."""
    import os
    import shutil
    import sys
    return ("torch" in sys.modules or os.path.exists("/proc/driver/nvidia")
            or shutil.which("nvidia-smi") is not None)


def gpu_mismatch(measured_on: str | None, hardware) -> str | None:
    """A warning when a file measured on GPU ``measured_on`` (as torch names it, e.g. 'NVIDIA
    H200') prices ``hardware`` (a :class:`~specsim.specs.HardwareSpec`) of another kind: the
    GPU's model names (H200, A100, …) are compared; None when they match or one is unknown."""
    if not measured_on or hardware is None:
        return None
    words = str(measured_on).replace("NVIDIA", "").replace("-", " ").split()
    if not words:
        return None
    family = words[0].upper()
    names = f"{hardware.name} {hardware.key}".upper().replace("-", " ").split()
    if family in names:
        return None
    return (f"measured on {measured_on}, used to price {hardware.name}: another GPU's "
            f"measurements")


def provenance_warnings(calibration: Calibration, model: ModelSpec, hardware=None
                        ) -> list[str]:
    """Flags for a calibration used away from where it was measured: by an engine without
    padded caches, on another model's shapes, for another GPU than ``hardware``, on another
    GPU or torch than this machine's."""
    prov = calibration.provenance
    out = []
    other = gpu_mismatch(prov.get("gpu"), hardware)
    if other:
        out.append(f"calibration {other}")
    if "cache_align" not in calibration.engine:
        # a file without padded caches also lacks per-policy verify rows and the loop
        # overheads measured by the loop's own clock: its speculative overheads run 40–60%
        # high (Quest's 2–3×) beside a file that has them, its policies' verify up to 20% off
        date = str(prov.get("date") or "?")[:10]
        out.append(f"calibration measured by an older engine ({date}: "
                   f"before padded caches, per-policy verify rows and the loop overheads' "
                   f"re-measurement): its speculative loop overheads run high, and the "
                   f"policies that collect every verify row (last-token, SparseSpec-L) are "
                   f"priced at the shared verify — re-measure with `specsim calibrate --gpu` "
                   f"for validated figures")
    if prov.get("model_spec_hash") != model.spec_hash():
        out.append(f"calibration measured on model '{prov.get('model')}' shapes "
                   f"(spec {prov.get('model_spec_hash')}), used for '{model.name}' "
                   f"(spec {model.spec_hash()})")
    if not _may_have_a_gpu():
        return out      # no local GPU to compare with: torch (a quarter GiB) stays unloaded
    try:
        import torch
        here = torch.cuda.get_device_properties(0).name if torch.cuda.is_available() else None
        if here and prov.get("gpu") and here != prov["gpu"]:
            out.append(f"calibration measured on {prov['gpu']}, this GPU is {here}")
        if here and prov.get("torch") and prov["torch"] != torch.__version__:
            out.append(f"calibration measured with torch {prov['torch']}, this is "
                       f"{torch.__version__}")
    except ImportError:
        pass
    return out
