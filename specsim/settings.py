"""The engine's choices, in one frozen settings object passed to the engine and the kernel
planners and recorded (with a stable hash) in every calibration's provenance.

Each field has its default, what it means and the measurement behind the default. Nothing in
specsim reads the environment for engine behaviour: a run with other settings says so with
``specsim run/calibrate --setting name=value`` (or by passing an :class:`EngineSettings`), and
its calibration records them, so a cost model never silently mixes timings of two engines.

Calibration files written before this object existed recorded some of the same choices under
their own names (``provenance.engine``: ``fused_append``, ``ranking``, ``verify_splits``,
``c2q``), and files older still did not record them at all; :meth:`EngineSettings.from_provenance`
reads both (:data:`LEGACY_DEFAULTS`: how those older runs ran).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field, fields

from specsim.errors import SpecsimError


def _choice(default, choices: tuple, meaning: str):
    return field(default=default, metadata={"choices": choices, "meaning": meaning})


@dataclass(frozen=True)
class EngineSettings:
    #: How Vegas' verify pass writes what Vegas ranks by.
    c2q: str = _choice(
        "sum", ("sum", "rows"),
        "sum: one fp32 row per sequence, the collected rows' logits summed over every query "
        "head by the verify kernel (at engine level Vegas' verify costs 2.5% over "
        "StreamingLLM's: H200, Qwen3-8B shapes, batch 4, 128K, q = 16); rows: "
        "Collect-2-Query's two bf16 rows per query head, summed by the refresh")
    #: How SparseSpec-L's, Quest's and the other policies' lists are ranked.
    ranking: str = _choice(
        "best", ("best", "topk", "sort", "radix"),
        "best: the radix kernel for SparseSpec-L and Quest, torch.topk for the others "
        "(torch.topk everywhere off CUDA)")
    #: How full-attention passes cut each (sequence, KV head)'s keys into chunks.
    verify_splits: str = _choice(
        "waves", ("waves", "sm"),
        "waves: the fewest whole waves of programs for the probed tiles (H200: plain step "
        "3.5% faster for Qwen3-8B at batch 4, 32K; 7.7% for SmolLM2 at batch 32, 4K); sm: "
        "about 2-4 chunks per multiprocessor")
    #: Whether one Triton kernel writes each draft/plain step's new K/V rows.
    fused_append: bool = _choice(
        True, (True, False),
        "True: one Triton kernel writes each step's K/V rows (and Quest's page bounds) on "
        "CUDA; False: torch writes them")
    #: Whether the verify and sparse-draft kernels address V with K's offsets.
    shared_kv_strides: bool = _choice(
        False, (True, False),
        "True: where V's strides equal K's (the engine's caches), V is addressed with K's "
        "offsets; False: V's own strides")

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value not in f.metadata["choices"]:
                raise SpecsimError(f"engine setting {f.name}={value!r}: expected one of "
                                   f"{', '.join(map(str, f.metadata['choices']))}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def stable_hash(self) -> str:
        """16 hex digits of the settings' canonical JSON: equal settings, equal hash, on every
        machine and Python."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def replace(self, **changes) -> "EngineSettings":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_json(cls, doc: dict) -> "EngineSettings":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - names)
        if unknown:
            raise SpecsimError(f"unknown engine setting {', '.join(unknown)} "
                               f"(known: {', '.join(sorted(names))})")
        return cls(**doc)

    @classmethod
    def from_provenance(cls, engine: dict) -> "EngineSettings":
        """The settings a calibration ran with, from its ``provenance.engine``: its
        ``settings`` where recorded, else the older per-setting keys, else how runs ran
        before each was recorded (:data:`LEGACY_DEFAULTS`)."""
        if "settings" in engine:
            return cls.from_json(engine["settings"])
        doc = {name: engine.get(name, LEGACY_DEFAULTS[name]) for name in LEGACY_DEFAULTS}
        return cls.from_json(doc)

    @classmethod
    def parse(cls, assignments: list[str] | tuple[str, ...], base: "EngineSettings | None" = None
              ) -> "EngineSettings":
        """``base`` (default: the defaults) with ``name=value`` assignments applied, as the
        CLI's ``--setting`` gives them; one-line errors for an unknown name or value."""
        out = base or cls()
        by_name = {f.name: f for f in fields(cls)}
        for text in assignments:
            name, sep, value = text.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in by_name:
                raise SpecsimError(f"--setting {text!r}: expected name=value with name one of "
                                   f"{', '.join(sorted(by_name))}")
            choices = by_name[name].metadata["choices"]
            parsed = {str(c).lower(): c for c in choices}.get(value.strip().lower())
            if parsed is None:
                raise SpecsimError(f"--setting {text!r}: {name} takes "
                                   f"{', '.join(map(str, choices))}")
            out = out.replace(**{name: parsed})
        return out


#: Environment variable that chose each setting in runs recorded before this object existed
#: (how an old file's notes name them), mapped to the field.
LEGACY_ENVIRONMENT = {"SPECSIM_C2Q": "c2q", "SPECSIM_RANKING": "ranking",
                      "SPECSIM_VERIFY_SPLITS": "verify_splits",
                      "SPECSIM_FUSED_APPEND": "fused_append",
                      "SPECSIM_SHARED_KV_STRIDES": "shared_kv_strides"}

#: How runs went before each setting was recorded in ``provenance.engine``.
LEGACY_DEFAULTS = {"c2q": "rows", "ranking": "topk", "verify_splits": "sm",
                   "fused_append": False, "shared_kv_strides": False}

DEFAULT = EngineSettings()
