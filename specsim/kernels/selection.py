"""KV selection for sparse drafting: which cache positions each draft step attends to.

Every policy returns position lists in the layouts ``sparse_attention`` reads: int32
``indices`` [batch, capacity] with ``counts`` [batch] (one list per sequence), or
[batch, kv_heads, capacity] with ``counts`` [batch, kv_heads] (one list per KV head). Lists are
duplicate-free, sorted ascending (cheaper DRAM access in the kernel), and padded with 0 past the
count. How many positions a policy keeps is ``specsim.policies`` ' rule (``Policy.selected``),
evaluated per sequence on the device by ``selected_counts``; ``capacity`` is that rule at the
largest context, so the shapes depend only on ``max_context``, not on the current lengths.

- **Vegas** (``vegas_select``): score_n = mean over heads h and collected rows r of the scaled
  pre-softmax logits ``logits[b, h, r, n]`` written by the verify kernel (Collect-2-Query: first
  draft token and last token); keep the top ``max(ceil(s·L), 256)`` positions outside the recent
  window, plus the ``recent`` newest positions. One list per sequence, shared by KV heads.
- **SparseSpec-L** (``sparsespec_select``): per KV head g, score_n = Σ_{h∈g} Σ_{w<W}
  softmax_n(logits[b, h, w, ·]) — the attention weight the last W = 16 verify queries put on
  position n; keep the ``sink`` first positions, the ``recent`` newest, and the top of the rest,
  ``Policy.selected`` positions in all.
- **StreamingLLM** (``streamingllm_select``): the ``sink`` first positions and the newest ones.
- **Quest** (``quest_select``): pages of ``page_size`` positions; for query head h with query q,
  page score Σ_i max(q_i·min_i, q_i·max_i) over the page's key bounds (an upper bound of q·k on
  the page); a KV head's page score is the max over its query heads; the page holding the newest
  position is always kept; the top pages become their positions.

Selections are made after rollback, on the current ``lengths``. Logits written by the verify pass
past a row's causal position (the newest ≤ q − 1 positions) are raw logits; those positions lie
in every policy's recent window (keep ``recent ≥ q − 1``).
"""
from __future__ import annotations

import math

import torch

from specsim.kernels._runtime import tl, triton
from specsim.kernels.topk_select import (check_histogram, chunked_path, first_byte_histogram,
                                         key_bits, radix_top_positions)
from specsim.policies import Policy, get_policy, resolve_ranking


#: The rankings a list can be built with: "topk" (torch.topk, then ordered by ``_finish``),
#: "radix" (``topk_select.radix_top_positions``: Triton kernels that select and order;
#: Quest: its fused page selection), or "best": each policy's fastest on the H200
#: (``specsim.policies.BEST_RANKING``: radix for every ranked policy), topk off CUDA, where
#: Triton only interprets. The same sets up to ties. The engine ranks as
#: ``EngineSettings.ranking`` says.
RANKINGS = ("best", "topk", "radix")


def ranking_for(policy: str, ranking: str = "best",
                device: torch.device | str | None = None) -> str:
    """The ranking ``policy``'s lists are built with under ``ranking`` (:data:`RANKINGS`):
    "best" resolved per policy (``BEST_RANKING`` in ``specsim.policies``) on a CUDA ``device``
    (or none named), torch's topk elsewhere (the radix kernel would run in Triton's
    interpreter); a ranking named outright is kept."""
    if ranking not in RANKINGS:
        raise ValueError(f"ranking must be one of {', '.join(RANKINGS)}, got {ranking!r}")
    if ranking == "best" and device is not None and torch.device(device).type != "cuda":
        return "topk"
    return resolve_ranking(policy, ranking)


def _ranked_lists(score, lengths, counts, capacity, keep_first, keep_last, ranking,
                  chunked=None, first_histogram=None, nonnegative=False):
    """Ascending top lists [..., capacity] and counts: torch ranking + ``_finish``, or the
    radix kernel (``ranking``: resolved by :func:`ranking_for`; ``chunked``: its path,
    ``radix_top_positions``' choice when None; ``first_histogram``: its first pass, made
    by the kernel that wrote ``score``; ``nonnegative``: no score is below +0)."""
    if ranking == "radix":
        return radix_top_positions(score, lengths, counts, capacity, keep_first, keep_last,
                                   chunked=chunked, first_histogram=first_histogram,
                                   nonnegative=nonnegative)
    chosen = _top_positions(score, lengths, keep_first, keep_last, capacity)
    return _finish(chosen, counts, ranked=True)


