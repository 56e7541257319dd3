"""The calibration file: what ``specsim calibrate --gpu`` writes and the calibrated cost model
reads, its validation on reading, and the record of where it was measured.

A file holds, per operation — ``plain`` (one decode step), ``verify`` (one verify pass of q
query tokens; ``verify:<policy>`` the same pass on a policy's own engine), ``draft:<policy>``
(one sparse draft step), ``selection:<policy>`` (one refresh), ``overhead:plain`` and
``overhead:speculative[:<policy>]`` (the decoding loop's per-step and per-iteration time
beyond its priced steps) — raw timing samples at grid points (batch, context, q, s), with
their medians and spread, plus provenance: GPU, driver, CUDA, torch, triton, kernel
configuration hash, model spec hash, date, and ``engine``, the engine's settings
(:class:`specsim.settings.EngineSettings`) and how the harness timed its steps.

Every problem with a file is a one-line :class:`~specsim.errors.SpecsimError` naming the file
and the field, never a traceback.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, field

import numpy as np

from specsim.atomic import atomic_writer, read_versioned_json
from specsim.errors import SpecsimError
from specsim.policies import get_policy
from specsim.settings import EngineSettings
from specsim.specs import ModelSpec

FORMAT_KEY = "specsim_calibration"
VERSION = 1
#: Op families of step timings (as opposed to the loop overheads).
STEP_KINDS = ("plain", "verify", "draft", "selection")
#: Every op family: the op name before its first ':'; ``prefill``: the engine's prefill of
#: ``batch`` prompts of ``context`` tokens, one prompt a pass.
OP_FAMILIES = (*STEP_KINDS, "overhead", "prefill")
#: Measured loop overheads: per plain step, per speculative iteration (also per policy:
#: ``overhead:speculative:<policy>``).
OVERHEAD_OPS = ("overhead:plain", "overhead:speculative")
#: Provenance every file carries (each a string or null, ``gpu_memory_bytes`` a number or
#: null: a run without CUDA records no GPU).
PROVENANCE_FIELDS = ("gpu", "gpu_memory_bytes", "driver", "cuda", "torch", "triton",
                     "kernel_config_hash", "model_spec_hash", "model", "date")


@dataclass
class Measurement:
    """One grid point of one op: its timing samples in milliseconds."""

    op: str                 # family[:policy]: plain, verify, draft, selection, overhead
    batch: int
    context: int
    q: int = 1
    s: float | None = None
    samples_ms: list[float] = field(default_factory=list)

    @property
    def family(self) -> str:
        return self.op.split(":", 1)[0]

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    def to_json(self) -> dict:
        x = np.asarray(self.samples_ms, float)
        return {"op": self.op, "batch": self.batch, "context": self.context, "q": self.q,
                "s": self.s, "median_ms": float(np.median(x)),
                "p10_ms": float(np.percentile(x, 10)), "p90_ms": float(np.percentile(x, 90)),
                "samples_ms": [round(float(v), 6) for v in x]}


@dataclass
class Calibration:
    provenance: dict
    ceilings: dict
    measurements: list[Measurement]
    path: str | None = None

    def ops(self) -> list[str]:
        return sorted({m.op for m in self.measurements})

    @property
    def engine(self) -> dict:
        """``provenance.engine`` as recorded (empty where the file records none)."""
        return self.provenance.get("engine") or {}

    @property
    def settings(self) -> EngineSettings:
        """The engine settings the file's steps were timed with (files that predate a setting
        ran as :meth:`EngineSettings.from_provenance` says)."""
        return EngineSettings.from_provenance(self.engine)

    def to_json(self) -> dict:
        return {FORMAT_KEY: VERSION, "provenance": self.provenance, "ceilings": self.ceilings,
                "measurements": [m.to_json() for m in self.measurements]}

    def write(self, path: str) -> None:
        with atomic_writer(path) as fh:
            json.dump(self.to_json(), fh, indent=1)


def _bad(path, message) -> SpecsimError:
    return SpecsimError(f"{path}: bad calibration file: {message}")


def read_calibration(path: str) -> Calibration:
    """The calibration in ``path``, validated: a missing, truncated or malformed file, or one
    with a field out of range, raises a one-line :class:`SpecsimError` that names it."""
    doc, prov = read_versioned_json(path, "calibration file", FORMAT_KEY, VERSION)
    _check_provenance(path, prov)
    ceilings = doc.get("ceilings", {})
    if not isinstance(ceilings, dict):
        raise _bad(path, "ceilings must be an object")
    rows = doc.get("measurements")
    if not isinstance(rows, list) or not rows:
        raise _bad(path, "no measurements")
    out = [_measurement(path, f"measurements[{i}]", row) for i, row in enumerate(rows)]
    return Calibration(prov, ceilings, out, path)


def _check_provenance(path, prov: dict) -> None:
    missing = [f for f in PROVENANCE_FIELDS if f not in prov]
    if missing:
        raise _bad(path, f"provenance lacks {', '.join(missing)}")
    for name in PROVENANCE_FIELDS:
        value = prov[name]
        number = name == "gpu_memory_bytes"
        ok = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                               if number else isinstance(value, str))
        if not ok:
            raise _bad(path, f"provenance.{name}: expected "
                             f"{'a number' if number else 'a string'} or null")
    engine = prov.get("engine", {})
    if not isinstance(engine, dict):
        raise _bad(path, "provenance.engine must be an object")
    try:
        EngineSettings.from_provenance(engine)
    except (SpecsimError, TypeError, ValueError, AttributeError) as exc:
        raise _bad(path, f"provenance.engine: {_one_line(exc)}") from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _measurement(path, where: str, row) -> Measurement:
    if not isinstance(row, dict):
        raise _bad(path, f"{where}: not an object")

    def value(name, parse, default=_REQUIRED):
        if name not in row and default is not _REQUIRED:
            return default
        if name not in row:
            raise _bad(path, f"{where}: missing {name}")
        try:
            return parse(row[name])
        except (TypeError, ValueError, OverflowError) as exc:
            raise _bad(path, f"{where}.{name}: {_one_line(exc)}") from None

    op = value("op", _text)
    batch, context, q = value("batch", _integer), value("context", _integer), \
        value("q", _integer, 1)
    s = value("s", lambda v: None if v is None else _number(v), None)
    samples = value("samples_ms", lambda v: [_number(x) for x in _list(v)])
    if not all(1 <= x <= _MAX_COUNT for x in (batch, context, q)) or not samples:
        raise _bad(path, f"{where}: batch, context, q must be in 1..{_MAX_COUNT} and samples "
                         f"non-empty")
    family, _, policy = op.partition(":")
    if family not in OP_FAMILIES:
        raise _bad(path, f"{where}: unknown op {op!r}")
    if family == "overhead":   # a residual: wall time minus the parts, noise may be < 0
        if op not in OVERHEAD_OPS and not op.startswith("overhead:speculative:"):
            raise _bad(path, f"{where}: unknown op {op!r} (overheads: "
                             f"{', '.join(OVERHEAD_OPS)}, overhead:speculative:<policy>)")
        if op.startswith("overhead:speculative:"):
            _policy(path, where, op.split(":", 2)[2])
        if not all(math.isfinite(v) and abs(v) <= MAX_SAMPLE_MS for v in samples):
            raise _bad(path, f"{where}: samples must be finite milliseconds of at most "
                             f"{MAX_SAMPLE_MS:g}")
    elif not all(math.isfinite(v) and 0 < v <= MAX_SAMPLE_MS for v in samples):
        raise _bad(path, f"{where}: samples must be positive milliseconds of at most "
                         f"{MAX_SAMPLE_MS:g}")
    if family in ("plain", "prefill") and policy:
        raise _bad(path, f"{where}: unknown op {op!r}")
    if family == "verify" and policy:   # a policy's own verify pass (verify:quest)
        _policy(path, where, policy)
    if family in ("draft", "selection"):
        if not policy:
            raise _bad(path, f"{where}: op {op!r} needs a policy (e.g. draft:vegas)")
        _policy(path, where, policy)
        if s is None or not 0 < s <= 1:
            raise _bad(path, f"{where}: op {op!r} needs a sparsity s in (0, 1]")
    return Measurement(op, batch, context, q, s, samples)


_REQUIRED = object()
#: The longest time one step may have taken, in milliseconds (a minute: a larger sample is a
#: unit mistake or a broken file, and would price steps beyond any GPU's).
MAX_SAMPLE_MS = 60_000.0
#: The largest batch, context or q a file may hold (positions are int32 on the GPU).
_MAX_COUNT = 2**31 - 1


def _text(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r:.40}")
    return value


def _list(value) -> list:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r:.40}")
    return value


def _integer(value) -> int:
    """A JSON integer (an integral number, not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value != int(value):
        raise ValueError(f"expected an integer, got {value!r:.40}")
    return int(value)


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r:.40}")
    return float(value)


