"""GPU kernels for sparse-attention self-speculative decoding (Triton; bf16 on the GPU).

- ``verify_attention``: q = k+1 causal query tokens per sequence over its whole KV cache,
  GQA-packed, split-KV, with optional Collect-2-Query logits.
- ``sparse_attention``: one draft token over a selected list of cache positions.
- ``selection``: Vegas, last-token, SparseSpec-L, StreamingLLM and Quest position lists.
- ``kv_cache``: the contiguous preallocated KV layout with O(1) append and rollback.

Each kernel module keeps its plain torch reference beside it (``*_reference``). Planning
(``plan_verify``, ``plan_sparse``: split sizes, block sizes, workspace) is separate from running,
so the per-step path does no Python-side sizing and no host synchronisation. Without a CUDA GPU
the kernels run in Triton's interpreter (tests only; see ``_runtime``).
"""
from specsim.kernels import _runtime  # noqa: F401  (selects the interpreter first)
from specsim.kernels.kv_cache import KVCache, page_bounds_reference
from specsim.kernels.selection import (append_positions, attention_mass,
                                       attention_mass_reference, picked_row_sum,
                                       picked_row_sum_reference, quest_select, selected_counts,
                                       sparsespec_select, streamingllm_select, vegas_select)
from specsim.kernels.sparse_attention import (SparsePlan, plan_sparse, sparse_attention,
                                              sparse_attention_reference)
from specsim.kernels.verify_attention import (VerifyPlan, default_collect_rows,
                                              new_logits_buffer, plan_verify, verify_attention,
                                              verify_attention_reference)

__all__ = ["KVCache", "SparsePlan", "VerifyPlan", "append_positions", "attention_mass",
           "attention_mass_reference", "default_collect_rows", "new_logits_buffer",
           "page_bounds_reference", "picked_row_sum",
           "picked_row_sum_reference", "plan_sparse", "plan_verify", "quest_select",
           "selected_counts", "sparse_attention", "sparse_attention_reference",
           "sparsespec_select", "streamingllm_select", "vegas_select", "verify_attention",
           "verify_attention_reference"]
