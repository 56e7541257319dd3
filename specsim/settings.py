"""The engine's choices, in one frozen settings object passed to the engine and the kernel
planners and recorded (with a stable hash) in every calibration's provenance.

Each field has its default, what it means and the measurement behind the default. Nothing in
specsim reads the environment for engine behaviour: a run with other settings says so with
``specsim run/trace/calibrate --setting name=value`` (or by passing an :class:`EngineSettings`),
and its calibration records them (``provenance.engine.settings`` and ``settings_hash``), so a
cost model never silently mixes timings of two engines.

A calibration's ``provenance.engine`` also states facts of the engine that are not choices
(:data:`ENGINE_FACTS`: the fused cache append, whole-wave split-KV chunks, the chained
greedy drafts, the cache padding), and older files name some settings flat, by their own keys
(``fused_append``, ``ranking``, ``verify_splits``, ``c2q``, ...), or not at all.
:meth:`EngineSettings.from_provenance` reads all of them: missing keys take
:data:`LEGACY_DEFAULTS` (how those runs ran), and keys of retired settings (:data:`RETIRED`:
alternatives that lost a measurement) are accepted; :func:`retired_settings` says where such a
file ran otherwise than the engine runs now.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field, fields

from specsim.errors import SpecsimError


def _choice(default, choices: tuple, meaning: str):
    """A setting: its default (first of ``choices``), what each choice means and the
    measurement behind the default."""
    return field(default=default, metadata={"choices": choices, "meaning": meaning})


@dataclass(frozen=True)
class EngineSettings:
    #: What Vegas' verify pass writes for its refresh.
    c2q: str = _choice(
        "sum", ("sum", "rows"),
        "sum: one fp32 row per sequence, the collected rows' logits summed over every query "
        "head by the verify kernel (H200, Qwen3-8B shapes, batch 4, 128K, q = 16: Vegas' "
        "verify costs 2.5% over StreamingLLM's at engine level); rows: Collect-2-Query's two "
        "bf16 rows per query head, summed by the refresh (the proxy check always collects "
        "rows). The rankings are the same up to rounding")
    #: How SparseSpec-L's, Quest's and the other policies' lists are ranked.
    ranking: str = _choice(
        "best", ("best", "topk"),
        "best: each policy's fastest on the H200 (specsim.policies.BEST_RANKING): the radix "
        "kernels for every ranked policy (every layer's rows at once, Qwen3-8B, batch 4, "
        "128K: Vegas 553 against 790 us by torch.topk, SparseSpec-L 6.2 against 9.3 ms at "
        "s = 0.1, Quest 97 against 260 us a layer); torch.topk everywhere off CUDA. topk: "
        "torch.topk for every policy, for a GPU where the radix kernels are not the faster")
    #: Whether the hot steps replay as CUDA graphs.
    cuda_graphs: bool = _choice(
        True, (True, False),
        "True: on CUDA the draft step, the greedy draft chain, the verify pass and the "
        "selection refresh each replay as one CUDA graph (H200, Qwen3-8B shapes, batch 4, "
        "32K: the loop spends ~0.1 ms per iteration beyond its CUDA-event phases); False: "
        "eager launches (profiling, debugging)")
    #: Whether the model runs with fused q|k|v and gate|up projections.
    fuse_projections: bool = _choice(
        True, (True, False),
        "True: on CUDA the engine runs the model with q|k|v and gate|up as one matmul each "
        "(Transformer.fuse_projections; H200, Qwen3-8B shapes, batch 4, 32K, compiled "
        "layers: plain step 10.76 ms against 11.35 ms unfused); False: as loaded. Off CUDA "
        "the model runs as built")
    #: Whether the element-wise work around each layer's matmuls is compiled.
    compile_layers: bool = _choice(
        True, (True, False),
        "True: on CUDA RMSNorm, RoPE, q/k-norm, SwiGLU and the residuals around each layer's "
        "matmuls run as torch.compile'd code (Transformer.compile_layers; H200, Qwen3-8B "
        "shapes, batch 4, 32K: plain step 11.35 ms against 14.66 ms eager); False: eager. "
        "Off CUDA the model runs as built")

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value not in f.metadata["choices"] or type(value) is not type(f.default):
                raise SpecsimError(f"engine setting {f.name}={value!r}: expected one of "
                                   f"{', '.join(map(str, f.metadata['choices']))}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def stable_hash(self) -> str:
        """16 hex digits of the settings' canonical JSON: equal settings, equal hash, on every
        machine and Python."""
        return _hash(self.to_json())

    def replace(self, **changes) -> "EngineSettings":
        return dataclasses.replace(self, **changes)

    def differences(self, other: "EngineSettings") -> dict[str, tuple]:
        """``{name: (self's value, other's value)}`` for every field where they differ."""
        return {f.name: (getattr(self, f.name), getattr(other, f.name)) for f in fields(self)
                if getattr(self, f.name) != getattr(other, f.name)}

    @classmethod
    def from_json(cls, doc: dict) -> "EngineSettings":
        """Recorded settings."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - names)
        if unknown:
            raise SpecsimError(f"unknown engine setting {', '.join(unknown)} "
                               f"(known: {', '.join(sorted(names))})")
        return cls(**doc)

    @classmethod
    def from_provenance(cls, engine: dict) -> "EngineSettings":
        """The settings a calibration ran with, from its ``provenance.engine``: its
        ``settings`` where recorded, else the older flat keys, else how runs went before each
        was recorded (:data:`LEGACY_DEFAULTS`). Keys of :data:`RETIRED` settings and of
        :data:`ENGINE_FACTS` are accepted (not settings); any other key is an error."""
        names = {f.name for f in fields(cls)}
        if "settings" in engine:
            recorded = dict(engine["settings"])
            known = names | set(RETIRED)
        else:
            recorded = {name: engine.get(name, LEGACY_DEFAULTS[name]) for name in names}
            known = names | set(RETIRED) | set(ENGINE_FACTS) | {"settings_hash"}
            recorded.update({k: v for k, v in engine.items() if k not in names})
        unknown = sorted(set(recorded) - known)
        if unknown:
            raise SpecsimError(f"unknown engine setting {', '.join(unknown)} "
                               f"(known: {', '.join(sorted(names))})")
        return cls.from_json({k: v for k, v in recorded.items() if k in names})

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

    @classmethod
    def choices(cls) -> dict[str, tuple]:
        """Every setting's choices, by name, the default first."""
        return {f.name: f.metadata["choices"] for f in fields(cls)}

    @classmethod
    def help_text(cls) -> str:
        """Every setting with its choices, default and meaning: the CLI's ``--setting`` help."""
        lines = []
        for f in fields(cls):
            choices = "|".join(str(c).lower() for c in f.metadata["choices"])
            lines.append(f"{f.name}={choices} (default {str(f.default).lower()}): "
                         f"{f.metadata['meaning']}.")
        return "\n\n".join(lines)