def _policy(path, where: str, name: str) -> None:
    try:
        get_policy(name)
    except SpecsimError as exc:
        raise _bad(path, f"{where}: {_one_line(exc)}") from None


def collect_provenance(model: ModelSpec, kernel_config_hash: str) -> dict:
    """The software and hardware this process runs on (GPU fields only with CUDA)."""
    import platform

    prov = {"gpu": None, "gpu_memory_bytes": None, "driver": None, "cuda": None, "torch": None,
            "triton": None, "kernel_config_hash": kernel_config_hash,
            "model_spec_hash": model.spec_hash(), "model": model.name,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": platform.node()}
    try:
        import torch
        prov["torch"] = torch.__version__
        prov["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            prov["gpu"], prov["gpu_memory_bytes"] = p.name, int(p.total_memory)
            try:
                import subprocess
                prov["driver"] = subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True, text=True, timeout=10).stdout.strip() or None
            except (OSError, subprocess.SubprocessError):
                prov["driver"] = None
    except ImportError:
        pass
    # the installed version, read without importing triton: an import here, before the kernels
    # choose Triton's interpreter on a machine without a GPU, would fix its mode too early
    from importlib import metadata
    try:
        prov["triton"] = metadata.version("triton")
    except metadata.PackageNotFoundError:
        pass
    return prov
