"""Engine profiles: specsim's step costs adjusted to the serving engine a user runs (vLLM,
SGLang), fitted on that engine's own metrics.

**The capture** (``specsim_server_capture``, version 1; written by ``specsim calibrate
--from-server URL`` or by any script following this protocol): for each *run*, the server
decodes at a fixed concurrency (B requests in flight at all times, each of ``input_tokens``
prompt tokens and ``output_tokens`` new tokens, EOS ignored), and its Prometheus ``/metrics``
text is kept from just before and just after the run::

    {"specsim_server_capture": 1, "engine": "vllm", "engine_version": "0.34.0",
     "model": "Qwen/Qwen3-8B", "gpu": "NVIDIA H200",
     "runs": [{"concurrency": 8, "input_tokens": 4096, "output_tokens": 256,
               "speculative": null,            # or {"drafter": "eagle3", "k": 4}, or
                                               # {"drafter": "sparse-self", "policy": "vegas",
                                               #  "s": 0.05, "k": 4}
               "before": "<metrics text>", "after": "<metrics text>"}, ...]}

A run is read as counter deltas (every label set summed: ranks, engines): the mean time between
a request's output tokens (``<engine>:inter_token_latency_seconds`` or, in older versions,
``<engine>:time_per_output_token_seconds``: ``_sum`` over ``_count``), and for a speculative run
the tokens each request gains per iteration, τ (vLLM: 1 + accepted draft tokens over drafts,
``vllm:spec_decode_num_accepted_tokens_total`` / ``vllm:spec_decode_num_drafts_total``; SGLang:
the ``sglang:spec_accept_length`` gauge after the run, accepted drafts plus the bonus token per
verify). The engine's time per step is then the mean inter-token latency (plain decoding) or
that times τ (an iteration).

**The fit**, against the cost source's own prices at each run's shape (B sequences at the run's
mean context, ``input + output/2``)::

    plain step      t = a_plain · T_plain(B, C) + b_plain
    speculative     t = a_draft · k·C_d(B, C) + a_verify · C_v(B, C, k+1) + C_sel + b_iteration

by least squares relative to each run's time. Where the speculative runs cannot tell draft from
verify apart (one k, one drafter, too few runs), one scale serves both and the profile says so;
where there are too few runs for a fixed term, the fixed term is 0 and the profile says so.

**Applying it** (:class:`ProfiledCostModel`, ``predict --engine-profile P``): every plain step,
draft step and verify pass of the cost source is scaled and the fixed terms added, and every
answer's notes name the profile.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specsim.costs.base import Cost, IterationCost, as_contexts
from specsim.costs.fitted import relative_lstsq
from specsim.errors import SpecsimError

CAPTURE_KEY = "specsim_server_capture"
PROFILE_KEY = "specsim_engine_profile"
ENGINES = ("vllm", "sglang")
#: The servers' method names that are another name of a specsim drafter kind.
SERVER_METHODS = {"eagle3": "eagle", "draft_model": "draft-model", "medusa": "medusa",
                  "ngram": "ngram", "mtp": "mtp", "eagle": "eagle"}
#: Inter-token latency histograms, newest name first.
ITL_NAMES = ("inter_token_latency_seconds", "time_per_output_token_seconds")


class ProfileError(SpecsimError):
    """A capture or profile that cannot be read or fitted."""


# --------------------------------------------------------------------------------------------
# the capture
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Speculative:
    drafter: str                 # "sparse-self" or a specsim drafter (eagle3, ngram, …)
    k: int
    policy: str | None = None    # sparse-self: the policy
    s: float | None = None       # sparse-self: the sparsity


@dataclass(frozen=True)
class Run:
    """One captured run, read: its shape and the engine's time per step."""

    concurrency: int
    input_tokens: int
    output_tokens: int
    speculative: Speculative | None
    inter_token_s: float          # mean time between a request's output tokens
    tokens_per_iteration: float   # τ (1 for plain decoding)

    @property
    def context(self) -> int:
        return int(self.input_tokens + self.output_tokens / 2)

    @property
    def step_s(self) -> float:
        """The engine's time per step (plain) or per iteration (speculative)."""
        return self.inter_token_s * self.tokens_per_iteration

    def label(self) -> str:
        what = "plain" if self.speculative is None else (
            f"{self.speculative.drafter}"
            + (f" {self.speculative.policy} s={self.speculative.s:g}"
               if self.speculative.policy else "") + f" k={self.speculative.k}")
        return f"{what} at {self.concurrency}x{self.input_tokens}+{self.output_tokens}"


