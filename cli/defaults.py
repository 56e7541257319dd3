"""The defaults the `specsim` commands share, each defined once here, with the help texts that
state them: the shipped trace read without ``--trace``, the model costed (the trace's own, else
a fallback), the hardware, the trace formats, the batch and the bootstrap size.
"""
from __future__ import annotations

from specsim import predict as _predict

#: What predict assumes for a trace group without a modelled policy or a sparsity, and for a
#: trace without context lengths; `specsim costs` prices these without a trace.
POLICY = _predict.DEFAULT_POLICY
SPARSITY = _predict.DEFAULT_SPARSITY
CONTEXT = _predict.DEFAULT_CONTEXT

#: The trace every trace-reading command uses without --trace (predict, dashboard, simulate,
#: tune, validate plan): SmolLM2-135M-Instruct, greedy, bf16, recorded on an H200 as one
#: continuous batch of 32 slots.
TRACE = "traces/smollm2-135m-greedy-bf16-h200-continuous.jsonl"
#: `specsim review`'s trace: the same model's 12 prompts in fp32 on a CPU, as its shipped
#: proxy check (REVIEW_PROXY) was measured.
REVIEW_TRACE = "traces/smollm2-135m-greedy.jsonl"
REVIEW_PROXY = "traces/review-proxy-smollm2-135m.json"
#: The shipped validation runs on the GPU (VALIDATION.md), by (model, hardware): each has
#: ``models/validation/RUN-plan.json``, ``-measured.json`` and ``-report.json``.
VALIDATION_RUNS = {("smollm2-135m", "h200"): "h200-smollm2-135m",
                   ("qwen3-8b", "h200"): "h200-qwen3-8b",
                   ("llama-3.2-3b", "h200"): "h200-llama-3.2-3b"}
#: The model costed when the trace names none the catalogue has, and the model of commands
#: without a trace (`specsim costs`).
FALLBACK_MODEL = "qwen3-8b"
HARDWARE = "h200"
FORMATS = ("auto", "specsim", "vllm-metrics", "vllm-requests", "specbench", "sglang-metrics",
           "sglang-requests", "sglang-server-info", "aiperf")
#: Sequences decoded together in predict, dashboard and review.
BATCH = 32
#: Bootstrap replicates of every confidence interval.
BOOTSTRAP = 1000
#: The largest draft length --k-max takes (the acceptance model extrapolates beyond the
#: trace's recorded k; self-speculation pays off at k of a few to a few dozen).
K_MAX = 256

TRACE_HELP = (f"Acceptance trace: specsim JSONL, vLLM or SGLang /metrics dump, vLLM per-request "
              f"JSONL, SGLang /generate responses (JSONL) or /server_info, AIPerf "
              f"profile_export.jsonl, or Spec-Bench JSONL. Default: the shipped {TRACE}.")
MODEL_HELP = ("Catalogue name (see `specsim models`), path to a Hugging Face config.json, or a "
              "Hugging Face id (org/name) whose config is in the local hub cache. "
              "Default: the model the trace was recorded on, when the catalogue has it "
              f"(smollm2-135m for the default trace), else {FALLBACK_MODEL}.")
HARDWARE_HELP = "Catalogue name (see `specsim hardware`) or path to a hardware JSON."
COSTS_HELP = ("Cost model: auto (the calibration shipped for this hardware and model, else this "
              "hardware's shipped operator table, else another GPU's table scaled to this one "
              "(flagged SCALED), else the roofline; each at tp 1), roofline, calibrated, "
              "operators (this GPU's table, else another's scaled), or a calibration file or "
              "operator table.")


def validation_file(run: str, kind: str) -> str:
    """The shipped name of a validation run's ``plan``, ``measured`` or ``report`` file."""
    return f"models/validation/{run}-{kind}.json"


def default_trace() -> str:
    """The shipped default trace as a path on disk (as named where this install lacks it, for
    the reader's own 'no such file' error)."""
    from specsim.shipped import shipped_file
    return shipped_file(TRACE) or TRACE


def model_for(model: str | None, trace_header: dict) -> tuple[str, str]:
    """(the model to cost, why): ``model`` as given, else the trace's model when the catalogue
    has it (by name or Hugging Face id) or the local Hugging Face cache holds its config, else
    :data:`FALLBACK_MODEL`, with a reason that says which."""
    from specsim.specs import model_choice
    name, how = model_choice(model, trace_header, FALLBACK_MODEL)
    recorded = str(trace_header.get("model") or "")
    return name, {
        "given": "--model",
        "catalogue": "the trace's model",
        "hf-id": f"the trace's model '{recorded}' is the catalogue's {name}",
        "hf-cache": f"the trace's model, its config from the local Hugging Face cache",
        "fallback": (f"default: the trace's model '{recorded}' is neither in the catalogue nor "
                     f"in the local Hugging Face cache" if recorded
                     else "default: the trace names no model"),
    }[how]