#: Retired settings that were added after calibrations began recording a settings object,
#: each with how the engine ran before it existed: a recorded object that names it neither
#: there nor as its own key ran that value.
ADDED_SETTINGS = {"verify_append": "torch"}

#: Retired settings (alternatives that lost a measurement), with how the engine runs instead
#: and the measurement that chose it; a file that records one is read, and
#: :func:`retired_settings` reports a difference.
RETIRED = {
    "fused_append": (True, "one Triton kernel writes each draft/plain step's K/V rows (and "
                           "Quest's page bounds) on CUDA: H200, Qwen3-8B batch 4, 32K plain "
                           "step 9.92 ms against 10.54 ms with torch writes"),
    "verify_splits": ("waves", "full-attention passes cut keys into the fewest whole waves of "
                               "programs for the tiles of WAVE_CONFIGS: plain step 3.5% faster "
                               "for Qwen3-8B at batch 4, 32K and 7.7% for SmolLM2 at batch "
                               "32, 4K than about 2-4 chunks per multiprocessor (H200)"),
    "combine": ("loop", "one program per (sequence, KV head) merges its split-KV chunks; "
                        "loading them in blocks left Qwen3-8B's plain step unchanged (H200, "
                        "batch 4, 32K and 128K)"),
    "linear": ("torch", "projections by nn.Linear (cuBLAS); the skinny GEMM kernel made the "
                        "plain step 3% slower (H200)"),
    "last_token_rows": ("sum", "last-token's verify writes each collected row summed over "
                               "the query heads, fp32 (the kernel's collect_head_sum), and the "
                               "refresh picks the last accepted token's row: H200, Qwen3-8B "
                               "shapes, batch 4, 128K, k = 2, its verify 23.7 ms and "
                               "selection 0.84 ms against 27.2 and 1.14 ms with every query "
                               "head's rows in bf16 (Vegas' verify 23.2 ms)"),
    "shared_kv_strides": (False, "the verify and sparse draft kernels address V with its own "
                                 "strides; with K's offsets (where the strides are equal) "
                                 "they ran 0.995-1.089x as long, never faster beyond noise "
                                 "(H200, batch 4, hd128 and hd64, 32K and 128K, q = 1, 8, 16, "
                                 "collecting nothing and the summed row; hd64 q = 8-16: "
                                 "4-9% slower)"),
    "verify_append": ("fused", "one Triton kernel writes a verify pass's K/V rows (and "
                               "Quest's page bounds) on CUDA, where indexed torch writes made "
                               "about 10 launches a layer (Quest about 40): H200, each "
                               "calibrated model's verify rows 0.65-0.97 of the torch writes' "
                               "(Quest's 0.69-0.81 at 8B shapes); one H100, Qwen3-8B shapes, "
                               "batch 4, k = 2: Vegas' verify 7.78 -> 7.07 ms at 2K"),
}

