"""A compact decoder for the Llama, Qwen2, Qwen3 and gpt-oss families, built from a
HuggingFace config.

    h = embed(tokens)
    per layer:  h += o_proj(attend(rope(q_norm(q)), rope(k_norm(k)), v))   (q, k, v of rmsnorm(h))
                h += down(silu(gate(x)) * up(x)),  x = rmsnorm(h)
    logits = lm_head(rmsnorm(h))

Module and parameter names are HuggingFace's (``model.layers.3.self_attn.q_proj.weight``), so a
safetensors checkpoint loads without renaming. The model knows nothing about caches or sparsity:
``forward`` computes q/k/v of the new tokens at the given positions and hands them to an
``attend(layer, q, k, v)`` callable (``specsim.engine.attention``) that writes the KV cache and
attends — full causal attention for prefill and verify, sparse attention for drafts.
Family differences are flags: Qwen2's q/k/v bias (gpt-oss: q/k/v and o biases), Qwen3's
per-head q/k RMSNorm, tied embeddings, gpt-oss's attention sinks. RoPE is the rotate-half form
HF uses, with ``llama3``, ``linear`` and ``yarn`` scaling.

Per-layer attention: ``ModelArgs.layer_windows`` gives each layer's sliding window W (None:
full attention), derived as HF does (``specsim.specs.attention_layer_types``: gpt-oss's
``layer_types``, Qwen2's ``use_sliding_window`` / ``max_window_layers``); a window layer's row
at position p attends keys ``p − W + 1 .. p``. gpt-oss's sinks (``self_attn.sinks`` [H], one
logit per query head) join every row's softmax as one more logit whose value is zero: they
enlarge the denominator only. Windows and sinks are applied by the ``attend`` callables
(``specsim.engine.attention``), which read them from ``ModelArgs.window`` and
:meth:`Transformer.attention_sinks`.

Qwen3-MoE layers replace the MLP by routed experts (:class:`MoE`): a router, the top
``num_experts_per_tok`` experts per token by softmax probability (renormalised with
``norm_topk_prob``), and each expert's SwiGLU run as one grouped GEMM over the token-expert pairs
sorted by expert (``torch._grouped_mm``: static shapes, so a step stays capturable in a CUDA
graph; each routed expert's weights are read once, no pair is padded). gpt-oss's experts run
through the same machinery with its differences: a router with a bias (``mlp.router``) whose
top logits are softmaxed, expert biases, gate and up columns interleaved in ``gate_up_proj``
(HF's layout, so checkpoints load as they are) and the clamped SwiGLU
``(clamp(up, ±limit) + 1) · g·σ(1.702·g)``, ``g = min(gate, limit)``. Experts are bf16 (or
the model's dtype): checkpoints with MXFP4 expert blocks are refused, and costs measured with
this engine are costs of bf16 experts.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from specsim.errors import SpecsimError
from specsim.specs import SLIDING_ATTENTION, model_spec_from_config

SUPPORTED = ("llama", "qwen2", "qwen3", "qwen3_moe", "gpt_oss")

#: gpt-oss's SwiGLU: glu = g·σ(SWIGLU_ALPHA·g) (HF's constant)
SWIGLU_ALPHA = 1.702

#: attend(layer, q [B, T, H, D], k [B, T, G, D], v [B, T, G, D]) -> out [B, T, H, D]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ModelArgs:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position: int = 8192
    tie_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    attention_sinks: bool = False         # gpt-oss: one learned logit per query head and layer
    layer_windows: tuple[int | None, ...] = ()   # per layer: sliding window W, None = full
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    num_experts: int = 0                  # 0: dense MLPs
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    dense_layers: tuple[int, ...] = ()    # MoE models: layers that keep a dense MLP
    expert_bias: bool = False             # gpt-oss: router and expert biases
    swiglu_limit: float | None = None     # gpt-oss: clamped SwiGLU, interleaved gate/up

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window (None: full attention)."""
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def full_layers(self) -> tuple[int, ...]:
        """The full-attention layers (the ones that draft from a selection's lists)."""
        return tuple(i for i in range(self.num_layers) if self.window(i) is None)

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.dense_layers

    @classmethod
    def from_config(cls, config: dict) -> "ModelArgs":
        """Read a HuggingFace ``config.json`` dict (transformers 4 or 5 spelling)."""
        cfg = {**config, **config.get("text_config", {})}
        model_type = str(cfg.get("model_type", "llama"))
        if model_type not in SUPPORTED:
            raise SpecsimError(f"the engine runs {', '.join(SUPPORTED)} models, not "
                               f"'{model_type}'")
        if cfg.get("hidden_act", "silu") != "silu":
            raise SpecsimError(f"unsupported activation {cfg.get('hidden_act')!r} (silu only)")
        rope = dict(cfg.get("rope_parameters") or {})          # transformers 5
        scaling = cfg.get("rope_scaling") or None              # transformers 4
        if scaling is None and rope.get("rope_type", "default") != "default":
            scaling = rope
        if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "default":
            scaling = None
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        heads = int(cfg["num_attention_heads"])
        spec = _spec(cfg)
        eos = cfg.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
        return cls(
            model_type=model_type, vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]), num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
            rope_scaling=dict(scaling) if scaling else None,
            max_position=int(cfg.get("max_position_embeddings", 8192)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=spec.qkv_bias, o_bias=spec.o_bias, qk_norm=spec.qk_norm,
            attention_sinks=spec.attention_sinks,
            layer_windows=tuple(spec.sliding_window if t == SLIDING_ATTENTION else None
                                for t in spec.layer_types),
            initializer_range=float(cfg.get("initializer_range", 0.02)),
            bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos, **_moe_args(cfg))