@dataclass(frozen=True)
class Capture:
    engine: str
    engine_version: str | None
    model: str | None
    gpu: str | None
    runs: tuple[Run, ...]
    path: str = ""


def _sums(text: str, where: str) -> dict[str, float]:
    """Every sample of a metrics text, summed over its label sets: name → value."""
    from specsim.traces.importers.vllm_metrics import parse_sample
    out: dict[str, float] = {}
    for n, line in enumerate(str(text).splitlines(), 1):
        if line.strip() == "# EOF":
            break
        try:
            sample = parse_sample(line, where, n)
        except SpecsimError as exc:
            raise ProfileError(f"{where}: {exc}") from None
        if sample is not None:
            name, _, value, _ = sample
            out[name] = out.get(name, 0.0) + value
    return out


def _delta(before: dict, after: dict, name: str, where: str) -> float | None:
    if name not in after:
        return None
    d = after[name] - before.get(name, 0.0)
    if d < 0:
        raise ProfileError(f"{where}: {name} fell during the run ({before.get(name)} → "
                           f"{after[name]}): the server restarted; capture the run again")
    return d


def _whole(doc: dict, key: str, where: str, minimum: int) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v != int(v) or v < minimum:
        raise ProfileError(f"{where}: {key}: expected an integer ≥ {minimum}, got {v!r}")
    return int(v)


def _speculative(doc, where: str) -> Speculative | None:
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise ProfileError(f"{where}: speculative: expected null or an object, got {doc!r}")
    drafter = doc.get("drafter")
    if not isinstance(drafter, str) or not drafter:
        raise ProfileError(f"{where}: speculative.drafter: expected a drafter name "
                           f"(sparse-self, eagle3, ngram, …), got {drafter!r}")
    k = _whole(doc, "k", f"{where}: speculative", 1)
    policy, s = doc.get("policy"), doc.get("s")
    if drafter == "sparse-self":
        from specsim.policies import SELECTION_POLICIES
        if policy not in SELECTION_POLICIES + ("streamingllm",):
            raise ProfileError(f"{where}: speculative.policy: a sparse-self run names its "
                               f"policy, got {policy!r}")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s <= 1:
            raise ProfileError(f"{where}: speculative.s: expected a sparsity in (0, 1], got "
                               f"{s!r}")
        return Speculative(drafter, k, policy, float(s))
    from specsim.drafters import parse_drafter
    kind, sep, name = drafter.partition(":")
    drafter = SERVER_METHODS.get(kind.lower(), kind) + sep + name
    try:
        parse_drafter(drafter, origin="capture")
    except SpecsimError as exc:
        raise ProfileError(f"{where}: speculative.drafter: {exc}") from None
    return Speculative(drafter, k)


def read_run(doc: dict, engine: str, where: str) -> Run:
    """One run of a capture: its shape, and its deltas read as time per step."""
    if not isinstance(doc, dict):
        raise ProfileError(f"{where}: expected an object, got {type(doc).__name__}")
    b = _whole(doc, "concurrency", where, 1)
    inp = _whole(doc, "input_tokens", where, 1)
    out = _whole(doc, "output_tokens", where, 2)
    spec = _speculative(doc.get("speculative"), where)
    texts = []
    for side in ("before", "after"):
        if not isinstance(doc.get(side), str):
            raise ProfileError(f"{where}: {side}: expected the server's metrics text")
        texts.append(_sums(doc[side], f"{where}: {side}"))
    before, after = texts
    itl = None
    for name in ITL_NAMES:
        total = _delta(before, after, f"{engine}:{name}_sum", where)
        count = _delta(before, after, f"{engine}:{name}_count", where)
        if total is not None and count is not None:
            if not (math.isfinite(total) and math.isfinite(count)):
                raise ProfileError(f"{where}: {engine}:{name}: the counts are not finite "
                                   f"numbers")
            if count <= 0 or total <= 0:
                raise ProfileError(f"{where}: {engine}:{name} counted no output tokens during "
                                   f"the run: nothing was decoded")
            itl = total / count
            break
    if itl is None:
        raise ProfileError(f"{where}: no inter-token latency histogram "
                           f"({' or '.join(f'{engine}:{n}' for n in ITL_NAMES)}) in the "
                           f"metrics after the run")
    tau = 1.0
    if spec is not None:
        if engine == "vllm":
            drafts = _delta(before, after, "vllm:spec_decode_num_drafts_total", where)
            accepted = _delta(before, after, "vllm:spec_decode_num_accepted_tokens_total",
                              where)
            if not drafts or accepted is None:
                raise ProfileError(f"{where}: a speculative run needs "
                                   f"vllm:spec_decode_num_drafts_total and "
                                   f"vllm:spec_decode_num_accepted_tokens_total to grow")
            tau = 1.0 + accepted / drafts
            if not math.isfinite(tau) or tau < 1:
                raise ProfileError(f"{where}: the spec-decode counters give {tau!r} tokens "
                                   f"per iteration")
        else:
            length = after.get("sglang:spec_accept_length")
            if length is None or not (length >= 1 and math.isfinite(length)):
                raise ProfileError(f"{where}: a speculative run needs the "
                                   f"sglang:spec_accept_length gauge (≥ 1) after the run")
            tau = float(length)
        if tau > spec.k + 1 + 1e-9:
            raise ProfileError(f"{where}: {tau:.3f} tokens per iteration is more than k + 1 = "
                               f"{spec.k + 1}: k does not match the server")
    return Run(b, inp, out, spec, float(itl), float(tau))