def selected_counts(policy: Policy, lengths: torch.Tensor, s: float) -> torch.Tensor:
    """``policy.selected(L_b, s)`` for every sequence, on the device (int64 [batch])."""
    context = lengths.long()
    if policy.name == "full":
        return context
    budget = torch.ceil(context.double() * s).long()
    if policy.min_selected:
        budget = budget.clamp(min=policy.min_selected)
    if not policy.budget_includes_recent:
        budget = budget + policy.recent
    budget = budget.clamp(min=policy.sink + (policy.recent if policy.budget_includes_recent
                                             else 0))
    if policy.page_size > 1:
        budget = (budget + policy.page_size - 1) // policy.page_size * policy.page_size
    return torch.minimum(context, budget).clamp(min=0)


def _finish(chosen: torch.Tensor, counts: torch.Tensor, *, ranked: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each list's first ``counts`` entries ascending, the rest padded with 0 (int32).

    ``ranked``: the lists are best first (``torch.topk``'s order) and are sorted here: the
    entries past each count become the largest integer, so one sort of the
    capacity-long rows puts the kept positions first in order (cheaper than numbering them
    through a mask over the whole row: BENCHMARKS.md). Otherwise the lists must already be
    ascending.
    """
    capacity = chosen.shape[-1]
    valid = torch.arange(capacity, device=chosen.device) < counts[..., None]
    if ranked:
        last = torch.iinfo(chosen.dtype).max
        chosen = torch.where(valid, chosen, last).sort(dim=-1).values
    return torch.where(valid, chosen, 0).to(torch.int32), counts.to(torch.int32)


def _top_positions(score: torch.Tensor, lengths: torch.Tensor, keep_first: int,
                   keep_last: int, capacity: int) -> torch.Tensor:
    """Top-``capacity`` positions of ``score`` [..., n] by torch.topk, best first, after
    forcing the first ``keep_first`` and last ``keep_last`` valid positions in and positions
    ≥ length out."""
    n = score.shape[-1]
    position = torch.arange(n, device=score.device)
    length = lengths.long().view(-1, *([1] * (score.dim() - 1)))
    forced = (position < keep_first) | (position >= length - keep_last)
    score = torch.where(forced, float("inf"), score)
    score = torch.where(position < length, score, float("-inf"))  # also clears NaN past length
    return torch.topk(score, min(capacity, n), dim=-1, sorted=True).indices


def vegas_select(logits: torch.Tensor, lengths: torch.Tensor, s: float, *,
                 max_context: int | None = None, policy: Policy | None = None,
                 ranking: str = "best", chunked: bool | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Vegas: one list per sequence from the collected logits [batch, heads, rows, ≥ max len]
    (or their sum, [batch, 1, 1, ≥ max len] fp32: ranked as it is). ``chunked``: the radix
    ranking's path (``topk_select.radix_top_positions``), its own choice when None."""
    policy = policy or get_policy("vegas")
    max_context = max_context or logits.shape[-1]
    if logits.shape[1:3] == (1, 1) and logits.dtype == torch.float32:
        score = logits[:, 0, 0, :max_context]                                   # [batch, n]
    else:
        score = logits[..., :max_context].sum(dim=(1, 2), dtype=torch.float32)
    counts = selected_counts(policy, lengths, s)
    capacity = policy.selected(max_context, s)
    return _ranked_lists(score, lengths, counts, capacity, 0, policy.recent,
                         ranking_for(policy.name, ranking, score.device), chunked)


@triton.jit
def _picked_row_sum_kernel(Logits, Pick, Lengths, Out, stride_gb, stride_gh, stride_gr,
                           stride_ob, max_context, HEADS: tl.constexpr,
                           HEAD_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    length = tl.load(Lengths + b)
    position = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = position < max_context
    pos_ok = (position < length) & in_row
    base = Logits + b * stride_gb + tl.load(Pick + b).to(tl.int64) * stride_gr
    total = tl.zeros([BLOCK], tl.float32)
    if tl.program_id(1) * BLOCK < length:     # blocks past the length read nothing
        for h0 in range(0, HEADS, HEAD_BLOCK):
            head = h0 + tl.arange(0, HEAD_BLOCK)
            s = tl.load(base + head[:, None] * stride_gh + position[None, :],
                        mask=(head < HEADS)[:, None] & pos_ok[None, :], other=0.0)
            total += tl.sum(s.to(tl.float32), 0)
    tl.store(Out + b * stride_ob + position, total, mask=in_row)


def picked_row_sum(logits: torch.Tensor, pick: torch.Tensor, lengths: torch.Tensor,
                   max_context: int | None = None) -> torch.Tensor:
    """One collected row per list summed over every head, in one pass: ``logits`` [N, heads,
    rows, ≥ max len] (last dim contiguous), ``pick`` [N] the row of each list; returns fp32
    [N, 1, 1, max_context] (what ``vegas_select`` ranks as it is), 0 past each length.

    What the last-token policy ranks by: the row of each sequence's last accepted token. Reads
    the picked row of every head once and writes 4 bytes a position, where gathering the rows
    and summing them read and wrote the heads' rows twice more."""
    count, heads, rows, n = logits.shape
    max_context = max_context or n
    assert logits.stride(-1) == 1
    out = torch.empty(count, 1, 1, max_context, dtype=torch.float32, device=logits.device)
    block = 1024
    _picked_row_sum_kernel[(count, triton.cdiv(max_context, block))](
        logits, pick.clamp(0, rows - 1).to(torch.int32), lengths, out, *logits.stride()[:3],
        out.stride(0), max_context, HEADS=heads,
        HEAD_BLOCK=min(8, triton.next_power_of_2(heads)), BLOCK=block, num_warps=4)
    return out


def picked_row_sum_reference(logits: torch.Tensor, pick: torch.Tensor, lengths: torch.Tensor,
                             max_context: int | None = None) -> torch.Tensor:
    """torch version of ``picked_row_sum`` (also its CPU path)."""
    count, heads, rows, n = logits.shape
    max_context = max_context or n
    index = pick.long().clamp(0, rows - 1).view(count, 1, 1, 1).expand(count, heads, 1,
                                                                        max_context)
    total = torch.gather(logits[..., :max_context], 2, index).sum(1, keepdim=True,
                                                                  dtype=torch.float32)
    valid = torch.arange(max_context, device=logits.device) < lengths.long().view(-1, 1, 1, 1)
    return torch.where(valid, total, 0.0)


@triton.jit
def _attention_mass_kernel(Logits, Lse, Lengths, Mass, Hist,
                           stride_gb, stride_gh, stride_gw,
                           stride_lb, stride_lh, stride_lw,
                           stride_mb, stride_mh, max_context, keep_first, keep_last,
                           NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                           WINDOW: tl.constexpr, ROW_BLOCK: tl.constexpr,
                           BLOCK: tl.constexpr, HIST: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // NUM_KV_HEADS).to(tl.int64)
    kvh = (pid % NUM_KV_HEADS).to(tl.int64)
    length = tl.load(Lengths + b)
    position = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    pos_ok = (position < length) & (position < max_context)
    mass = tl.zeros([BLOCK], tl.float32)
    for r0 in range(0, GROUP * WINDOW, ROW_BLOCK):
        rows = r0 + tl.arange(0, ROW_BLOCK)
        row_ok = rows < GROUP * WINDOW
        head = kvh * GROUP + rows // WINDOW
        w = rows % WINDOW
        lse = tl.load(Lse + b * stride_lb + head * stride_lh + w * stride_lw, mask=row_ok,
                      other=float("inf"))
        s = tl.load(Logits + b * stride_gb + (head * stride_gh + w * stride_gw)[:, None]
                    + position[None, :], mask=row_ok[:, None] & pos_ok[None, :],
                    other=float("-inf")).to(tl.float32)
        mass += tl.sum(tl.exp2((s - lse[:, None]) * 1.4426950408889634), 0)
    tl.store(Mass + b * stride_mb + kvh * stride_mh + position, mass, mask=pos_ok)
    if HIST:    # the ranking's first radix pass over the keys of these positions
        key = key_bits(mass, position, tl.minimum(length, max_context), keep_first, keep_last,
                       True)
        hist = first_byte_histogram(key, pos_ok)
        tl.atomic_add(Hist + pid.to(tl.int64) * 256 + tl.arange(0, 256), hist, mask=hist > 0,
                      sem="relaxed")


def attention_mass(logits: torch.Tensor, lse: torch.Tensor, lengths: torch.Tensor,
                   num_kv_heads: int, max_context: int | None = None, *, block: int = 1024,
                   num_warps: int = 4, histogram: torch.Tensor | None = None,
                   keep_first: int = 0, keep_last: int = 0) -> torch.Tensor:
    """Σ over each KV head's query heads and the W rows of ``exp(logits − lse)``: fp32
    [batch, kv_heads, max_context]; positions past a sequence's length are left unset.
    ``histogram``: zeroed int32 [batch · kv_heads, 256], which receives each row's first
    radix pass (``radix_top_positions``' ``first_histogram`` for ``nonnegative=True``, the
    first ``keep_first`` and last ``keep_last`` positions kept).
    ``block`` positions a program (every layer's logits at once, 3 rows, batch 4, H100:
    Qwen3-8B at 128K 1.51 ms for 1,024 with 4 warps against 2.39 for 512, 1.65 for 2,048).
    Logit rows 4 at a time (H200, same shape, 12 rows per KV head: 1.13 ms against 1.22 for
    16 at a time, 2026-12-05)."""
    batch, heads, window, _ = logits.shape
    max_context = max_context or logits.shape[-1]
    assert logits.stride(-1) == 1
    mass = torch.empty(batch, num_kv_heads, max_context, dtype=torch.float32,
                       device=logits.device)
    group = heads // num_kv_heads
    if histogram is not None:
        check_histogram(histogram, batch * num_kv_heads, "histogram")
    _attention_mass_kernel[(batch * num_kv_heads, triton.cdiv(max_context, block))](
        logits, lse, lengths, mass, histogram if histogram is not None else mass,
        *logits.stride()[:3], *lse.stride(), *mass.stride()[:2], max_context, keep_first,
        keep_last, NUM_KV_HEADS=num_kv_heads, GROUP=group, WINDOW=window,
        ROW_BLOCK=min(4, triton.next_power_of_2(group * window)), BLOCK=block,
        HIST=histogram is not None, num_warps=num_warps)
    return mass


def attention_mass_reference(logits: torch.Tensor, lengths: torch.Tensor, num_kv_heads: int,
                             lse: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 torch version of ``attention_mass``; computes the lse itself when not given."""
    batch, heads, window, n = logits.shape
    position = torch.arange(n, device=logits.device)
    valid = position[None, :] < lengths.long()[:, None]                        # [batch, n]
    s = logits.float().masked_fill(~valid[:, None, None, :], float("-inf"))
    if lse is None:
        lse = torch.logsumexp(s, dim=-1)
    weight = torch.exp(s - lse[..., None].float())
    return weight.view(batch, num_kv_heads, heads // num_kv_heads * window, n).sum(2)


def sparsespec_select(logits: torch.Tensor, lengths: torch.Tensor, s: float, num_kv_heads: int,
                      *, lse: torch.Tensor | None = None, max_context: int | None = None,
                      policy: Policy | None = None, ranking: str = "best",
                      chunked: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseSpec-L: one list per KV head from the logits of the last W verify queries,
    ``logits`` [batch, heads, W, ≥ max len] (verify with all rows collected) and their natural
    log-sum-exps ``lse`` [batch, heads, W] (verify's ``lse`` output; computed here if None)."""
    policy = policy or get_policy("sparsespec")
    max_context = max_context or logits.shape[-1]
    if lse is None:
        position = torch.arange(max_context, device=logits.device)
        valid = position[None, :] < lengths.long()[:, None]
        lse = torch.logsumexp(logits[..., :max_context].float().masked_fill(
            ~valid[:, None, None, :], float("-inf")), dim=-1)
    ranking = ranking_for(policy.name, ranking, logits.device)
    rows = logits.shape[0] * num_kv_heads
    # one program per row takes its first radix pass from the mass pass, not from a read of
    # the row: mass pass and ranking 0.85 of the time at 128K, 0.86 at 32K, 0.87 at 8K, 0.95
    # at 2K (Qwen3-8B's 1,152 rows, batch 4, s = 0.03; one H100, CUDA-graph medians,
    # 2026-12-07; the same lists); by the exponent-first keys of mass (``nonnegative``,
    # ``topk_select``'s module doc) 0.79 of that again at 128K and 32K, 0.86 at 8K
    histogram = None
    if ranking == "radix" and not chunked_path(rows, max_context, chunked):
        histogram = torch.zeros(rows, 256, dtype=torch.int32, device=logits.device)
    mass = attention_mass(logits, lse, lengths, num_kv_heads, max_context, histogram=histogram,
                          keep_first=policy.sink, keep_last=policy.recent)
    counts = selected_counts(policy, lengths, s)[:, None].expand(-1, num_kv_heads)
    capacity = policy.selected(max_context, s)
    return _ranked_lists(mass, lengths, counts, capacity, policy.sink, policy.recent,
                         ranking, chunked, histogram, nonnegative=True)


def streamingllm_select(lengths: torch.Tensor, s: float, *, max_context: int,
                        policy: Policy | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """StreamingLLM: the ``sink`` first positions, then the newest, ``Policy.selected`` in all."""
    policy = policy or get_policy("streamingllm")
    capacity = policy.selected(max_context, s)
    counts = selected_counts(policy, lengths, s)
    slot = torch.arange(capacity, device=lengths.device)[None, :]
    length = lengths.long()[:, None]
    shift = length - counts[:, None]                # positions skipped between sink and window
    position = torch.where(slot < policy.sink, slot, slot + shift)
    return _finish(position, counts)


def quest_select(q: torch.Tensor, page_min: torch.Tensor, page_max: torch.Tensor,
                 lengths: torch.Tensor, s: float, *, max_context: int,
                 policy: Policy | None = None, ranking: str = "best",
                 chunked: bool | None = None, one_block: bool | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quest: one list per KV head from the draft query ``q`` [batch, heads, head_dim] and page
    bounds [batch, kv_heads, ≥ pages, head_dim] (``KVCache.pages``); ``chunked`` as in
    ``vegas_select``, ``one_block`` as in ``topk_select.quest_select_fused`` (the radix
    path's)."""
    policy = policy or get_policy("quest")
    size = policy.page_size
    ranking = ranking_for(policy.name, ranking, q.device)
    if ranking == "radix":   # scores, ranking and positions in one kernel
        from specsim.kernels.topk_select import quest_select_fused
        return quest_select_fused(
            q, page_min, page_max, lengths, selected_counts(policy, lengths, s),
            max_context=max_context, page_size=size,
            capacity=math.ceil(policy.selected(max_context, s) / size) * size,
            chunked=chunked, one_block=one_block)
    batch, heads, head_dim = q.shape
    kv_heads = page_min.shape[1]
    pages = math.ceil(max_context / size)
    low, high = page_min[:, :, :pages], page_max[:, :, :pages]
    qg = q.view(batch, kv_heads, heads // kv_heads, head_dim).to(low.dtype)
    # Σ_i max(q_i·min_i, q_i·max_i) = Σ_i max(q_i, 0)·max_i + min(q_i, 0)·min_i
    score = (qg.clamp(min=0) @ high.transpose(-1, -2)
             + qg.clamp(max=0) @ low.transpose(-1, -2)).float().amax(dim=2)     # [b, g, pages]
    length = lengths.long()
    page_count = (length + size - 1) // size
    counts = selected_counts(policy, lengths, s)
    chosen_pages = torch.minimum((counts + size - 1) // size, page_count)          # [batch]
    capacity_pages = math.ceil(policy.selected(max_context, s) / size)
    top, _ = _ranked_lists(score, page_count, chosen_pages[:, None].expand(-1, kv_heads),
                           capacity_pages, 0, 1, ranking)
    # The newest page is the largest selected page, so it comes last; cut it at the length.
    position = (top.long()[..., None] * size + torch.arange(size, device=q.device)).flatten(-2)
    tokens = ((chosen_pages - 1).clamp(min=0) * size
              + (length - (page_count - 1).clamp(min=0) * size))
    tokens = torch.where(chosen_pages > 0, tokens, 0)
    return _finish(position, tokens[:, None].expand(-1, kv_heads))


def append_positions(indices: torch.Tensor, counts: torch.Tensor,
                     positions: torch.Tensor) -> None:
    """Add each sequence's ``positions`` [batch] (e.g. the token just drafted) to its list(s),
    in place: ``indices[..., counts] = positions; counts += 1``. The lists need spare room."""
    if indices.dim() == 3:
        positions = positions[:, None].expand(-1, indices.shape[1])
    indices.scatter_(-1, counts.long().unsqueeze(-1), positions.to(indices.dtype).unsqueeze(-1))
    counts += 1


__all__ = ["append_positions", "attention_mass", "attention_mass_reference", "picked_row_sum",
           "picked_row_sum_reference", "quest_select", "selected_counts", "sparsespec_select",
           "streamingllm_select", "vegas_select"]