def _spec(cfg: dict):
    """The cost models' reading of the config (``specsim.specs``): per-layer attention types,
    biases, sinks. A config cut to fewer layers than its ``layer_types`` lists keeps the
    first ``num_hidden_layers`` of them (models reduced for tests and timing)."""
    layers = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) > layers:
        cfg = {**cfg, "layer_types": types[:layers]}
    return model_spec_from_config(cfg)


def _moe_args(cfg: dict) -> dict:
    """Qwen3-MoE's and gpt-oss's routing fields (empty for a dense model)."""
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    if not experts:
        return {}
    layers = int(cfg["num_hidden_layers"])
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense = {int(i) for i in cfg.get("mlp_only_layers") or []}
    dense |= {i for i in range(layers) if (i + 1) % step}
    top = int(cfg.get("num_experts_per_tok") or cfg["experts_per_token"])
    if not 1 <= top <= experts:
        raise SpecsimError(f"num_experts_per_tok {top} must lie in 1..num_experts ({experts})")
    gpt_oss = cfg.get("model_type") == "gpt_oss"
    return dict(num_experts=experts, experts_per_token=top,
                moe_intermediate_size=int(cfg.get("moe_intermediate_size")
                                          or cfg["intermediate_size"]),
                # gpt-oss softmaxes its top logits: the top probabilities renormalised
                norm_topk_prob=gpt_oss or bool(cfg.get("norm_topk_prob", False)),
                dense_layers=tuple(sorted(dense)), expert_bias=gpt_oss,
                swiglu_limit=float(cfg.get("swiglu_limit", 7.0)) if gpt_oss else None)


# --------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------


def rope_frequencies(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies θ^(−2i/D), i < D/2, after the config's scaling (fp64)."""
    d = args.head_dim
    inv_freq = 1.0 / args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    scaling = args.rope_scaling
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling["factor"])
    if kind == "linear":  # positions / factor
        return inv_freq / factor
    if kind == "llama3":
        # Wavelengths above original/low_freq_factor are stretched by `factor`, below
        # original/high_freq_factor kept, and interpolated smoothly in between.
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        original = float(scaling["original_max_position_embeddings"])
        wavelength = 2 * math.pi / inv_freq
        smooth = ((original / wavelength - low) / (high - low)).clamp(0.0, 1.0)
        return (1 - smooth) * inv_freq / factor + smooth * inv_freq
    if kind == "yarn":
        return _yarn_frequencies(inv_freq, scaling, args)
    raise SpecsimError(f"RoPE scaling type {kind!r} is not supported (default, linear, llama3, "
                       f"yarn)")


