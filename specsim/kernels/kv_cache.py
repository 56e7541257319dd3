"""The KV cache layout the kernels and the engine share.

Layout. Contiguous per sequence and preallocated: for each layer, K and V are tensors
``[batch, kv_heads, max_len, head_dim]`` (bf16 on the GPU), and one int32 tensor
``lengths[batch]`` (shared by all layers) says how many positions of each sequence are valid.
Position ``n`` of sequence ``b``, KV head ``g`` is ``k[b, g, n, :]``; a block of consecutive
positions is one contiguous run of memory, which is what the verify kernel streams and what makes
a gathered row (sparse drafting) a single 128/256-byte read.

Why this layout and not pages. Self-speculative decoding appends ``k + 1`` tokens per iteration
and rolls back the rejected ones; with a contiguous cache both are O(1) bookkeeping on
``lengths``: *append* writes the new K/V rows at ``lengths[b] ..`` and advances ``lengths``;
*rollback* of ``r_b`` rejected tokens is ``lengths[b] -= r_b`` (the stale rows are overwritten by
the next append). No block table, no copy. The price is preallocating ``max_len`` per sequence,
which a simulator-grade engine (fixed batch, known maximum context) can afford.

Protocol for a forward pass of ``n`` new tokens per sequence (all on the device, no host sync):
``extend(n)`` first (lengths += n, so attention at every layer sees the new tokens), then
``write(layer, k_new, v_new)`` at each layer (rows land at ``lengths − n .. lengths − 1``), then
after verification ``rollback(rejected)``. ``append`` does extend + write for a one-layer cache.

Quest page bounds (optional, ``page_size``): per layer, ``page_min``/``page_max``
``[batch, kv_heads, pages + 1, head_dim]`` hold the element-wise min and max of the keys in each
page of ``page_size`` positions, over the *valid* positions only. ``write`` recomputes the pages
it touched, ``rollback`` the page that holds the first removed position, so the bounds are exact
for every page below ``ceil(lengths / page_size)``. The extra last page is scratch (writes to
pages past a sequence's length land there).
"""
from __future__ import annotations

import math

import torch

from specsim.kernels._runtime import default_device, tl, triton


