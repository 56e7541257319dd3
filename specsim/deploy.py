"""What a user deploys for a predicted setting: `specsim predict --emit vllm|sglang|schedule`.

- ``vllm``: the ``speculative_config`` (``vllm serve --speculative-config``,
  ``LLM(speculative_config=...)``) and the engine arguments the prediction assumed, as one
  ``vllm serve`` command line. Stock vLLM has no sparse self-speculation; the sparse policies
  need the Vegas fork (platformxlab/vegas), whose ``method="sparse_attn"`` adds
  ``sparse_attn_algorithm``, ``sparse_attn_ratio`` and ``sparse_attn_min_tokens``.
- ``sglang``: stock SGLang has no sparse self-speculation either (its drafters are EAGLE/MTP
  heads, n-gram tables and separate draft models; ``--speculative-draft-window-size`` windows
  such a head, not the target model), so no SGLang command is printed: the emit names the
  speculative flags that would carry k and the engine flags that carry over, and says it is
  not deployable.
- ``schedule``: the k* of the chosen (policy, s) per (batch, context) on a grid, priced by the
  same cost model and trace as predict (:func:`specsim.predict.predict_group`), and vLLM's
  batch-only form of it, ``num_speculative_tokens_per_batch_size``.

Field and flag names are pinned to one release of each engine (:data:`VLLM_VERSION`,
:data:`SGLANG_VERSION`); the lists below were read from those releases' sources.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, replace

from specsim.errors import SpecsimError
from specsim.report import PredictReport, _Json

FORMATS = ("vllm", "sglang", "schedule")

# --------------------------------------------------------------------------------------------
# pinned engine versions and the names they accept
# --------------------------------------------------------------------------------------------

VLLM_VERSION = "0.34.0"
#: Fields of ``SpeculativeConfig`` in vLLM 0.34.0 (``vllm/config/speculative.py``, class
#: ``SpeculativeConfig``, as shipped in the PyPI wheel vllm-0.34.0-cp38-abi3-manylinux_2_28).
VLLM_SPECULATIVE_FIELDS = frozenset({
    "enforce_eager", "num_speculative_tokens", "model", "method", "custom_method",
    "draft_tensor_parallel_size", "draft_decode_context_parallel_size", "tensor_parallel_size",
    "quantization", "moe_backend", "attention_backend", "kv_cache_dtype", "max_model_len",
    "revision", "code_revision", "index_share_for_mtp_iteration", "disable_eagle_block_drop",
    "disable_lookahead_block_hashes", "draft_lm_head_quantization",
    "use_local_argmax_reduction", "prompt_lookup_max", "prompt_lookup_min",
    "parallel_drafting", "target_model_config", "target_parallel_config",
    "num_speculative_tokens_per_batch_size", "draft_model_config", "draft_parallel_config",
    "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
    "suffix_decoding_corpus_tokens", "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method",
    "synthetic_acceptance_rates", "synthetic_acceptance_length",
    "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk", "xpress_topc",
    "speculator_options", "fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k"})
#: ``vllm serve`` flags of vLLM 0.34.0 that the emitted command uses
#: (``vllm/engine/arg_utils.py``, ``EngineArgs.add_cli_args``).
VLLM_ENGINE_FLAGS = ("--speculative-config", "--tensor-parallel-size", "--max-num-seqs",
                     "--max-model-len")
#: The Vegas fork of vLLM (github.com/platformxlab/vegas: README "Key knobs" and
#: ``vllm/v1/spec_decode/sparse_attn/attn_overrider/__init__.py``): ``method="sparse_attn"``,
#: the fields it adds to ``SpeculativeConfig``, and the algorithms its dispatch accepts (any
#: other name is rejected there; a ratio of 1.0 bypasses the sparse path).
VEGAS_FORK_METHOD = "sparse_attn"
VEGAS_FORK_FIELDS = frozenset({"sparse_attn_algorithm", "sparse_attn_ratio",
                               "sparse_attn_min_tokens"})
VEGAS_FORK_ALGORITHMS = ("vegas", "streamingllm")
#: specsim's policy names as the fork spells its algorithms (lower case, underscores).
FORK_SPELLING = {"vegas": "vegas", "streamingllm": "streamingllm", "sparsespec": "sparsespec",
                 "quest": "quest", "last-token": "last_token", "vegas-all": "vegas_all",
                 "full": "streamingllm"}

#: specsim's drafter kinds → vLLM's ``method`` (stock vLLM serves these; EAGLE-3 heads, those
#: with a ``draft_vocab_size``, as ``eagle3``).
VLLM_METHODS = {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "medusa": "medusa",
                "draft-model": "draft_model", "ngram": "ngram"}
#: vLLM's n-gram window when the prediction does not set it (its own default lookup sizes).
NGRAM_LOOKUP = {"prompt_lookup_min": 1, "prompt_lookup_max": 4}

SGLANG_VERSION = "0.5.23"
#: ``ServerArgs`` flags of SGLang 0.5.23 that an emit may name: the speculative-decoding flags
#: (``sglang/srt/arg_groups/fields/spec.py``) and the engine flags (``fields/model.py``,
#: ``fields/parallel.py``, ``fields/schedule.py``); each flag is ``--`` + the field name with
#: dashes (``arg_groups/arg_utils.py``, ``_field_to_cli_name``), in the PyPI wheel
#: sglang-0.5.23-cp311-cp311-manylinux_2_34.
SGLANG_FLAGS = frozenset({
    "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-draft-model",
    "--speculative-draft-model-revision", "--speculative-num-steps", "--speculative-eagle-topk",
    "--speculative-num-draft-tokens", "--speculative-draft-window-size",
    "--speculative-draft-sink-size", "--speculative-adaptive", "--speculative-attention-mode",
    "--model-path", "--model", "--context-length", "--tp-size", "--tensor-parallel-size",
    "--max-running-requests"})
#: specsim's drafter kinds → SGLang's ``--speculative-algorithm`` (no Medusa there).
SGLANG_METHODS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN",
                  "draft-model": "STANDALONE", "ngram": "NGRAM"}
#: The algorithms SGLang 0.5.23 builds in (``--speculative-algorithm`` help text).
SGLANG_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK",
                     "UNO")

#: Tokens of output room added to the context for ``--max-model-len`` / ``--context-length``
#: when predict has no ``--output-tokens``.
OUTPUT_ROOM = 1024
#: The default schedule grid: batch sizes (rows) and context lengths (columns).
SCHEDULE_BATCHES = (1, 4, 16, 64)
SCHEDULE_CONTEXTS = (4096, 16384, 65536)


# --------------------------------------------------------------------------------------------
# the predicted setting
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting(_Json):
    """The best setting of a prediction and what the engine needs to serve it: the policy and
    s it was priced with, k, the batch (``max_num_seqs``), the largest context it was priced
    at, tp, and ``max_model_len`` = that context + the output room."""

    model: str
    model_id: str | None          # HuggingFace id, from the catalogue entry's source
    policy: str
    s: float | None               # None for a drafter other than sparse self-speculation
    k: int
    speedup: float
    batch: int
    context: int
    tp: int
    max_model_len: int
    #: a drafter other than sparse self-speculation: its kind (``eagle3`` for an EAGLE-3
    #: head), the head or draft model it names, and its verify tree's token count
    drafter: str | None = None
    draft_name: str | None = None
    tree_tokens: int | None = None


def hf_id(source: str) -> str | None:
    """The HuggingFace repository a catalogue config was taken from (its ``_specsim_source``
    names ``https://huggingface.co/OWNER/NAME/...``), or None."""
    match = re.search(r"huggingface\.co/([\w.-]+/[\w.-]+)", source or "")
    return match.group(1) if match else None


def setting_of(report: PredictReport, spec, tp: int, output_tokens: int | None) -> Setting:
    """The report's best group as a deployable setting (its priced policy and s)."""
    group = report.best_group()
    context = int(max(group.contexts))
    room = max(output_tokens if output_tokens is not None else OUTPUT_ROOM, group.k_star + 1)
    costed = group.costed_as
    kind = name = None
    if costed.drafter:
        kind, _, name = costed.drafter.partition(":")
        if kind == "eagle" and name and _is_eagle3(name):
            kind = "eagle3"
    return Setting(model=spec.name, model_id=hf_id(spec.source), policy=costed.policy,
                   s=None if costed.s is None else float(costed.s), k=group.k_star,
                   speedup=group.speedup_at_k_star, batch=report.batch, context=context, tp=tp,
                   max_model_len=context + room, drafter=kind, draft_name=name or None,
                   tree_tokens=costed.tree_tokens)


def _is_eagle3(name: str) -> bool:
    """Whether a head (shipped name or config path) is an EAGLE-3 head (it has a draft
    vocabulary of its own)."""
    from specsim.drafters import head_config

    try:
        return "draft_vocab_size" in head_config(name)[0]
    except SpecsimError:
        return "eagle3" in name.lower()


def _draft_arg(setting: Setting, notes: list[str]) -> str:
    """What the engine loads as the draft: the named draft model's HuggingFace id where the
    catalogue knows it, else a placeholder the user fills in (a head's weights are not in the
    catalogue)."""
    if setting.drafter == "draft-model" and setting.draft_name:
        from specsim.specs import load_model

        try:
            found = hf_id(load_model(setting.draft_name).source)
        except SpecsimError:
            found = None
        if found:
            return found
    what = setting.draft_name or f"{setting.drafter} head for {setting.model}"
    notes.append(f"replace <DRAFT:{what}> with the repository or path of its weights")
    return f"<DRAFT:{what}>"


def _model_arg(setting: Setting, notes: list[str]) -> str:
    if setting.model_id:
        return setting.model_id
    notes.append(f"the catalogue names no HuggingFace id for {setting.model}: replace "
                 f"<HF-ID-OF-{setting.model}> with the model's repository or path")
    return f"<HF-ID-OF-{setting.model}>"


def _length_notes(setting: Setting, spec, output_tokens: int | None) -> list[str]:
    room = setting.max_model_len - setting.context
    notes = [f"max model length = the largest context priced ({setting.context}) + "
             f"{room} tokens of output room"
             + ("" if output_tokens is not None else " (--output-tokens sets it)")]
    if spec.max_context and setting.max_model_len > spec.max_context:
        notes.append(f"{setting.max_model_len} tokens exceed {setting.model}'s "
                     f"max_position_embeddings ({spec.max_context}): the engine refuses it "
                     f"without a longer RoPE scaling")
    return notes


# --------------------------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VllmEmit(_Json):
    """The ``vllm serve`` command for a setting; ``needs_vegas_fork`` always for sparse
    self-speculation, ``fork_has_algorithm`` False where even the fork lacks the policy."""

    format: str
    vllm_version: str
    setting: Setting
    command: str
    speculative_config: dict
    engine_args: dict
    needs_vegas_fork: bool
    fork_has_algorithm: bool
    notes: list[str]


def vllm_speculative_config(setting: Setting) -> dict:
    """The fork's ``speculative_config`` for a sparse self-speculation setting: k drafts over
    ``s`` of the KV with specsim's floor on the selected entries."""
    from specsim.policies import get_policy

    policy = get_policy(setting.policy)
    return {"method": VEGAS_FORK_METHOD, "num_speculative_tokens": setting.k,
            "sparse_attn_algorithm": FORK_SPELLING[setting.policy],
            "sparse_attn_ratio": setting.s, "sparse_attn_min_tokens": policy.min_selected}


def vllm_drafter_config(setting: Setting, notes: list[str]) -> dict:
    """Stock vLLM's ``speculative_config`` for a setting's separate drafter; what it assumes
    goes into ``notes``."""
    config: dict = {"method": VLLM_METHODS[setting.drafter],
                    "num_speculative_tokens": setting.k}
    if setting.drafter in ("eagle", "eagle3", "medusa", "draft-model"):
        config["model"] = _draft_arg(setting, notes)
    if setting.drafter == "draft-model":
        config["draft_tensor_parallel_size"] = setting.tp
    if setting.drafter == "ngram":
        config.update(NGRAM_LOOKUP)
        notes.append("prompt_lookup_min/max are vLLM's usual n-gram window, not predicted")
    return config


def _emit_vllm_drafter(setting: Setting, spec, output_tokens: int | None) -> VllmEmit:
    """Stock vLLM's ``speculative_config`` for a separate drafter (EAGLE, EAGLE-3, MTP,
    Medusa, a draft model, n-gram lookup)."""
    notes: list[str] = []
    model = _model_arg(setting, notes)
    config = vllm_drafter_config(setting, notes)
    if setting.tree_tokens:
        notes.append(f"the prediction verifies a tree of {setting.tree_tokens} tokens; "
                     f"vLLM {VLLM_VERSION} drafts a chain of num_speculative_tokens")
    engine = {"--tensor-parallel-size": setting.tp, "--max-num-seqs": setting.batch,
              "--max-model-len": setting.max_model_len}
    notes += _length_notes(setting, spec, output_tokens)
    command = " ".join(["vllm", "serve", shlex.quote(model), "--speculative-config",
                        shlex.quote(json.dumps(config))]
                       + [f"{flag} {value}" for flag, value in engine.items()])
    return VllmEmit("vllm", VLLM_VERSION, setting, command, config, engine, False, True, notes)


def emit_vllm(setting: Setting, spec, output_tokens: int | None = None) -> VllmEmit:
    if setting.drafter:
        return _emit_vllm_drafter(setting, spec, output_tokens)
    notes: list[str] = []
    model = _model_arg(setting, notes)
    config = vllm_speculative_config(setting)
    engine = {"--tensor-parallel-size": setting.tp, "--max-num-seqs": setting.batch,
              "--max-model-len": setting.max_model_len}
    algorithm = config["sparse_attn_algorithm"]
    has_algorithm = algorithm in VEGAS_FORK_ALGORITHMS or setting.s >= 1.0
    notes.append(f"method '{VEGAS_FORK_METHOD}' and the sparse_attn_* fields need the Vegas "
                 f"fork of vLLM (github.com/platformxlab/vegas), not stock vLLM "
                 f"{VLLM_VERSION}, which has no sparse self-speculation")
    if not has_algorithm:
        notes.append(f"NOT deployable as printed: the Vegas fork implements "
                     f"{' and '.join(VEGAS_FORK_ALGORITHMS)} only; '{algorithm}' "
                     f"({setting.policy}) needs an implementation there")
    if setting.policy == "full":
        notes.append("policy 'full' drafts with the whole KV: the fork bypasses its sparse "
                     "path at sparse_attn_ratio 1.0")
    notes += _length_notes(setting, spec, output_tokens)
    command = " ".join(["vllm", "serve", shlex.quote(model), "--speculative-config",
                        shlex.quote(json.dumps(config))]
                       + [f"{flag} {value}" for flag, value in engine.items()])
    return VllmEmit("vllm", VLLM_VERSION, setting, command, config, engine, True,
                    has_algorithm, notes)


# --------------------------------------------------------------------------------------------
# SGLang
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SglangEmit(_Json):
    """SGLang for a setting: ``deployable`` False with ``command`` None for sparse
    self-speculation (stock SGLang has none); ``engine_flags`` carry over as they are,
    ``speculative_flags_needed`` are the values k would take in a chain drafter
    (``--speculative-eagle-topk 1``: ``num_draft_tokens = num_steps + 1``), with no
    ``--speculative-algorithm`` that drafts with the target model over a sparse KV."""

    format: str
    sglang_version: str
    setting: Setting
    deployable: bool
    command: str | None
    engine_flags: dict
    speculative_flags_needed: dict
    reason: str
    notes: list[str]


def emit_sglang(setting: Setting, spec, output_tokens: int | None = None) -> SglangEmit:
    notes: list[str] = []
    model = _model_arg(setting, notes)
    engine = {"--model-path": model, "--tp-size": setting.tp,
              "--max-running-requests": setting.batch,
              "--context-length": setting.max_model_len}
    if setting.drafter in SGLANG_METHODS:
        topk = 1 if not setting.tree_tokens else 4
        flags: dict = {"--speculative-algorithm": SGLANG_METHODS[setting.drafter]}
        if setting.drafter in ("eagle", "eagle3", "draft-model"):
            flags["--speculative-draft-model-path"] = _draft_arg(setting, notes)
        flags.update({"--speculative-num-steps": setting.k, "--speculative-eagle-topk": topk,
                      "--speculative-num-draft-tokens": setting.tree_tokens or setting.k + 1})
        if setting.tree_tokens:
            notes.append(f"a tree of {setting.tree_tokens} tokens: --speculative-eagle-topk "
                         f"{topk} is SGLang's usual branching, not predicted")
        notes += _length_notes(setting, spec, output_tokens)
        command = " ".join(["python", "-m", "sglang.launch_server"]
                           + [f"{flag} {shlex.quote(str(value))}"
                              for flag, value in {**engine, **flags}.items()])
        return SglangEmit("sglang", SGLANG_VERSION, setting, True, command, engine, flags,
                          "", notes)
    if setting.drafter:
        reason = (f"SGLang {SGLANG_VERSION} has no {setting.drafter} drafter (its "
                  f"--speculative-algorithm choices: {', '.join(SGLANG_ALGORITHMS)})")
        notes += _length_notes(setting, spec, output_tokens)
        return SglangEmit("sglang", SGLANG_VERSION, setting, False, None, engine, {}, reason,
                          notes)
    needed = {"--speculative-num-steps": setting.k, "--speculative-eagle-topk": 1,
              "--speculative-num-draft-tokens": setting.k + 1}
    reason = (f"stock SGLang has no sparse self-speculation "
              f"({setting.policy}, s={setting.s:g}, k={setting.k}): its "
              f"--speculative-algorithm choices ({', '.join(SGLANG_ALGORITHMS)}) draft with a "
              f"separate head, table or model, and --speculative-draft-window-size windows "
              f"that draft head, not the target model; nothing to deploy (use --emit vllm "
              f"for the Vegas fork)")
    notes += _length_notes(setting, spec, output_tokens)
    return SglangEmit("sglang", SGLANG_VERSION, setting, False, None, engine, needed, reason,
                      notes)


# --------------------------------------------------------------------------------------------
# the k schedule over (batch, context)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleCell(_Json):
    batch: int
    context: int
    k: int
    speedup: float


@dataclass(frozen=True)
class ScheduleEmit(_Json):
    """k* of one (policy, s) trace group per (batch, context) of the grid (``k_table``: rows
    ``batches``, columns ``contexts``), each exactly what ``predict --batch B --context C``
    gives that group; and vLLM's batch-only ``num_speculative_tokens_per_batch_size``
    (inclusive ``[first batch, last batch, k]`` ranges; the k of a grid batch holds up to the
    next one), its k* per batch at the prediction's own context (``per_batch_context``)."""

    format: str
    policy: str
    s: float | None
    costed_as: dict
    batches: list[int]
    contexts: list[int]
    k_table: list[list[int]]
    cells: list[ScheduleCell]
    per_batch_context: str
    vllm_version: str
    vllm_num_speculative_tokens: int
    vllm_num_speculative_tokens_per_batch_size: list[list[int]]
    vllm_speculative_config: dict
    notes: list[str]


def _group_k(trace, costs, opts, key, paired, cache) -> tuple[int, float, list[str]]:
    """k* and its speedup of trace group ``key`` under ``opts`` (as predict computes them)."""
    from specsim.predict import predict_group, workload_contexts

    notes: list[str] = []
    contexts, source = workload_contexts(trace, opts, notes)
    group = predict_group(trace.groups()[key], costs, opts, notes, contexts, source, paired,
                          cache)
    return group.k_star, group.speedup_at_k_star, notes


def emit_schedule(report: PredictReport, trace, costs, opts, setting: Setting,
                  batches=SCHEDULE_BATCHES, contexts=SCHEDULE_CONTEXTS) -> ScheduleEmit:
    """The k schedule of the report's best (policy, s) group over ``batches`` × ``contexts``,
    replaying the trace once (an acceptance cache shared by every cell); ``setting`` is the
    report's (:func:`setting_of`), for the fork's ``speculative_config``."""
    from specsim.predict import prompt_weights

    if setting.tree_tokens:
        raise SpecsimError(f"--emit schedule picks k per cell; the best setting verifies a "
                           f"tree of {setting.tree_tokens} tokens, which has no counterfactual "
                           f"at another k: use --emit vllm or sglang")
    batches, contexts = sorted({int(b) for b in batches}), sorted({int(c) for c in contexts})
    if not batches or not contexts or min(batches) < 1 or min(contexts) < 1:
        raise SpecsimError("a schedule needs batch sizes and context lengths of at least 1")
    best = report.best_group()
    key = (best.policy, best.s)
    paired = prompt_weights(trace, opts.n_boot, opts.seed)
    cache: dict = {}
    notes: list[str] = []
    cells, table = [], []
    for b in batches:
        row = []
        for c in contexts:
            k, speedup, cell_notes = _group_k(trace, costs, replace(opts, batch=b, context=c),
                                              key, paired, cache)
            notes += cell_notes
            cells.append(ScheduleCell(b, c, k, speedup))
            row.append(k)
        table.append(row)
    per_batch = [_group_k(trace, costs, replace(opts, batch=b), key, paired, cache)[0]
                 for b in batches]
    ranges = [[b, (batches[i + 1] - 1) if i + 1 < len(batches) else b, k]
              for i, (b, k) in enumerate(zip(batches, per_batch))]
    if ranges[0][0] != 1:      # vLLM needs the first range to start at batch 1
        ranges[0][0] = 1
    at = (f"--context {opts.context}" if opts.context is not None
          else "the trace's recorded context lengths (as predict without --context)")
    notes.append(f"vLLM {VLLM_VERSION} caps each scheduled k at num_speculative_tokens and "
                 f"carries the last range's k to larger batches; its schedule has no context "
                 f"axis, so it is taken at {at}")
    k_max = int(max(per_batch))
    if setting.drafter:     # stock vLLM's own drafter config, with the schedule
        base = vllm_drafter_config(replace(setting, k=k_max), notes)
        notes.append(f"drafter {setting.drafter}: k per cell from its per-depth survival "
                     f"(valid where the i-th draft does not depend on k)")
    else:
        base = vllm_speculative_config(replace(setting, k=k_max))
    config = {**base, "num_speculative_tokens_per_batch_size": ranges}
    return ScheduleEmit("schedule", best.policy, best.s, best.costed_as.to_json(), batches,
                        contexts, table, cells, at, VLLM_VERSION, k_max, ranges, config,
                        list(dict.fromkeys(notes)))


def grid(text: str, name: str) -> list[int]:
    """``"1,4,16"`` (``K`` suffix = ×1024) as whole numbers ≥ 1; a one-line error otherwise."""
    out = []
    for item in (x for x in text.replace(" ", "").split(",") if x):
        scale = 1024 if item[-1:] in ("k", "K") else 1
        try:
            value = int(item[:-1] if scale > 1 else item) * scale
        except ValueError:
            raise SpecsimError(f"{name}: expected whole numbers separated by commas, "
                               f"got '{text}'") from None
        if value < 1:
            raise SpecsimError(f"{name}: values must be at least 1, got '{text}'")
        out.append(value)
    if not out:
        raise SpecsimError(f"{name}: give at least one value")
    return out