def _yarn_frequencies(inv_freq: torch.Tensor, scaling: dict, args: ModelArgs) -> torch.Tensor:
    """YaRN (Peng et al. 2023): frequency i keeps θ_i (extrapolation) where a wavelength makes
    more than ``beta_fast`` turns over the original context, becomes θ_i / factor
    (interpolation) where fewer than ``beta_slow``, and ramps linearly in between. Turning
    ``r`` times over original context ``L`` is dimension index
    ``d(r) = D·ln(L / (2π r)) / (2 ln base)``; the ramp runs over i from ``d(beta_fast)`` to
    ``d(beta_slow)`` (floored / ceiled unless ``truncate`` is false, as HF does), clipped to
    0..D−1."""
    d, base = args.head_dim, args.rope_theta
    factor = float(scaling["factor"])
    original = float(scaling.get("original_max_position_embeddings") or args.max_position)
    fast, slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def index(turns: float) -> float:
        return d * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = index(fast), index(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp)


def rope_attention_factor(args: ModelArgs) -> float:
    """What cos and sin are multiplied by: YaRN's ``attention_factor`` (default
    ``0.1·ln(factor) + 1``, or ``mscale`` / ``mscale_all_dim``'s ratio), 1 otherwise."""
    scaling = args.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(factor, float(scaling["mscale"])) / mscale(factor,
                                                                float(scaling["mscale_all_dim"]))
    return mscale(factor)


def rope_table(args: ModelArgs, length: int, device) -> torch.Tensor:
    """cos and sin of every position < ``length`` (times the scaling's attention factor):
    fp32 [length, 2, D/2]."""
    angle = torch.outer(torch.arange(length, dtype=torch.float64), rope_frequencies(args))
    table = torch.stack([angle.cos(), angle.sin()], dim=1) * rope_attention_factor(args)
    return table.float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE: x [B, T, heads, D]; cos/sin [B, T, 1, D/2]."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


# --------------------------------------------------------------------------------------------
# Modules (HF names)
# --------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x / sqrt(mean(x²) + ε) · w, in fp32 like HF
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        h, d = args.hidden_size, args.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, d
        self.q_proj = nn.Linear(h, args.num_heads * d, bias=args.qkv_bias)
        self.k_proj = nn.Linear(h, args.num_kv_heads * d, bias=args.qkv_bias)
        self.v_proj = nn.Linear(h, args.num_kv_heads * d, bias=args.qkv_bias)
        self.o_proj = nn.Linear(args.num_heads * d, h, bias=args.o_bias)
        if args.attention_sinks:
            self.sinks = nn.Parameter(torch.empty(args.num_heads))
        if args.qk_norm:
            self.q_norm = RMSNorm(d, args.rms_norm_eps)
            self.k_norm = RMSNorm(d, args.rms_norm_eps)
        self.qk_norm = args.qk_norm

    def fuse(self) -> None:
        """One q|k|v matmul instead of three (same numbers: rows of one weight)."""
        fused = nn.Linear(self.q_proj.in_features, self.q_proj.out_features
                          + 2 * self.k_proj.out_features, bias=self.q_proj.bias is not None,
                          device=self.q_proj.weight.device, dtype=self.q_proj.weight.dtype)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([self.q_proj.weight, self.k_proj.weight,
                                          self.v_proj.weight]))
            if fused.bias is not None:
                fused.bias.copy_(torch.cat([self.q_proj.bias, self.k_proj.bias,
                                            self.v_proj.bias]))
        self.qkv_proj = fused
        del self.q_proj, self.k_proj, self.v_proj

    def project(self, x, cos, sin):
        """Input → rotated q, k and v [B, T, heads, D] (everything before attention)."""
        b, t, _ = x.shape
        if hasattr(self, "qkv_proj"):
            sizes = (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                     self.num_kv_heads * self.head_dim)
            q, k, v = self.qkv_proj(x).split(sizes, dim=-1)
            q = q.view(b, t, self.num_heads, self.head_dim)
            k = k.view(b, t, self.num_kv_heads, self.head_dim)
            v = v.view(b, t, self.num_kv_heads, self.head_dim)
        else:
            q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)
            k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
            v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, layer: int, attend: Attend) -> torch.Tensor:
        q, k, v = self.project(x, cos, sin)
        return self.o_proj(attend(layer, q, k, v).flatten(2))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        h, i = args.hidden_size, args.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def fuse(self) -> None:
        """One gate|up matmul instead of two."""
        fused = nn.Linear(self.gate_proj.in_features, 2 * self.gate_proj.out_features,
                          bias=False, device=self.gate_proj.weight.device,
                          dtype=self.gate_proj.weight.dtype)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([self.gate_proj.weight, self.up_proj.weight]))
        self.gate_up_proj = fused
        del self.gate_proj, self.up_proj

    def forward(self, x):
        if hasattr(self, "gate_up_proj"):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)  # SwiGLU
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU


class Experts(nn.Module):
    """Every expert's SwiGLU weights stacked: ``gate_up_proj`` [E, H, 2I] and ``down_proj``
    [E, I, H], laid out as the grouped GEMM reads them (x @ w); with ``bias`` (gpt-oss)
    ``gate_up_proj_bias`` [E, 2I] and ``down_proj_bias`` [E, H]. ``swiglu_limit`` None: the
    gate's columns then the up's, SwiGLU ``silu(gate)·up``; a limit (gpt-oss): gate and up
    columns interleaved (gate 2j, up 2j + 1, HF's layout) and the clamped SwiGLU."""

    def __init__(self, experts: int, hidden: int, inter: int, bias: bool = False,
                 swiglu_limit: float | None = None):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(experts, hidden, 2 * inter))
        self.down_proj = nn.Parameter(torch.empty(experts, inter, hidden))
        if bias:
            self.gate_up_proj_bias = nn.Parameter(torch.empty(experts, 2 * inter))
            self.down_proj_bias = nn.Parameter(torch.empty(experts, hidden))
        self.bias = bias
        self.limit = swiglu_limit

    def activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The SwiGLU of gate|up rows [N, 2I]: [N, I]."""
        if self.limit is None:
            gate, up = gate_up.chunk(2, dim=-1)
            return F.silu(gate) * up
        gate = gate_up[:, 0::2].clamp(max=self.limit)
        up = gate_up[:, 1::2].clamp(-self.limit, self.limit)
        return (up + 1) * (gate * torch.sigmoid(SWIGLU_ALPHA * gate))


def grouped_mm(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Rows ``x`` [N, K] sorted by group, group g's rows ``ends[g-1]:ends[g]`` times ``w[g]``
    [K, M]: [N, M]. ``torch._grouped_mm`` where the device and dtype have it (bf16 on a recent
    GPU); else, on a GPU, every group's product kept on its own rows (no host read, so a CUDA
    graph captures it: the cost of G full products, for fp32 test models); on the CPU a loop
    over the groups' rows."""
    if x.is_cuda:
        try:
            return torch._grouped_mm(x, w, offs=ends)
        except (RuntimeError, NotImplementedError, AttributeError):
            pass
        group = torch.searchsorted(ends, torch.arange(x.shape[0], device=x.device,
                                                      dtype=ends.dtype), right=True)
        out = x.new_zeros(x.shape[0], w.shape[-1])
        for g in range(w.shape[0]):
            out = torch.where((group == g)[:, None], x @ w[g], out)
        return out
    out = x.new_empty(x.shape[0], w.shape[-1])
    start = 0
    for g, end in enumerate(ends.tolist()):
        out[start:end] = x[start:end] @ w[g]
        start = end
    return out