#: ``provenance.engine`` keys that state how the engine ran, not choices: the chained greedy
#: drafts, the draft timing's chain length, the cache padding (positions a multiple of
#: ``cache_align`` where the model allows), the retired settings older files record, and what
#: ``ranking="best"`` resolved to per policy (``specsim.policies.BEST_RANKING``).
ENGINE_FACTS = ("draft_chain", "draft_timed_as_chain_of", "cache_align", "fused_append",
                "verify_splits", "verify_append", "best_ranking")

#: Environment variable that chose each setting in runs recorded before this object existed
#: (how an old file's notes name them), mapped to the setting or retired setting.
LEGACY_ENVIRONMENT = {"SPECSIM_C2Q": "c2q", "SPECSIM_RANKING": "ranking",
                      "SPECSIM_VERIFY_SPLITS": "verify_splits",
                      "SPECSIM_FUSED_APPEND": "fused_append",
                      "SPECSIM_SHARED_KV_STRIDES": "shared_kv_strides",
                      "SPECSIM_COMBINE": "combine", "SPECSIM_LINEAR": "linear"}

#: How runs went before each setting was recorded in ``provenance.engine``: Collect-2-Query's
#: rows, last-token's per-head rows, torch.topk, torch cache writes, chunks per
#: multiprocessor, the model as loaded, and each setting added since as it ran before.
LEGACY_DEFAULTS = {"c2q": "rows", "last_token_rows": "heads", "ranking": "topk",
                   "shared_kv_strides": False,
                   "cuda_graphs": True, "fuse_projections": False, "compile_layers": False,
                   "fused_append": False, "verify_splits": "sm", "combine": "loop",
                   "linear": "torch", **ADDED_SETTINGS}


def _hash(doc: dict) -> str:
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def recorded_settings(doc: dict) -> "EngineSettings":
    """A recorded settings object as the engine's settings: the keys of retired settings it
    names (:data:`RETIRED`, such as a setting the engine had when the file was written) are
    dropped; any other unknown key is an error."""
    return EngineSettings.from_json({k: v for k, v in doc.items() if k not in RETIRED})


def recorded_hash(doc: dict) -> str:
    """The hash a recorded settings object was written with: :meth:`EngineSettings.stable_hash`
    of it as it stands, a setting of :data:`ADDED_SETTINGS` left out at the value the engine
    ran before it (as files hashed while it was a setting)."""
    return _hash({k: v for k, v in doc.items()
                  if k not in ADDED_SETTINGS or ADDED_SETTINGS[k] != v})


def retired_settings(engine: dict) -> dict[str, tuple]:
    """``{name: (what the file ran, what the engine runs now)}`` for each retired setting a
    calibration's ``provenance.engine`` records (in its settings object, else under its own
    key) otherwise than the engine runs now; where it records none, a file without a settings
    object ran as :data:`LEGACY_DEFAULTS` says, one with a settings object as the engine runs
    now, but for a setting added after settings objects began (:data:`ADDED_SETTINGS`)."""
    recorded = dict(engine.get("settings") or {})
    out = {}
    for name, (now, _) in RETIRED.items():
        # a file with a settings object postdates the retired settings it does not name,
        # but for those added after settings objects began (ADDED_SETTINGS)
        before = ADDED_SETTINGS.get(name, now) if "settings" in engine else LEGACY_DEFAULTS[name]
        ran = recorded.get(name, engine.get(name, before))
        if ran != now:
            out[name] = (ran, now)
    return out


def retired_values(engine: dict) -> dict:
    """Each retired setting's value as a calibration's ``provenance.engine`` ran it
    (:func:`retired_settings`, else as the engine runs now)."""
    otherwise = retired_settings(engine)
    return {name: otherwise.get(name, (now,))[0] for name, (now, _) in RETIRED.items()}


def engine_provenance(settings: "EngineSettings", **facts) -> dict:
    """What a calibration records as its ``provenance.engine``: ``facts`` of the engine
    (:data:`ENGINE_FACTS`), what "best" ranking resolves to per policy, the retired settings
    that are engine facts as the engine runs them now, each setting under its own key (as
    older files name them), and the settings object with its hash."""
    unknown = sorted(set(facts) - set(ENGINE_FACTS))
    if unknown:
        raise ValueError(f"not engine facts: {', '.join(unknown)}")
    from specsim.policies import BEST_RANKING

    return {"draft_chain": True, **facts, "best_ranking": dict(BEST_RANKING),
            **{name: now for name, (now, _) in RETIRED.items() if name in ENGINE_FACTS},
            **settings.to_json(),
            "settings": settings.to_json(), "settings_hash": settings.stable_hash()}


DEFAULT = EngineSettings()


#: The most query tokens one verify pass takes per sequence (k + 1): the verify kernel's tiles
#: are sized for it, so the engine drafts at most k = MAX_Q_LEN - 1 tokens.
MAX_Q_LEN = 16