def _document(path: str, key: str, what: str, hint: str = "") -> dict:
    """The JSON object of ``path`` carrying ``key`` = 1, else a one-line refusal."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such {what}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get(key) != 1:
        raise ProfileError(f'{path}: not a specsim {what} (expected "{key}": 1{hint})')
    return doc


def read_capture(path: str) -> Capture:
    doc = _document(path, CAPTURE_KEY, "server capture")
    engine = doc.get("engine")
    if engine not in ENGINES:
        raise ProfileError(f"{path}: engine: expected one of {', '.join(ENGINES)}, got "
                           f"{engine!r}")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ProfileError(f"{path}: runs: expected a non-empty list")
    read = tuple(read_run(r, engine, f"{path}: run {i + 1}") for i, r in enumerate(runs))

    def text(key):
        v = doc.get(key)
        return None if v is None else str(v)

    return Capture(engine, text("engine_version"), text("model"), text("gpu"), read, path)


# --------------------------------------------------------------------------------------------
# the profile
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineProfile:
    engine: str
    engine_version: str | None
    model: str | None
    gpu: str | None
    plain_scale: float
    plain_fixed_s: float
    draft_scale: float | None
    verify_scale: float | None
    iteration_fixed_s: float
    fitted_against: str                  # the cost source's note
    runs: tuple[dict, ...] = ()          # per run: shape, measured and fitted seconds
    notes: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    path: str = ""

    @property
    def label(self) -> str:
        version = f" {self.engine_version}" if self.engine_version else ""
        where = self.path or "engine profile"
        return f"{self.engine}{version} profile ({where})"

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("path")
        d["runs"], d["notes"], d["sources"] = list(self.runs), list(self.notes), list(
            self.sources)
        return {PROFILE_KEY: 1, **d}

    def write(self, path: str) -> None:
        from specsim.atomic import write_text_atomic
        write_text_atomic(path, json.dumps(self.to_json(), indent=1))


def read_profile(path: str) -> EngineProfile:
    doc = _document(path, PROFILE_KEY, "engine profile",
                    "; `specsim calibrate --from-server` writes one")
    names = [f.name for f in dataclasses.fields(EngineProfile) if f.name != "path"]
    missing = [n for n in names if n not in doc]
    if missing:
        raise ProfileError(f"{path}: missing {', '.join(missing)}")
    def number(v):
        return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)

    for n in ("plain_scale", "plain_fixed_s", "iteration_fixed_s", "draft_scale",
              "verify_scale"):
        v = doc[n]
        if not (number(v) or (v is None and n in ("draft_scale", "verify_scale"))):
            raise ProfileError(f"{path}: {n}: expected a number, got {v!r}")
    for n in ("plain_scale", "draft_scale", "verify_scale"):
        if doc[n] is not None and not doc[n] > 0:
            raise ProfileError(f"{path}: {n}: expected a positive factor, got {doc[n]!r}")
    if (doc["draft_scale"] is None) != (doc["verify_scale"] is None):
        raise ProfileError(f"{path}: draft_scale and verify_scale: both numbers or both null")
    for n in ("engine", "fitted_against"):
        if not isinstance(doc[n], str):
            raise ProfileError(f"{path}: {n}: expected a text, got {doc[n]!r}")
    for n in ("engine_version", "model", "gpu"):
        if doc[n] is not None and not isinstance(doc[n], str):
            raise ProfileError(f"{path}: {n}: expected a text or null, got {doc[n]!r}")
    for n in ("runs", "notes", "sources"):
        if not isinstance(doc[n], list):
            raise ProfileError(f"{path}: {n}: expected a list, got {doc[n]!r}")
    if not all(isinstance(r, dict) and all(number(r.get(k)) and r.get(k) > 0 for k in
                                           ("measured_s", "fitted_s", "specsim_s"))
               for r in doc["runs"]):
        raise ProfileError(f"{path}: runs: expected objects with positive measured_s, "
                           f"fitted_s and specsim_s")
    values = {n: doc[n] for n in names}
    values["runs"] = tuple(doc["runs"])
    for n in ("notes", "sources"):
        values[n] = tuple(str(x) for x in doc[n])
    return EngineProfile(**values, path=path)


def _identifiable(x: np.ndarray) -> bool:
    """Whether the columns of ``x`` (each scaled to its largest value) can be told apart."""
    scaled = x / np.maximum(np.abs(x).max(0), 1e-30)
    return x.shape[0] >= x.shape[1] and np.linalg.matrix_rank(scaled) == x.shape[1] and \
        np.linalg.cond(scaled) < 1e6


def _spec_costs(costs, spec: Speculative):
    """The cost model pricing ``spec``'s drafter, and the (s, policy) its steps take."""
    if spec.drafter == "sparse-self":
        return costs, spec.s, spec.policy
    from specsim.drafters import DrafterCosts, parse_drafter
    return DrafterCosts(costs, parse_drafter(spec.drafter, origin="capture")), None, None


