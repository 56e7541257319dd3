"""The Hugging Face peer of the engine's plain decoding (``bench_engine.py --peer hf``): the
same model in transformers with a ``StaticCache``, one greedy decode step (forward and argmax)
compiled in torch.compile's default mode and captured whole in a CUDA graph of our own, the
gpt-fast recipe. transformers' own ``mode="reduce-overhead"`` stops with a ``StaticCache``
("accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run"), so
the graph is captured here instead. The cache holds random K/V up to the context (as the
engine's plain benchmark does: no prefill), and each replay appends one position.
"""
from __future__ import annotations

import torch


def hf_model(config: dict, device, dtype, state_dict: dict | None = None):
    """(the transformers model of ``config`` on ``device``, its config): random weights
    initialised there, or ``state_dict`` (the engine's HF-named parameters) loaded."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.for_model(**config)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    if state_dict is not None:
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        if missing or unexpected:
            raise ValueError(f"weights do not match the transformers model: missing "
                             f"{missing[:3]}, unexpected {unexpected[:3]}")
    return model.eval(), hf_config


class StaticDecoder:
    """Greedy decoding of ``batch`` sequences through a ``StaticCache`` of ``max_len``
    positions; ``graph``: the compiled step replayed from a CUDA graph (CUDA only)."""

    def __init__(self, model, hf_config, batch: int, max_len: int, *, graph: bool):
        from transformers import StaticCache

        device = next(model.parameters()).device
        self.model, self.graph = model, None
        self.cache = StaticCache(config=hf_config, max_cache_len=max_len)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.cache_position = torch.zeros(1, dtype=torch.long, device=device)
        with torch.no_grad():                    # lays out the cache's tensors
            self._forward()
        self._set_length(0)
        self.step_fn = self._step
        if graph:
            self.step_fn = torch.compile(self._step)
            self._capture()

    def _set_length(self, n: int) -> None:
        """Where the next write lands: transformers ≥ 5.2x's static layers count their own
        length (``cumulative_length``, in place: the graph keeps its address); earlier ones
        take ``cache_position``, which the steps pass as well."""
        for layer in self.cache.layers:
            length = getattr(layer, "cumulative_length", None)
            if torch.is_tensor(length):
                length.fill_(n)

    def _forward(self):
        return self.model(input_ids=self.ids, position_ids=self.position,
                          cache_position=self.cache_position, past_key_values=self.cache,
                          use_cache=True).logits

    def _step(self):
        self.ids.copy_(self._forward()[:, -1:].argmax(-1))
        return self.ids

    def _capture(self):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(3):                   # compile and warm up off the graph
                self.step_fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.step_fn()

    def prefill(self, prompts: torch.Tensor) -> torch.Tensor:
        """Prefill prompts [batch, T] of one length for real: their first greedy token."""
        length = prompts.shape[1]
        positions = torch.arange(length, device=prompts.device)
        self._set_length(0)
        with torch.no_grad():
            logits = self.model(input_ids=prompts, position_ids=positions[None].expand_as(
                prompts), cache_position=positions, past_key_values=self.cache,
                use_cache=True).logits
        self.ids.copy_(logits[:, -1:].argmax(-1))
        self.position.fill_(length)
        self.cache_position.fill_(length)
        return self.ids

    def fill(self, context: int, first_token: int = 0) -> None:
        """Random K/V in positions ``0..context-1`` of every layer; the next step writes
        position ``context``."""
        with torch.no_grad():
            for layer in self.cache.layers:
                layer.keys[:, :, :context].normal_()
                layer.values[:, :, :context].normal_()
        self._set_length(context)
        self.position.fill_(context)
        self.cache_position.fill_(context)
        self.ids.fill_(first_token)

    def step(self) -> torch.Tensor:
        """One greedy token per sequence; the positions advance by one."""
        if self.graph is not None:
            self.graph.replay()
        else:
            with torch.no_grad():
                self.step_fn()
        self.position += 1
        self.cache_position += 1
        return self.ids


def time_steps(decoder: StaticDecoder, steps: int) -> float:
    """Seconds per decode step over ``steps`` steps (CUDA events on a GPU)."""
    device = decoder.ids.device
    if device.type != "cuda":
        import time
        start = time.perf_counter()
        for _ in range(steps):
            decoder.step()
        return (time.perf_counter() - start) / steps
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        decoder.step()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / 1e3 / steps
