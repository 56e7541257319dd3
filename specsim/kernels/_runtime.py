"""Triton set-up shared by the kernels: the interpreter on machines without a CUDA GPU.

Triton reads ``TRITON_INTERPRET`` when a kernel is *defined* (``@triton.jit``), so this module
must be imported before any kernel module; every kernel module imports it first. Without a CUDA
device Triton cannot compile, so kernels run in its interpreter (numpy, slow: tests only).
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (after the environment is set)
import triton.language as tl  # noqa: E402

#: True when kernels run in Triton's interpreter (no bf16 arithmetic there: use fp16/fp32).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

def _patch_interpreter_scalar_index() -> None:
    """Let ``range()`` take run-time scalars in Triton's interpreter under numpy >= 2.4.

    The interpreter keeps every scalar as a one-element array and converts it for ``range`` with
    ``int(array)``, which numpy 2.4 turned from a deprecation into a TypeError. We wrap its
    tensor patching so that ``__index__`` reads the single element instead. Interpreter only;
    compiled kernels are untouched.
    """
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_specsim_patched", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._specsim_patched = True
    interpreter._patch_lang_tensor = patched


if INTERPRETED:
    _patch_interpreter_scalar_index()

#: log2(e): kernels use exp2, so logits are multiplied by ``sm_scale * LOG2E`` once.
LOG2E = 1.4426950408889634


def default_device(device: torch.device | str | None = None) -> torch.device:
    """``device``, or the current CUDA device when there is one, else the CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def multiprocessor_count(device: torch.device | str | None) -> int:
    """Streaming multiprocessors of ``device`` (a small stand-in under the interpreter)."""
    device = default_device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def next_power_of_2(n: int) -> int:
    return triton.next_power_of_2(max(1, int(n)))


__all__ = ["INTERPRETED", "LOG2E", "default_device", "multiprocessor_count", "next_power_of_2",
           "tl", "triton"]