def fit_profile(captures: Sequence[Capture], costs, fitted_against: str) -> EngineProfile:
    """Fit the profile (module doc) of ``captures`` (one engine) against ``costs``."""
    runs = [r for c in captures for r in c.runs]
    engines = {c.engine for c in captures}
    if len(engines) != 1:
        raise ProfileError(f"captures of different engines ({', '.join(sorted(engines))}): "
                           f"one profile per engine")
    notes: list[str] = []
    plain = [r for r in runs if r.speculative is None]
    spec = [r for r in runs if r.speculative is not None]
    if not plain:
        raise ProfileError("no plain-decoding run in the captures: capture the server without "
                           "speculative decoding too (the plain step anchors the profile)")
    p_price = np.array([costs.plain_step([r.context] * r.concurrency).seconds for r in plain])
    p_meas = np.array([r.step_s for r in plain])
    x = np.stack([p_price, np.ones_like(p_price)], 1)
    if _identifiable(x) and len(plain) >= 3:
        a_plain, b_plain = (float(v) for v in relative_lstsq(x, p_meas))
    else:
        a_plain, b_plain = float(np.median(p_meas / p_price)), 0.0
        notes.append(f"plain: {len(plain)} run(s) of too few shapes for a fixed term: a scale "
                     f"alone")
    a_draft = a_verify = None
    b_iter = 0.0
    rows = []
    if spec:
        parts = []
        for r in spec:
            model, s, policy = _spec_costs(costs, r.speculative)
            it = model.iteration([r.context] * r.concurrency, r.speculative.k, s, policy)
            parts.append((it.draft.seconds, it.verify.seconds, it.selection.seconds))
        d, v, sel = (np.array(c) for c in zip(*parts))
        y = np.array([r.step_s for r in spec]) - sel
        full = np.stack([d, v, np.ones_like(d)], 1)
        shared = np.stack([d + v, np.ones_like(d)], 1)
        if _identifiable(full) and len(spec) >= 4:
            a_draft, a_verify, b_iter = (float(c) for c in relative_lstsq(full, y))
        elif _identifiable(shared) and len(spec) >= 3:
            a, b_iter = (float(c) for c in relative_lstsq(shared, y))
            a_draft = a_verify = a
            notes.append("speculative runs cannot tell draft from verify apart (vary k or the "
                         "shapes): one scale for both")
        else:
            a = float(np.median(y / (d + v)))
            a_draft = a_verify = a
            notes.append(f"speculative: {len(spec)} run(s): one scale for draft and verify, "
                         f"no fixed term")
        for r, di, vi, si in zip(spec, d, v, sel):
            rows.append({"run": r.label(), "measured_s": r.step_s,
                         "fitted_s": a_draft * di + a_verify * vi + si + b_iter,
                         "specsim_s": di + vi + si})
    else:
        notes.append("no speculative run: draft and verify are not scaled (plain steps only)")
    for r, pr in zip(plain, p_price):
        rows.insert(0, {"run": r.label(), "measured_s": r.step_s,
                        "fitted_s": a_plain * pr + b_plain, "specsim_s": pr})
    if a_plain <= 0 or (a_draft is not None and (a_draft <= 0 or a_verify <= 0)):
        raise ProfileError("the fit gave a non-positive scale: the runs disagree with any "
                           "linear profile (check each run's concurrency and lengths)")
    first = captures[0]
    return EngineProfile(first.engine, first.engine_version, first.model, first.gpu, a_plain,
                         b_plain, a_draft, a_verify, b_iter, fitted_against, tuple(rows),
                         tuple(notes), tuple(c.path for c in captures))