class MoE(nn.Module):
    """Routed experts: the router (Qwen3-MoE's ``gate`` [E, H]; gpt-oss's ``router`` with a
    bias) sends each token to its top ``experts_per_token`` experts; their SwiGLU outputs are
    summed with the routing weights."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.top = args.experts_per_token
        self.norm_topk = args.norm_topk_prob
        router = nn.Linear(args.hidden_size, args.num_experts, bias=args.expert_bias)
        if args.expert_bias:
            self.router = router
        else:
            self.gate = router
        self.experts = Experts(args.num_experts, args.hidden_size, args.moe_intermediate_size,
                               args.expert_bias, args.swiglu_limit)

    def route(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing weights and experts [T, top] of the tokens x2 [T, H] (fp32)."""
        router = self.router if hasattr(self, "router") else self.gate
        return route(router(x2).float(), self.top, self.norm_topk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        pairs = dispatch(x2, *self.route(x2), self.experts.gate_up_proj.shape[0])
        bank = self.experts
        gate_up = grouped_mm(pairs.rows, bank.gate_up_proj, pairs.ends)
        if bank.bias:       # each pair's expert's biases
            gate_up = gate_up + bank.gate_up_proj_bias[pairs.expert]
        out = grouped_mm(bank.activation(gate_up), bank.down_proj, pairs.ends)
        if bank.bias:
            out = out + bank.down_proj_bias[pairs.expert]
        return combine(out, pairs).reshape(shape)


def route(logits: torch.Tensor, top: int, norm_topk: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing weights and experts [T, top] from the router's fp32 logits [T, E]: the top
    logits' softmax probabilities over all experts, or with ``norm_topk`` over the top ones
    (= the softmax of the top logits, gpt-oss's routing)."""
    best, experts = torch.topk(logits, top, dim=-1)
    if norm_topk:
        return torch.softmax(best, dim=-1), experts
    return torch.exp(best - torch.logsumexp(logits, dim=-1, keepdim=True)), experts


@dataclass
class Pairs:
    """The token-expert pairs of one MoE layer, sorted by expert: ``rows`` [P, H] (each
    pair's token), ``expert`` and ``weight`` [P], ``order`` (pair p is the token-major pair
    ``order[p]``), the experts' ``ends`` (cumulative pair counts, int32 [E]) and ``top``, the
    experts per token."""

    rows: torch.Tensor
    expert: torch.Tensor
    weight: torch.Tensor
    order: torch.Tensor
    ends: torch.Tensor
    top: int


def dispatch(x2: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor,
             num_experts: int) -> Pairs:
    """Sort the token-expert pairs of tokens x2 [T, H] routed to ``experts`` [T, top] by expert
    (static shapes throughout: a CUDA graph captures it)."""
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=x2.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    top = experts.shape[-1]
    return Pairs(x2[order // top], flat[order], weights.flatten()[order], order,
                 torch.cumsum(counts, 0, dtype=torch.int32), top)


def combine(out: torch.Tensor, pairs: Pairs) -> torch.Tensor:
    """Each token's expert outputs ``out`` [P, H] (in ``pairs``' order) summed with their
    routing weights: [T, H]. The pairs go back to token-major order by a permutation and are
    summed over each token's ``top`` in a fixed order, so the result does not depend on the
    order of atomic additions (a scatter-add's does, run to run and eager against graphed)."""
    weighted = out * pairs.weight[:, None].to(out.dtype)
    token_major = torch.empty_like(weighted)
    token_major[pairs.order] = weighted
    return token_major.view(-1, pairs.top, out.shape[-1]).sum(1)


#: Compiled variants a compiled layer half may keep (``Transformer.compile_layers``).
RECOMPILE_LIMIT = 64


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int = 0):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MoE(args) if args.is_moe_layer(layer) else MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def before_attention(self, h, cos, sin):
        return self.self_attn.project(self.input_layernorm(h), cos, sin)

    def after_attention(self, h, attended):
        h = h + self.self_attn.o_proj(attended.flatten(2))
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward(self, h, cos, sin, layer, attend):
        q, k, v = self.before_attention(h, cos, sin)
        return self.after_attention(h, attend(layer, q, k, v))


class Backbone(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class Transformer(nn.Module):
    """Decoder-only LM; ``forward(tokens, positions, attend)`` returns fp32 logits."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Backbone(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope: torch.Tensor | None = None
        self.compiled = False

    @property
    def fused(self) -> bool:
        """Whether the projections are fused (:meth:`fuse_projections`)."""
        return hasattr(self.model.layers[0].self_attn, "qkv_proj") if self.model.layers \
            else False

    def fuse_projections(self) -> None:
        """Concatenate q/k/v and gate/up weights (after loading: HF names stay loadable):
        fewer, larger matmuls per layer, which at decode batch sizes are launch-bound. A
        second call changes nothing."""
        if self.fused:
            return
        for layer in self.model.layers:
            layer.self_attn.fuse()
            if isinstance(layer.mlp, MLP):       # experts are stacked already
                layer.mlp.fuse()

    def compile_layers(self) -> None:
        """Fuse the small element-wise kernels around each layer's matmuls (RMSNorm, RoPE,
        q/k-norm, SwiGLU, residuals) with ``torch.compile``; attention stays the engine's own
        call between the two compiled halves. Shapes are dynamic: one compilation serves every
        batch and query length. A second call changes nothing."""
        if self.compiled:
            return
        # size-1 dimensions still specialise (batch 1, one query token), and prefill, verify
        # and draft shapes differ: a process that runs many engines (a calibration, a
        # validation, a benchmark) meets more variants than dynamo's default limit of 8, past
        # which the layers fell back to eager, unfused, for the rest of the process
        import torch._dynamo

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                                   RECOMPILE_LIMIT)
        for layer in self.model.layers:
            layer.before_attention = torch.compile(layer.before_attention, dynamic=True)
            layer.after_attention = torch.compile(layer.after_attention, dynamic=True)
        self.compiled = True

    def prepare(self, settings) -> None:
        """Run as ``settings`` (an ``EngineSettings``) say: on a CUDA device, projections
        fused and layers compiled where they ask for it (off CUDA the model runs as built).
        A model already prepared further than ``settings`` ask is refused: fusing and
        compiling cannot be undone."""
        if self.lm_head.weight.device.type != "cuda":
            return
        for name, wanted, done in (("fuse_projections", settings.fuse_projections, self.fused),
                                   ("compile_layers", settings.compile_layers, self.compiled)):
            if done and not wanted:
                raise SpecsimError(f"engine setting {name}=false, but the model was already "
                                   f"prepared that way; build a new model for it")
        if settings.fuse_projections:
            self.fuse_projections()
        if settings.compile_layers:
            self.compile_layers()

    def attention_sinks(self) -> list[torch.Tensor | None]:
        """Each layer's sinks as fp32 [H] (what the attention kernels take), or None per layer
        for a model without sinks."""
        return [layer.self_attn.sinks.float() if hasattr(layer.self_attn, "sinks") else None
                for layer in self.model.layers]

    def setup_rope(self, length: int) -> None:
        """Precompute cos/sin for positions < ``length`` on the model's device."""
        self.rope = rope_table(self.args, length, self.lm_head.weight.device)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend,
                last_only: bool = False) -> torch.Tensor:
        """tokens, positions: int [B, T]. Logits fp32 [B, T, V] (or [B, 1, V] with last_only)."""
        if self.rope is None or self.rope.shape[0] < self.args.max_position:
            self.setup_rope(self.args.max_position)
        cos_sin = self.rope[positions.long()]                       # [B, T, 2, D/2]
        cos, sin = cos_sin[:, :, None, 0], cos_sin[:, :, None, 1]
        h = self.model.embed_tokens(tokens)
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, i, attend)
        if last_only:
            h = h[:, -1:]
        return self.lm_head(self.model.norm(h)).float()


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


def read_config(path: str | Path) -> dict:
    """``config.json`` from a folder or a file path."""
    path = Path(path)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise SpecsimError(f"no model config at {path}")
    return json.loads(path.read_text())


def random_weights(model: Transformer, seed: int = 0, std: float | None = None) -> None:
    """Seeded N(0, std²) for matrices, embeddings and biases (std = the config's
    initializer_range, as HF initialises matrices), unit norms; drawn in fp32 on the model's
    device, parameter by parameter in name order (same seed, same weights)."""
    std = model.args.initializer_range if std is None else std
    device = model.lm_head.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                noise = torch.empty(p.shape, dtype=torch.float32, device=device)
                p.copy_(noise.normal_(0.0, std, generator=generator))


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise SpecsimError(f"no *.safetensors weights in {folder}")
    return files


def load_weights(model: Transformer, folder: str | Path) -> None:
    """Load HF-named safetensors from ``folder``; every parameter must be found."""
    from safetensors.torch import load_file

    params = dict(model.named_parameters())
    missing = set(params)
    device = model.lm_head.weight.device
    experts_seen: dict[str, int] = {}
    with torch.no_grad():
        for path in safetensors_files(Path(folder)):
            for name, tensor in load_file(str(path), device="cpu").items():
                if name.endswith(("_blocks", "_scales")):
                    raise SpecsimError(f"{path.name}: {name} is an MXFP4-quantised expert "
                                       f"weight; the engine runs bf16 experts only "
                                       f"(dequantise the checkpoint to bf16 first)")
                stacked = _expert_slice(model, params, name, tensor)
                if stacked is not None:
                    stacked.copy_(tensor.to(device).T)
                    key = name.split(".experts.")[0] + ".experts"
                    experts_seen[key] = experts_seen.get(key, 0) + 1
                    continue
                if name not in params:
                    if name == "lm_head.weight" and model.args.tie_embeddings:
                        continue
                    if name.endswith("rotary_emb.inv_freq"):
                        continue
                    raise SpecsimError(f"{path.name}: unexpected tensor {name}")
                if tuple(tensor.shape) != tuple(params[name].shape):
                    raise SpecsimError(f"{path.name}: {name} has shape {tuple(tensor.shape)}, "
                                       f"the config says {tuple(params[name].shape)}")
                params[name].copy_(tensor.to(device))
                missing.discard(name)
    if model.args.tie_embeddings:
        missing.discard("lm_head.weight")
    for key, seen in experts_seen.items():      # every expert's gate, up and down
        if seen == 3 * model.args.num_experts:
            missing -= {f"{key}.gate_up_proj", f"{key}.down_proj"}
    if missing:
        raise SpecsimError(f"weights in {folder} lack {len(missing)} tensors, e.g. "
                           f"{sorted(missing)[0]}")


def _expert_slice(model: Transformer, params: dict, name: str, tensor: torch.Tensor
                  ) -> torch.Tensor | None:
    """Where a checkpoint's per-expert weight (``…mlp.experts.E.gate_proj.weight`` [I, H],
    ``up_proj``, ``down_proj`` [H, I]) goes in the stacked experts (transposed), or None for
    any other tensor."""
    head, sep, tail = name.partition(".experts.")
    parts = tail.split(".")
    if not sep or len(parts) != 3 or not parts[0].isdigit() or parts[2] != "weight":
        return None
    e, proj = int(parts[0]), parts[1]
    gate_up, down = params.get(f"{head}.experts.gate_up_proj"), params.get(
        f"{head}.experts.down_proj")
    if gate_up is None or e >= gate_up.shape[0] or proj not in ("gate_proj", "up_proj",
                                                               "down_proj"):
        raise SpecsimError(f"unexpected tensor {name}")
    inter = gate_up.shape[-1] // 2
    target = (gate_up[e, :, :inter] if proj == "gate_proj" else
              gate_up[e, :, inter:] if proj == "up_proj" else down[e])
    if tuple(tensor.T.shape) != tuple(target.shape):
        raise SpecsimError(f"{name} has shape {tuple(tensor.shape)}, the config says "
                           f"{tuple(target.T.shape)}")
    return target


def build_model(config: dict | str | Path, *, weights: str | Path = "random", seed: int = 0,
                dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                std: float | None = None) -> Transformer:
    """A ready-to-run model: ``weights`` is ``"random"`` or a folder of safetensors.

    ``config`` is a config dict, a ``config.json`` path or a folder holding one (for real
    weights the folder is the default weight location too).
    """
    if not isinstance(config, dict):
        folder = Path(config)
        config = read_config(folder)
        if weights == "real":
            weights = folder if folder.is_dir() else folder.parent
    if str(weights) == "real":
        raise SpecsimError("weights='real' needs a model folder, not a config dict")
    args = ModelArgs.from_config(config)
    with torch.device("meta"):
        model = Transformer(args)
    model = model.to(dtype).to_empty(device=device)  # allocated once, in the final dtype
    if args.tie_embeddings:  # keep one tensor for both, whatever to_empty did
        model.lm_head.weight = model.model.embed_tokens.weight
    if str(weights) == "random":
        random_weights(model, seed, std)
    else:
        load_weights(model, weights)
    model = model.eval().requires_grad_(False)
    model.setup_rope(args.max_position)
    return model


__all__ = ["Attend", "ModelArgs", "MoE", "SUPPORTED", "Transformer", "apply_rope", "build_model",
           "load_weights", "random_weights", "read_config", "rope_frequencies", "rope_table"]


#: A model small enough to run a GPU script's loop on the CPU (its smoke test).
TINY_SHAPES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def timing_model(name: str) -> Transformer:
    """Random weights of catalogue model ``name``'s shapes as timed runs use them: on a GPU in
    bf16 (an engine then prepares it as its settings say: fused projections, compiled layers);
    on a CPU a tiny model of the same family in fp32 (for smoke-testing timing scripts)."""
    from specsim.shipped import catalog_file

    config = json.loads(catalog_file(f"{name}/config.json").read_text())
    if not torch.cuda.is_available():
        return build_model({**config, **TINY_SHAPES}, weights="random")
    return build_model(config, weights="random", dtype=torch.bfloat16, device="cuda")