@triton.jit
def _append_rows_kernel(K, V, PMin, PMax, Lengths, KNew, VNew, n,
                        stride_kb, stride_kh, stride_kn,
                        stride_knb, stride_knh, stride_knt,
                        stride_vnb, stride_vnh, stride_vnt,
                        stride_pb, stride_ph, stride_pp,
                        NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                        ROWS: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr):
    """The ``n`` (≤ ``ROWS``) newest positions of one (sequence, KV head) (``lengths[b] − n
    ..``, after ``extend(n)``): their K and V rows, read by their own strides as one tile,
    and with ``PAGED`` the min/max bounds of each page they touch, recomputed in place: the
    new rows' element-wise min/max in that page, with the page's stored bounds when it began
    before them (exact: the bounds of the positions before them are exact, see the module
    doc)."""
    pid = tl.program_id(0)
    b = (pid // NUM_KV_HEADS).to(tl.int64)
    h = (pid % NUM_KV_HEADS).to(tl.int64)
    first = tl.load(Lengths + b).to(tl.int64) - n
    row = tl.arange(0, ROWS)
    dims = tl.arange(0, HEAD_DIM)
    valid = (row < n)[:, None]
    k = tl.load(KNew + b * stride_knb + h * stride_knh + row[:, None] * stride_knt
                + dims[None, :], mask=valid, other=0.0)
    v = tl.load(VNew + b * stride_vnb + h * stride_vnh + row[:, None] * stride_vnt
                + dims[None, :], mask=valid, other=0.0)
    k = k.to(K.dtype.element_ty)
    at = b * stride_kb + h * stride_kh + (first + row)[:, None] * stride_kn + dims[None, :]
    tl.store(K + at, k, mask=valid)
    tl.store(V + at, v.to(V.dtype.element_ty), mask=valid)
    if PAGED:
        kf = k.to(tl.float32)
        page_of = (first + row) // PAGE
        bounds = b * stride_pb + h * stride_ph + dims
        for page in range(first // PAGE, (first + n - 1) // PAGE + 1):
            inside = valid & (page_of == page)[:, None]
            low = tl.min(tl.where(inside, kf, float("inf")), axis=0)
            high = tl.max(tl.where(inside, kf, float("-inf")), axis=0)
            if page * PAGE < first:     # the page holds earlier positions: join their bounds
                low = tl.minimum(low, tl.load(PMin + bounds + page * stride_pp).to(tl.float32))
                high = tl.maximum(high,
                                  tl.load(PMax + bounds + page * stride_pp).to(tl.float32))
            tl.store(PMin + bounds + page * stride_pp, low.to(PMin.dtype.element_ty))
            tl.store(PMax + bounds + page * stride_pp, high.to(PMax.dtype.element_ty))


class KVCache:
    """Preallocated contiguous K/V for ``num_layers`` layers, with append and rollback."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, *,
                 num_layers: int = 1, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None, page_size: int | None = None,
                 fused_append: bool = False):
        self.batch, self.kv_heads, self.max_len, self.head_dim = batch, kv_heads, max_len, head_dim
        self.num_layers = num_layers
        device = default_device(device)
        shape = (num_layers, batch, kv_heads, max_len, head_dim)
        self._k = torch.zeros(shape, dtype=dtype, device=device)
        self._v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        self.page_size = page_size
        #: appends (a plain or draft step's one position, a verify pass's k + 1) by
        #: ``_append_rows_kernel``: one launch for the K/V rows and the page bounds, where the
        #: torch path makes ~10 launches for the rows and, with pages, ~30 more to recompute
        #: the pages they touch
        self.fused_append = fused_append
        self.page_min = self.page_max = None
        if page_size:
            self.num_pages = math.ceil(max_len / page_size)
            pshape = (num_layers, batch, kv_heads, self.num_pages + 1, head_dim)
            self.page_min = torch.zeros(pshape, dtype=dtype, device=device)
            self.page_max = torch.zeros(pshape, dtype=dtype, device=device)

    def k(self, layer: int = 0) -> torch.Tensor:
        """K of one layer, ``[batch, kv_heads, max_len, head_dim]``."""
        return self._k[layer]

    def v(self, layer: int = 0) -> torch.Tensor:
        return self._v[layer]

    def pages(self, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Quest page bounds of one layer (``page_min``, ``page_max``) without the scratch page."""
        assert self.page_min is not None, "KVCache was made without page_size"
        return self.page_min[layer, :, :, :-1], self.page_max[layer, :, :, :-1]

    def extend(self, n: int | torch.Tensor) -> None:
        """Reserve ``n`` more positions per sequence (int, or int32 tensor [batch])."""
        self.lengths += n

    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor,
              counts: torch.Tensor | None = None) -> None:
        """Write the newest positions of one layer after ``extend``.

        ``k_new``/``v_new``: [batch, kv_heads, n, head_dim]; with ``counts`` (int32 [batch],
        ragged writes) only the first ``counts[b]`` rows of sequence ``b`` are written, at
        ``lengths[b] − counts[b] ..``; otherwise all ``n`` at ``lengths[b] − n ..``.
        """
        n = k_new.shape[2]
        if counts is None and self.fused_append:
            self._append_rows(layer, k_new, v_new)
            return
        step = torch.arange(n, device=k_new.device, dtype=torch.int64)[None, :]
        added = counts.long() if counts is not None else torch.full_like(self.lengths, n).long()
        batch_index = torch.arange(self.batch, device=k_new.device)[:, None]
        k_rows, v_rows = k_new.permute(0, 2, 1, 3), v_new.permute(0, 2, 1, 3)   # [b, n, h, d]
        if counts is not None:
            # Rows past counts[b] repeat the last valid row (same value, same place); a
            # sequence with nothing to add rewrites its position 0 with what is there.
            row = torch.minimum(step, (added - 1).clamp(min=0)[:, None])         # [batch, n]
            k_rows = k_rows[batch_index, row]
            v_rows = v_rows[batch_index, row]
            position = (self.lengths.long() - added)[:, None] + row
            empty = (added == 0)[:, None]
            position = torch.where(empty, 0, position)
            keep = ~empty[:, :, None, None]
            k_rows = torch.where(keep, k_rows, self._k[layer][batch_index, :, position])
            v_rows = torch.where(keep, v_rows, self._v[layer][batch_index, :, position])
        else:
            position = (self.lengths.long() - added)[:, None] + step               # [batch, n]
        self._k[layer][batch_index, :, position] = k_rows.to(self._k.dtype)
        self._v[layer][batch_index, :, position] = v_rows.to(self._v.dtype)
        if self.page_size:
            first = self.lengths.long() - added
            self._refresh_pages(layer, first // self.page_size, (n - 1) // self.page_size + 2)

    def _append_rows(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        k_cache, v_cache = self._k[layer], self._v[layer]
        k_new = k_new if k_new.stride(-1) == 1 else k_new.contiguous()
        v_new = v_new if v_new.stride(-1) == 1 else v_new.contiguous()
        paged = bool(self.page_size)
        low = self.page_min[layer] if paged else k_cache
        high = self.page_max[layer] if paged else k_cache
        _append_rows_kernel[(self.batch * self.kv_heads,)](
            k_cache, v_cache, low, high, self.lengths, k_new, v_new, k_new.shape[2],
            *k_cache.stride()[:3], *k_new.stride()[:3], *v_new.stride()[:3],
            *low.stride()[:3], NUM_KV_HEADS=self.kv_heads, HEAD_DIM=self.head_dim,
            ROWS=triton.next_power_of_2(k_new.shape[2]), PAGE=self.page_size or 1,
            PAGED=paged, num_warps=1 if k_new.shape[2] <= 2 else 4)

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor,
               counts: torch.Tensor | None = None) -> None:
        """extend + write for a one-layer cache."""
        assert self.num_layers == 1, "with several layers: extend(n), then write(layer, ...)"
        self.extend(counts if counts is not None else k_new.shape[2])
        self.write(0, k_new, v_new, counts)

    def rollback(self, rejected: int | torch.Tensor) -> None:
        """Drop the last ``rejected`` positions of each sequence (int or int32 tensor [batch])."""
        self.lengths -= rejected
        if self.page_size:
            self._refresh_pages(slice(None), self.lengths.long() // self.page_size, 1)

    def _refresh_pages(self, layers: int | slice, first_page: torch.Tensor, pages: int) -> None:
        """Recompute the bounds of ``pages`` pages from ``first_page[b]`` over valid positions,
        for one layer or a slice of layers at once (a rollback refreshes every layer with one
        set of launches, not one per layer)."""
        layers = slice(layers, layers + 1) if isinstance(layers, int) else layers
        size = self.page_size
        page = first_page[:, None] + torch.arange(pages, device=first_page.device)[None, :]
        position = page[:, :, None] * size + torch.arange(size, device=page.device)  # [b, p, s]
        valid = position < self.lengths.long()[:, None, None]
        batch_index = torch.arange(self.batch, device=page.device)
        # advanced indices around a slice go first: [b, p, s, layers, h, d]
        rows = self._k[layers][:, batch_index[:, None, None], :,
                               position.clamp(max=self.max_len - 1)]
        keep = valid[..., None, None, None]
        # masked_fill with a Python scalar: no host tensor (CUDA-graph capturable)
        low = rows.masked_fill(~keep, float("inf")).amin(dim=2)              # [b, p, L, h, d]
        high = rows.masked_fill(~keep, float("-inf")).amax(dim=2)
        page = torch.where(valid[:, :, 0], page, self.num_pages)  # empty pages: scratch slot
        self.page_min[layers][:, batch_index[:, None], :, page] = low
        self.page_max[layers][:, batch_index[:, None], :, page] = high


def page_bounds_reference(k: torch.Tensor, lengths: torch.Tensor, page_size: int
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Page min/max recomputed from scratch: [batch, kv_heads, pages, head_dim]; pages past a
    sequence's length are NaN."""
    batch, kv_heads, max_len, head_dim = k.shape
    pages = math.ceil(max_len / page_size)
    low = torch.full((batch, kv_heads, pages, head_dim), float("nan"), dtype=k.dtype,
                     device=k.device)
    high = low.clone()
    for b in range(batch):
        length = int(lengths[b])
        for p in range(math.ceil(length / page_size)):
            rows = k[b, :, p * page_size:min(length, (p + 1) * page_size)]
            low[b, :, p] = rows.amin(dim=1)
            high[b, :, p] = rows.amax(dim=1)
    return low, high


__all__ = ["KVCache", "page_bounds_reference"]