def profile_note(profile: EngineProfile, model) -> str:
    """What applying ``profile`` to ``model``'s costs does, in one clause."""
    terms = [f"plain steps x{profile.plain_scale:.3f} + {profile.plain_fixed_s * 1e3:.3f} ms"]
    if profile.draft_scale is not None:
        terms.append(f"draft x{profile.draft_scale:.3f}, verify x{profile.verify_scale:.3f}, "
                     f"{profile.iteration_fixed_s * 1e3:.3f} ms per iteration")
    note = f"adjusted to the {profile.label}: " + ", ".join(terms)
    if profile.model and model is not None and not _same_model(profile.model, model):
        note += (f"; WARNING: the profile was fitted on {profile.model}, not "
                 f"{model.name}")
    return note


def _same_model(name: str, model) -> bool:
    from specsim.specs import catalogue_name
    return catalogue_name(name) == model.name or name == model.name


def profile_error(profile: EngineProfile) -> float:
    """Mean relative error of the fitted steps against the measured ones."""
    errs = [abs(r["fitted_s"] / r["measured_s"] - 1) for r in profile.runs]
    return float(np.mean(errs)) if errs else float("nan")


# --------------------------------------------------------------------------------------------
# applying it
# --------------------------------------------------------------------------------------------
class ProfiledCostModel:
    """``base``'s costs adjusted by ``profile``: plain steps ``a·T + b``, draft steps and
    verify passes scaled, the per-iteration fixed term in place of the base's overhead;
    everything else (selection, prefill, …) is the base's."""

    def __init__(self, base, profile: EngineProfile):
        self.base, self.profile = base, profile
        self.name = f"{base.name}+{profile.engine}"
        self.model = base.model
        self.overheads = base.overheads

    def __getattr__(self, name):
        return getattr(self.base, name)

    def _adjusted(self, cost: Cost, scale: float | None, what: str, fixed: float = 0.0
                   ) -> Cost:
        """``scale·cost + fixed`` with a note (``cost`` itself where ``scale`` is None)."""
        if scale is None:
            return cost
        return dataclasses.replace(cost, seconds=scale * cost.seconds + fixed, notes=(
            *cost.notes, f"{what} adjusted to the {self.profile.label}"))

    def plain_step(self, contexts: Sequence[int]) -> Cost:
        p = self.profile
        return self._adjusted(self.base.plain_step(contexts), p.plain_scale, "plain step",
                              p.plain_fixed_s)

    def draft_step(self, contexts: Sequence[int], s=None, policy=None) -> Cost:
        return self._adjusted(self.base.draft_step(contexts, s, policy),
                              self.profile.draft_scale, "draft step")

    def verify(self, contexts: Sequence[int], q: int) -> Cost:
        return self._adjusted(self.base.verify(contexts, q), self.profile.verify_scale,
                              "verify")

    def iteration(self, contexts: Sequence[int], k: int, s=None, policy=None) -> IterationCost:
        it = self.base.iteration(as_contexts(contexts), k, s, policy)
        p = self.profile
        return IterationCost(
            k=k, draft_step=self._adjusted(it.draft_step, p.draft_scale, "draft step"),
            verify=self._adjusted(it.verify, p.verify_scale, "verify"), selection=it.selection,
            overhead_s=it.overhead_s if p.draft_scale is None else p.iteration_fixed_s)
