"""Model and hardware specs: what the cost models need to know about a model and a GPU.

A :class:`ModelSpec` is read straight from a HuggingFace ``config.json`` (Llama, Qwen2, Qwen3,
Qwen3-MoE, gpt-oss families); it counts parameters and KV bytes per token. A
:class:`HardwareSpec` holds datasheet ceilings plus optional *measured* ceilings that override
them. Both can be given by catalogue name (``models/<name>/config.json``,
``models/hardware/<name>.json``) or by path.

Both files are read strictly (:func:`read_json_file`: UTF-8, a byte-order mark allowed, no
NaN/Infinity, no duplicate keys, no number that overflows a float) and range-checked: every
size is a whole number in 1..its bound (:data:`MODEL_BOUNDS`), query heads divide into KV
heads, every ceiling is a positive finite number below :data:`HARDWARE_BOUNDS`. A bad file
ends in one :class:`~specsim.errors.SpecFileError` naming the file, the line and the field.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specsim.errors import SpecFileError, SpecsimError, UnknownNameError, quote
from specsim.shipped import catalog_dirs, catalog_file, catalog_names


# --------------------------------------------------------------------------------------------
# Model spec
# --------------------------------------------------------------------------------------------

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool = False
    qk_norm: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    num_experts: int = 0                  # 0: dense MLP
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    expert_bias: bool = False             # gpt-oss experts and router carry biases
    attention_sinks: bool = False         # gpt-oss: one learned sink logit per head and layer
    layer_types: tuple[str, ...] = ()     # per layer: full_attention | sliding_attention
    sliding_window: int | None = None
    max_context: int | None = None
    dtype_bytes: int = 2                  # bf16 weights and KV by default
    source: str = ""

    # ---- derived sizes ------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def full_layers(self) -> int:
        return sum(t == FULL_ATTENTION for t in self.layer_types)

    @property
    def sliding_layers(self) -> int:
        return self.num_layers - self.full_layers

    def attention_params_per_layer(self) -> int:
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        params = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            params += q + 2 * kv
        if self.o_bias:
            params += h
        if self.qk_norm:
            params += 2 * self.head_dim
        if self.attention_sinks:
            params += self.num_heads
        return params

    def mlp_params_per_layer(self, active: bool = False) -> int:
        h = self.hidden_size
        if not self.is_moe:
            return 3 * h * self.intermediate_size
        n = self.experts_per_token if active else self.num_experts
        inter = self.moe_intermediate_size or self.intermediate_size
        expert = 3 * h * inter + ((2 * inter + h) if self.expert_bias else 0)
        router = h * self.num_experts + (self.num_experts if self.expert_bias else 0)
        return n * expert + router

    def embedding_params(self) -> int:
        """Input embedding plus the output head when it is not tied."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    def param_count(self, active: bool = False) -> int:
        """Total parameters (or parameters touched per token with ``active=True`` for MoE)."""
        per_layer = (self.attention_params_per_layer() + self.mlp_params_per_layer(active)
                     + 2 * self.hidden_size)  # two RMSNorm weights
        return self.num_layers * per_layer + self.hidden_size + self.embedding_params()

    def non_embedding_params(self) -> int:
        return self.param_count() - self.embedding_params()

    def weight_bytes_per_forward(self, tokens: int = 1) -> float:
        """Bytes of weights read by one forward pass over ``tokens`` tokens of a batch.

        Dense: every weight once (the input embedding is a gather of ``tokens`` rows, the
        output head is read whole). MoE: each expert is read when at least one token routes
        to it; with uniform routing the expected number of distinct experts touched by T tokens
        is ``E·(1 − (1 − a/E)^T)``.
        """
        d = self.dtype_bytes
        h = self.hidden_size
        input_embedding = min(tokens, self.vocab_size) * h
        lm_head = self.vocab_size * h
        per_layer = self.attention_params_per_layer() + 2 * h
        if self.is_moe:
            inter = self.moe_intermediate_size or self.intermediate_size
            expert = 3 * h * inter + ((2 * inter + h) if self.expert_bias else 0)
            e, a = self.num_experts, self.experts_per_token
            touched = e * (1.0 - (1.0 - a / e) ** tokens)
            per_layer += touched * expert + h * e
        else:
            per_layer += self.mlp_params_per_layer()
        return d * (self.num_layers * per_layer + h + input_embedding + lm_head)

    def matmul_flops_per_token(self) -> float:
        """2 FLOPs per active weight (the input embedding is a gather, not a matmul)."""
        return 2.0 * (self.param_count(active=True) - self.vocab_size * self.hidden_size
                      + (self.vocab_size * self.hidden_size if self.tie_embeddings else 0))

    def kv_bytes_per_token_layer(self) -> int:
        """K and V of one token in one layer: ``kv_heads · head_dim · 2 · dtype bytes``."""
        return self.num_kv_heads * self.head_dim * 2 * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token over all layers: ``layers · kv_heads · head_dim · 2 · bytes``."""
        return self.num_layers * self.kv_bytes_per_token_layer()

    def kv_tokens_attended(self, context: int, layer_type: str, q: int = 1) -> int:
        """Keys one pass of ``q`` rows per sequence reads in a layer of ``layer_type``."""
        if layer_type == SLIDING_ATTENTION:
            return int(self.window_keys(context, q))
        return context

    def window_keys(self, contexts, q: int = 1):
        """Keys a sliding-window layer's pass of ``q`` rows reads per sequence of ``contexts``
        keys (a number or an array): its rows see the last ``W + q − 1`` keys (the engine's
        windowed verify; a draft step, q = 1, its window W); all keys without a window."""
        if not self.sliding_window:
            return contexts
        return np.minimum(contexts, self.sliding_window + q - 1)

    def kv_bytes_resident(self, context: int) -> int:
        """KV cache bytes one sequence of ``context`` tokens holds (sliding layers keep a window)."""
        per = self.kv_bytes_per_token_layer()
        return sum(per * self.kv_tokens_attended(context, t) for t in self.layer_types)

    def memory_bytes(self, contexts, tp: int = 1) -> float:
        """Per-GPU memory a batch needs: weights plus every sequence's resident KV cache,
        split over ``tp`` GPUs (activations and workspace are not counted)."""
        kv = sum(self.kv_bytes_resident(int(c)) for c in contexts)
        return (self.param_count() * self.dtype_bytes + kv) / tp

    def spec_hash(self) -> str:
        import hashlib
        payload = json.dumps({k: v for k, v in self.__dict__.items() if k not in ("source",)},
                             sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


#: The largest value each model size may take (a size above it is a corrupt file).
MODEL_BOUNDS = {"hidden_size": 2**20, "num_attention_heads": 2**12, "num_key_value_heads": 2**12,
                "head_dim": 2**12, "num_hidden_layers": 2**12, "intermediate_size": 2**22,
                "vocab_size": 2**24, "num_experts": 2**14, "num_experts_per_tok": 2**14,
                "moe_intermediate_size": 2**22, "sliding_window": 2**31,
                "max_position_embeddings": 2**31}
_ALIASES = {"n_embd": "hidden_size", "n_head": "num_attention_heads",
            "n_layer": "num_hidden_layers", "num_local_experts": "num_experts",
            "experts_per_token": "num_experts_per_tok"}


def key_line(text: str | None, key: str, nth: int = 1) -> int | None:
    """The line of ``text`` (a JSON file) where ``"key":`` appears the ``nth`` time, if it
    does."""
    if not text:
        return None
    found = list(re.finditer(r'"' + re.escape(key) + r'"\s*:', text))
    if not found:
        return None
    m = found[min(nth, len(found)) - 1]
    return text.count("\n", 0, m.start()) + 1


#: HF's default ``max_window_layers`` by model type (Qwen2Config, Qwen3Config: 28;
#: Qwen3MoeConfig: 48), for a config that turns sliding windows on without giving it.
MAX_WINDOW_LAYERS_DEFAULT = {"qwen3_moe": 48}


def attention_layer_types(cfg: dict, layers: int):
    """Each layer's attention type as HF derives it: the config's ``layer_types`` as given
    (gpt-oss; checked by the caller), else Qwen2's rule — with ``use_sliding_window`` and a
    ``sliding_window``, layers ``i ≥ max_window_layers`` are ``sliding_attention`` and the
    first ``max_window_layers`` full; without, every layer is full. A sliding layer's row at
    position p attends keys ``p − sliding_window + 1 .. p``."""
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        return layer_types
    if not (cfg.get("use_sliding_window") and cfg.get("sliding_window")):
        return [FULL_ATTENTION] * layers
    first = cfg.get("max_window_layers")
    if first is None:
        first = MAX_WINDOW_LAYERS_DEFAULT.get(str(cfg.get("model_type")), 28)
    return [SLIDING_ATTENTION if i >= int(first) else FULL_ATTENTION for i in range(layers)]


def model_spec_from_config(config: dict, name: str = "custom", dtype_bytes: int = 2, *,
                           path: str | None = None, text: str | None = None) -> ModelSpec:
    """Build a :class:`ModelSpec` from a HuggingFace ``config.json`` dictionary; ``path`` and
    ``text`` (the file it was read from) let errors name the file and line."""
    if not isinstance(config, dict):
        raise SpecFileError(f"a model config must be a JSON object, got "
                            f"{type(config).__name__}", path=path or f"model '{name}'", line=1)
    cfg = dict(config)
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the decoder here
        cfg = {**cfg, **cfg["text_config"]}
    where = path or f"model '{name}'"

    def fail(key: str | None, message: str):
        raise SpecFileError(message, path=where, line=key_line(text, key) if key else None,
                            field=key)

    def size(key: str, value, minimum: int = 1) -> int:
        bound, given = MODEL_BOUNDS[_ALIASES.get(key, key)], value
        if isinstance(value, float) and math.isfinite(value) and value == int(value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            fail(key, f"expected a whole number, got {quote(given)}")
        if not minimum <= value <= bound:
            fail(key, f"expected {minimum}..{bound}, got {quote(given)}")
        return value

    def need(*keys, minimum: int = 1) -> int:
        for key in keys:
            if cfg.get(key) is not None:
                return size(key, cfg[key], minimum)
        fail(None, f"config.json lacks '{keys[0]}'")

    def optional(*keys, zero_is_absent: bool = False) -> int | None:
        for key in keys:
            value = cfg.get(key)
            if value is None or (zero_is_absent and value == 0 and not isinstance(value, bool)):
                continue
            return size(key, value)
        return None

    model_type = str(cfg.get("model_type", "llama"))
    hidden = need("hidden_size", "n_embd")
    heads = need("num_attention_heads", "n_head")
    kv_heads = optional("num_key_value_heads") or heads
    if heads % kv_heads:
        fail("num_key_value_heads", f"{heads} attention heads do not divide into {kv_heads} "
                                    f"KV heads")
    head_dim = optional("head_dim")
    if head_dim is None:
        if hidden < heads:
            fail("hidden_size", f"{hidden} is smaller than {heads} heads (no head_dim given)")
        head_dim = hidden // heads
    layers = need("num_hidden_layers", "n_layer")
    experts = optional("num_experts", "num_local_experts", zero_is_absent=True) or 0
    active = optional("num_experts_per_tok", "experts_per_token", zero_is_absent=True) or 0
    if experts and not 1 <= active <= experts:
        fail("num_experts_per_tok", f"{experts} experts need 1..{experts} experts per token, "
                                    f"got {active}")
    window = optional("sliding_window", zero_is_absent=True)
    layer_types = attention_layer_types(cfg, layers)
    if not isinstance(layer_types, list):
        fail("layer_types", f"expected a list, got {quote(layer_types)}")
    if len(layer_types) != layers:
        fail("layer_types", f"has {len(layer_types)} entries for {layers} layers")
    for t in layer_types:
        if t not in (FULL_ATTENTION, SLIDING_ATTENTION):
            fail("layer_types", f"unknown layer type {quote(t)}")
    is_gpt_oss = model_type == "gpt_oss"
    bias = bool(cfg.get("attention_bias", False))
    qkv_bias = bias or model_type == "qwen2"  # Qwen2 always has q/k/v bias, no o bias
    return ModelSpec(
        name=name, architecture=model_type, num_layers=layers, hidden_size=hidden,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=need("intermediate_size"), vocab_size=need("vocab_size"),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"), qkv_bias=qkv_bias, o_bias=bias,
        num_experts=experts, experts_per_token=active,
        moe_intermediate_size=optional("moe_intermediate_size", zero_is_absent=True) or 0,
        expert_bias=is_gpt_oss, attention_sinks=is_gpt_oss,
        layer_types=tuple(layer_types), sliding_window=window,
        max_context=optional("max_position_embeddings"), dtype_bytes=dtype_bytes,
        source=str(cfg.get("_specsim_source", "")),
    )


def known_models() -> list[str]:
    return sorted({p.parent.name for root in catalog_dirs() for p in root.glob("*/config.json")})


#: The Hugging Face repositories whose architecture each catalogue entry is (base and instruct
#: share it); each entry's config.json names its source in ``_specsim_source``.
HF_IDS = {
    "gpt-oss-20b": ("openai/gpt-oss-20b",),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct",
                     "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
    "llama-3.2-3b": ("meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct"),
    "qwen2.5-14b": ("Qwen/Qwen2.5-14B", "Qwen/Qwen2.5-14B-Instruct"),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Base"),
    "qwen3-4b": ("Qwen/Qwen3-4B", "Qwen/Qwen3-4B-Base"),
    "qwen3-8b": ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B-Base"),
    "smollm2-135m": ("HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M-Instruct"),
}


def catalogue_name(recorded: str | None) -> str | None:
    """The catalogue entry a recorded model name is: the entry's own name, one of its Hugging
    Face ids (:data:`HF_IDS`), or a path ending in such an id's name (a server's local
    ``--model-path /models/Llama-3.1-8B-Instruct``), all without regard to case; else None."""
    text = str(recorded or "").strip().rstrip("/").lower()
    if not text:
        return None
    if text in known_models():
        return text
    last = text.rsplit("/", 1)[-1]
    for name, ids in HF_IDS.items():
        for hf_id in ids:
            if text == hf_id.lower() or last == hf_id.lower().rsplit("/", 1)[-1]:
                return name
    return None


def model_for_trace(model: str | None, trace_header: dict, fallback: str = "qwen3-8b") -> str:
    """The model a command costs: the one given, else the model the trace was recorded on when
    the catalogue has it (:func:`catalogue_name`) or its Hugging Face config is in the local hub
    cache (the id itself, which :func:`load_model` reads), else ``fallback``."""
    return model_choice(model, trace_header, fallback)[0]


def model_choice(model: str | None, trace_header: dict, fallback: str = "qwen3-8b"
                 ) -> tuple[str, str]:
    """(:func:`model_for_trace`'s model, how it was chosen: ``given``, ``catalogue``,
    ``hf-id`` (a Hugging Face id of a catalogue entry), ``hf-cache`` or ``fallback``)."""
    if model:
        return model, "given"
    recorded = str(trace_header.get("model") or "").strip()
    name = catalogue_name(recorded)
    if name is not None:
        return name, "catalogue" if name == recorded.lower() else "hf-id"
    if recorded.count("/") == 1 and not recorded.startswith((".", "/", "~")) and \
            hf_cached_config(recorded) is not None:
        return recorded, "hf-cache"
    return fallback, "fallback"


def hf_cache_dirs() -> list[Path]:
    """Where a Hugging Face hub cache may lie, as the hub library looks: ``$HF_HUB_CACHE``,
    ``$HF_HOME/hub``, ``~/.cache/huggingface/hub`` (read when called)."""
    out = []
    if os.environ.get("HF_HUB_CACHE"):
        out.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        out.append(Path(os.environ["HF_HOME"]) / "hub")
    out.append(Path.home() / ".cache" / "huggingface" / "hub")
    return out


def hf_cached_config(repo_id: str) -> Path | None:
    """``config.json`` of the Hugging Face model ``org/name`` in the local hub cache (the
    snapshot ``refs/main`` names, else the newest), or None."""
    org, _, name = repo_id.partition("/")
    if not org or not name or "/" in name:
        return None
    for cache in hf_cache_dirs():
        repo = cache / f"models--{org}--{name}"
        snapshots = repo / "snapshots"
        if not snapshots.is_dir():
            continue
        main = repo / "refs" / "main"
        if main.is_file():
            config = snapshots / main.read_text().strip() / "config.json"
            if config.is_file():
                return config
        configs = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
        if configs:
            return configs[-1]
    return None


def load_model(name_or_path: str, dtype_bytes: int = 2) -> ModelSpec:
    """A catalogue name (``qwen3-8b``), a folder holding ``config.json``, a JSON file, or a
    Hugging Face id (``org/name``) whose config is in the local hub cache."""
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        if name_or_path.endswith(".json") or name_or_path.startswith((".", "/", "~")):
            raise SpecsimError(f"model config {name_or_path}: no such file")
        candidate = catalog_file(f"{name_or_path.lower()}/config.json")
        name = name_or_path.lower()
        if not candidate.is_file() and name_or_path.count("/") == 1 and \
                not name_or_path.startswith((".", "/")):
            candidate = hf_cached_config(name_or_path)
            if candidate is None:
                raise SpecsimError(
                    f"model '{name_or_path}': not a catalogue name, a file, or a Hugging Face "
                    f"id in the local hub cache (looked in "
                    f"{', '.join(str(d) for d in hf_cache_dirs())}); fetch its config with "
                    f"`huggingface-cli download {name_or_path} config.json` or give a path")
            name = name_or_path.split("/")[1].lower()
        if candidate is None or not candidate.is_file():
            raise UnknownNameError("model", name_or_path, known_models())
        path = candidate
    else:
        name = path.parent.name if path.name == "config.json" else path.stem
    config, text = read_json_file(path, "model config")
    return model_spec_from_config(config, name=name, dtype_bytes=dtype_bytes, path=str(path),
                                  text=text)


#: model configs and hardware specs larger than this are not what they claim to be
MAX_SPEC_BYTES = 16 * 2**20


def read_json_file(path: str | Path, what: str) -> tuple[object, str]:
    """The parsed content and the text of a small JSON file (a model config, a hardware
    spec), read strictly; any problem is one :class:`SpecFileError` with the file and line."""
    from specsim.traces.format import JSONRefusal, json_error_reason, loads_strict
    path = str(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecFileError(f"cannot read {what}: {exc.strerror}", path=path) from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecFileError(f"{what} is larger than {MAX_SPEC_BYTES} bytes", path=path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SpecFileError(f"{what} is not UTF-8 text (byte 0x"
                            f"{data[exc.start:exc.start + 1].hex()})", path=path,
                            line=line) from None
    try:
        return loads_strict(text, check_floats=True), text
    except json.JSONDecodeError as exc:
        raise SpecFileError(f"bad JSON in {what}: {exc.msg} (column {exc.colno})", path=path,
                            line=exc.lineno) from None
    except (ValueError, RecursionError) as exc:
        from specsim.traces.format import constant_key
        field = (exc.field if isinstance(exc, JSONRefusal) else None) or constant_key(text)
        nth = 2 if isinstance(exc, JSONRefusal) and exc.field else 1   # a duplicate's 2nd
        raise SpecFileError(json_error_reason(exc).replace("bad JSON", f"bad JSON in {what}"),
                            path=path, line=key_line(text, field, nth) if field else None,
                            field=field) from None


# --------------------------------------------------------------------------------------------
# Hardware spec
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Overheads:
    """Per-step costs that bytes and FLOPs do not explain (seconds)."""

    forward: float = 25e-6      # one forward pass (plain, draft or verify): launches, sync
    iteration: float = 30e-6    # one speculative iteration: accept/reject, rollback, bookkeeping
    selection: float = 10e-6    # one selection launch (top-k etc.)
    allreduce_latency: float = 8e-6  # one all-reduce under tensor parallelism


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    memory_bandwidth: float       # bytes/s, datasheet
    bf16_flops: float             # dense FLOP/s, datasheet
    memory_bytes: float
    interconnect_bandwidth: float  # bytes/s per GPU for all-reduce (NVLink or PCIe)
    measured_bandwidth: float | None = None
    measured_bf16_flops: float | None = None
    overheads: Overheads = field(default_factory=Overheads)
    source: str = ""
    key: str = ""                 # catalogue name (e.g. "h200"); selects shipped calibrations
    multiprocessors: int | None = None   # streaming multiprocessors (waves of programs)

    @property
    def bandwidth(self) -> float:
        """The ceiling the cost model uses: measured when known, datasheet otherwise."""
        return self.measured_bandwidth or self.memory_bandwidth

    @property
    def flops(self) -> float:
        return self.measured_bf16_flops or self.bf16_flops

    @property
    def ceilings_measured(self) -> bool:
        return self.measured_bandwidth is not None


#: Each hardware number's unit factor and the largest plausible value (in that unit).
HARDWARE_FIELDS = {"memory_bandwidth_TBps": (1e12, 1e3), "bf16_dense_TFLOPs": (1e12, 1e6),
                   "memory_GB": (1e9, 1e6), "interconnect_GBps": (1e9, 1e6),
                   "bf16_TFLOPs": (1e12, 1e6)}
#: the most streaming multiprocessors a hardware file may give
MAX_MULTIPROCESSORS = 4096
#: a per-step overhead above this many seconds is a unit mistake
MAX_OVERHEAD_S = 1.0
HARDWARE_BOUNDS = {key: bound for key, (_, bound) in HARDWARE_FIELDS.items()}


def hardware_from_dict(d: dict, name: str, *, path: str | None = None,
                       text: str | None = None) -> HardwareSpec:
    """A :class:`HardwareSpec` from a hardware JSON object (``models/hardware/*.json``);
    every number is range-checked, errors name ``path`` (and the line, given ``text``)."""
    where = path or f"hardware '{name}'"

    def fail(key: str | None, message: str):
        raise SpecFileError(message, path=where, line=(key_line(text, key) if key else 1) or 1,
                            field=key)

    def number(obj: dict, key: str, prefix: str = "", required: bool = True):
        value = obj.get(key)
        if value is None:
            if required:
                fail(prefix + key, "expected a value, got none (missing)")
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(prefix + key, f"expected a number, got {quote(value)}")
        unit, bound = HARDWARE_FIELDS[key]
        if not (0 < value <= bound and math.isfinite(value)):
            fail(prefix + key, f"expected a value in (0, {bound:g}], got {quote(value)}")
        return float(value) * unit

    if not isinstance(d, dict):
        fail(None, f"a hardware spec must be a JSON object, got {type(d).__name__}")
    measured = d.get("measured") or {}
    if not isinstance(measured, dict):
        fail("measured", f"expected an object, got {quote(measured)}")
    overheads = d.get("overheads_s") or {}
    if not isinstance(overheads, dict):
        fail("overheads_s", f"expected an object, got {quote(overheads)}")
    known = Overheads.__dataclass_fields__
    times = {}
    for key, value in overheads.items():
        if key not in known:
            fail(f"overheads_s.{key}", f"unknown overhead; known: {', '.join(known)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                0 <= value <= MAX_OVERHEAD_S and math.isfinite(value)):
            fail(f"overheads_s.{key}", f"expected a number of seconds in [0, {MAX_OVERHEAD_S:g}]"
                                       f", got {quote(value)}")
        times[key] = float(value)
    sms = d.get("multiprocessors")
    if sms is not None and (isinstance(sms, bool) or not isinstance(sms, int)
                            or not 1 <= sms <= MAX_MULTIPROCESSORS):
        fail("multiprocessors", f"expected an integer in 1..{MAX_MULTIPROCESSORS}, "
                                f"got {quote(sms)}")
    measured_bandwidth = (number(measured, "memory_bandwidth_TBps", "measured.", False)
                          if measured.get("memory_bandwidth_TBps") else None)
    measured_flops = (number(measured, "bf16_TFLOPs", "measured.", False)
                      if measured.get("bf16_TFLOPs") else None)
    return HardwareSpec(
        name=str(d.get("name", name)),
        memory_bandwidth=number(d, "memory_bandwidth_TBps"),
        bf16_flops=number(d, "bf16_dense_TFLOPs"),
        memory_bytes=number(d, "memory_GB"),
        interconnect_bandwidth=number(d, "interconnect_GBps"),
        measured_bandwidth=measured_bandwidth, measured_bf16_flops=measured_flops,
        overheads=Overheads(**times), source=str(d.get("_source", "")), key=name,
        multiprocessors=sms)


def known_hardware() -> list[str]:
    return sorted(Path(name).stem for name in catalog_names("hardware", "*.json"))


def load_hardware(name_or_path: str) -> HardwareSpec:
    path = Path(name_or_path)
    if not path.is_file():
        path = catalog_file(f"hardware/{name_or_path.lower()}.json")
        if not path.is_file():
            raise UnknownNameError("hardware", name_or_path, known_hardware())
    data, text = read_json_file(path, "hardware spec")
    return hardware_from_dict(data, path.stem, path=str(path), text=text)

