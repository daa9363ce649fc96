"""Attention computed by headlab in query blocks, with every block's weights handed out on the way.

Inside ``with StreamingAttention(lm, consumer):`` each attention layer of ``lm.model`` computes
its own output, one block of query rows at a time: scores ``q k^T``, softmax, weights times
values, the same arithmetic as eager attention. Before a block's weights are used for the output,
``consumer.block`` gets them with each row's entropy and argmax, and the attention-weighted sums
of any per-key columns the consumer asked for (computed in the same matrix product as the output).

This is what makes head statistics cost little more than the model's own forward: the patterns are
never recomputed, no layer's ``H x T x S`` tensor exists at once (a block is about
``block_elements`` weights), and nothing is kept between layers. Causal layers skip the keys a
block cannot see. The model's outputs match its sdpa outputs to float rounding.

Shape vocabulary: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``T`` queries, ``S``
keys, ``D`` head width, ``t`` rows in a block, ``s`` keys a block sees, ``X`` consumer columns.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
from torch import nn

from headlab import native
from headlab.errors import InputError
from headlab.models.interface import observe
from headlab.models.loading import LoadedModel

#: masked scores: large and finite, so a row with no visible key gives no NaN
MASKED = -1e30


class Workspace:
    """Flat scratch tensors that blocks (and layers) reuse: a fresh tensor of several MB costs
    page faults on every block, more than the arithmetic that fills it."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def get(
        self, name: str, shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """A contiguous ``shape`` tensor (contents undefined), valid until the next ``get`` of
        ``name``."""
        n = math.prod(shape)
        key = (name, dtype, like.device)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < n:
            buf = self._buffers[key] = like.new_empty(n, dtype=dtype)
        return buf[:n].view(shape)


class BlockConsumer(Protocol):
    """What :class:`StreamingAttention` feeds, layer by layer and block by block."""

    def columns(self, layer: int) -> torch.Tensor | None:
        """Per-key values ``(B, S, X)`` whose attention-weighted sums each block needs."""

    def block(
        self,
        layer: int,
        start: int,
        weights: torch.Tensor,
        entropy: torch.Tensor,
        top: torch.Tensor,
        mixed: torch.Tensor | None,
    ) -> None:
        """Query rows ``start:start+t``: weights ``(B, H, t, s)`` (keys ``0:s``; a causal block
        sees no later key), each row's entropy and largest weight ``(B, H, t)``, mixed
        ``(B, H, t, X)``. The weights live in a buffer that the next block overwrites: copy
        them to keep them."""

    def layer_done(self, layer: int) -> None:
        """Every block of ``layer`` has been seen."""


#: blocks get at least this many query rows (up to 16x ``block_elements``): wide batches would
#: otherwise be cut into many thin blocks, each paying the fixed cost of every probe's calls
MIN_BLOCK_ROWS = 64
#: up to this many per-key columns are summed by the native kernel itself (more ride along in
#: the values' product, where a few extra columns cost a third of its time)
KERNEL_COLUMNS = 4


def block_rows(n_batch: int, n_heads: int, n_keys: int, block_elements: int) -> int:
    """Query rows per block so that a block holds about ``block_elements`` weights (more for
    wide batches, see :data:`MIN_BLOCK_ROWS`)."""
    per_row = max(1, n_batch * n_heads * n_keys)
    wide = min(MIN_BLOCK_ROWS, (16 * block_elements) // per_row)
    return max(1, block_elements // per_row, wide)


def attention_blocks(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    causal: bool,
    scaling: float,
    on_block: Any,
    columns: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    block_elements: int = 1 << 20,
    dtype: torch.dtype | None = None,
    workspace: Workspace | None = None,
    lengths: list[int] | None = None,
) -> torch.Tensor:
    """Attention output ``(B, T, H, D)``, computed block by block; ``on_block(start, weights,
    entropy, top, mixed)`` sees each block first (``top``: each row's largest weight). The
    weights live in a buffer the next block reuses: copy them to keep them.

    Args:
        query: ``(B, H, T, D)`` (after rotary embeddings).
        key, value: ``(B, Hkv, S, D)``; ``H`` must be a multiple of ``Hkv`` (GQA).
        mask: bool (True = attend) or additive float, broadcastable to ``(B, H, T, S)``.
        causal: row ``i`` sees keys ``0..i + S - T`` (bottom-right aligned, as sdpa); combined
            with ``mask`` when both are given.
        scaling: the factor on ``q k^T``.
        columns: ``(B, S, X)`` per-key values; ``mixed`` is their weighted sum per row.
        bias: additive scores ``(B|1, H|1, T, S)`` (relative position biases).
        dtype: precision of ``q k^T`` (the softmax is float32; default: the query's dtype).
        workspace: scratch buffers to reuse (across layers too); a fresh one by default.
        lengths: each batch row's number of keys when ``mask`` is known to be right padding
            (:func:`key_lengths` of it); found from ``mask`` when not given.

    Entropy is ``log Z - sum_j p_j s_j`` with ``log Z = s_max - log p_max``: no logarithm per
    weight. On CPU, with :mod:`headlab.native`'s kernels built, each row's scores (float32, no
    bias, no mask beyond right padding and the causal triangle) or else its softmax, largest
    weight and entropy (and up to 4 columns' sums) come from one pass per row; otherwise from
    torch's ops. A row that sees no key gets uniform weights (only padding rows can; callers do
    not count them). Masks of right padding (keys from each row's length on) and the causal
    triangle are filled as slices; other masks cell by cell.
    """
    n_batch, n_heads, n_queries, d = query.shape
    n_kv, n_keys = key.shape[1], key.shape[2]
    if n_heads % n_kv:
        raise InputError(f"{n_heads} query heads cannot share {n_kv} key/value heads evenly")
    group = n_heads // n_kv
    dtype = dtype or query.dtype
    offset = n_keys - n_queries  # causal alignment (keys already cached)
    # keys and values are laid out head after head (a model's head view of (B, S, Hkv, D) is
    # not): else every block's product would copy all of them again
    workspace = workspace or Workspace()
    if lengths is None:
        lengths = key_lengths(mask, causal, n_queries, n_keys)
    if lengths is not None:
        mask = None  # the lengths (and the causal triangle) say everything it says
    fused = query.device.type == "cpu" and native.kernels() is not None
    # without a bias or a mask beyond right padding and the causal triangle, in float32, the
    # native kernel computes each row's scores and softmax in one pass (with AVX-512), and the
    # weighted sums of a few columns while the row is in the cache
    one_pass = (
        fused and native.fused_scores() and dtype == torch.float32 and bias is None and mask is None
    )
    # up to KERNEL_COLUMNS columns are summed in that pass; otherwise a few float32 columns ride
    # along in the values' product, and many columns (copied once per key/value head there) and
    # lower precisions (the sums stay float32) get a product of their own, over all heads' rows
    columns_in_kernel = one_pass and columns is not None and columns.shape[-1] <= KERNEL_COLUMNS
    mix_in_product = (
        columns is not None
        and not columns_in_kernel
        and value.dtype == torch.float32
        and columns.shape[-1] <= d
    )
    if columns is not None and mix_in_product:
        extra = columns[:, None].expand(n_batch, n_kv, n_keys, columns.shape[-1])
        values = torch.cat([value, extra.to(value.dtype)], dim=-1)  # (B, Hkv, S, D + X)
    else:
        values = value.contiguous()  # (B, Hkv, S, D)
    out = query.new_empty(n_batch, n_queries, n_heads, d, dtype=value.dtype)
    rows = block_rows(n_batch, n_heads, n_keys, block_elements)
    columns_t = kernel_mixed = None
    if columns_in_kernel and columns is not None:
        columns_t = columns.float().transpose(1, 2).contiguous()  # (B, X, S)
    if one_pass:
        q_rows = query.float()  # (B, H, T, D), read in place (a head view of (B, T, H, D))
        keys_t = key.float().transpose(-2, -1).contiguous()  # (B, Hkv, D, S)
        key_counts = None if lengths is None else torch.tensor(lengths, dtype=torch.long)
    else:
        k_t = key.to(dtype).contiguous().transpose(-2, -1)  # (B, Hkv, D, S)
    for start in range(0, n_queries, rows):
        stop = min(n_queries, start + rows)
        t = stop - start
        seen = min(n_keys, stop + offset) if causal else n_keys  # keys this block can see
        if one_pass:  # scores, masks and softmax row by row (headlab.native)
            weights = workspace.get("scores", (n_batch, n_heads, t, seen), query, torch.float32)
            top = query.new_empty(n_batch, n_heads, t, dtype=torch.float32)
            entropy = torch.empty_like(top)
            if columns_t is not None:
                kernel_mixed = top.new_empty(n_batch, n_heads, t, columns_t.shape[1])
            native.attend_rows(
                q_rows, keys_t, start, t, seen, scale=scaling, lengths=key_counts, causal=causal,
                weights=weights, top=top, entropy=entropy, columns_t=columns_t,
                mixed=kernel_mixed,
            )  # fmt: skip
        else:
            weights, top, entropy = _block_weights(
                query, k_t, start, stop, seen, scaling=scaling, dtype=dtype, group=group,
                mask=mask, bias=bias, lengths=lengths, causal=causal, offset=offset,
                fused=fused, workspace=workspace,
            )  # fmt: skip
        mixed_w = weights.to(value.dtype).view(n_batch, n_kv, group * t, seen)
        product = torch.matmul(mixed_w, values[:, :, :seen])  # (B, Hkv, g t, D [+ X])
        product = product.view(n_batch, n_heads, t, -1)
        mixed = None
        if columns_in_kernel:
            mixed = kernel_mixed
        elif mix_in_product:
            mixed = product[..., d:]
        elif columns is not None:
            flat = weights.view(n_batch, n_heads * t, seen)
            mixed = torch.bmm(flat, columns[:, :seen].float()).view(n_batch, n_heads, t, -1)
        on_block(start, weights, entropy, top, mixed)
        out[:, start:stop] = product[..., :d].transpose(1, 2)
    return out


def _block_weights(
    query: torch.Tensor,
    k_t: torch.Tensor,
    start: int,
    stop: int,
    seen: int,
    *,
    scaling: float,
    dtype: torch.dtype,
    group: int,
    mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    lengths: list[int] | None,
    causal: bool,
    offset: int,
    fused: bool,
    workspace: Workspace,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's weights ``(B, H, t, s)``, largest weights and entropies ``(B, H, t)`` from
    torch's products (any mask, bias and precision); the softmax in one native pass per row
    when ``fused``."""
    n_batch, n_heads, n_queries, d = query.shape
    n_kv = k_t.shape[1]
    t = stop - start
    q_rows = query[:, :, start:stop].to(dtype) * scaling  # (B, H, t, D)
    q_rows = q_rows.reshape(n_batch, n_kv, group * t, d)  # heads of a KV group stacked
    shape = (n_batch, n_kv, group * t, seen)
    scores = workspace.get("scores", shape, query, torch.float32)  # (B, Hkv, g t, s)
    if dtype == torch.float32:
        torch.matmul(q_rows, k_t[..., :seen], out=scores)
    else:
        scores.copy_(
            torch.matmul(q_rows, k_t[..., :seen], out=workspace.get("qk", shape, query, dtype))
        )
    scores = scores.view(n_batch, n_heads, t, seen)  # (B, H, t, s)
    if bias is not None:
        scores.add_(_rows(bias, start, stop, n_queries)[..., :seen].float())
    if mask is not None:
        m = _rows(mask, start, stop, n_queries)[..., :seen]
        if m.dtype == torch.bool:
            scores.masked_fill_(~m, MASKED)
        else:
            scores.add_(m.float().clamp_min(MASKED))
    if lengths is not None:
        for b, n in enumerate(lengths):
            if n < seen:
                scores[b, ..., n:].fill_(MASKED)
    if causal:  # only the last t keys can lie after a row of this block
        first = max(0, seen - t)
        row = torch.arange(start, stop, device=query.device)[:, None] + offset
        later = torch.arange(first, seen, device=query.device)[None, :] > row  # (t, <=t)
        scores[..., first:].masked_fill_(later, MASKED)
    if fused:  # one pass per row (headlab.native), the weights over the scores
        weights = scores
        top = query.new_empty(n_batch, n_heads, t, dtype=torch.float32)
        entropy = torch.empty_like(top)
        native.softmax_rows(scores, weights, top, entropy)
    else:
        weights = workspace.get("weights", scores.shape, query, torch.float32)
        s_max = scores.amax(dim=-1)  # (B, H, t)
        torch.ops.aten._softmax.out(scores, -1, False, out=weights)  # (B, H, t, s)
        top = weights.amax(dim=-1)  # (B, H, t)
        entropy = s_max - top.log() - scores.mul_(weights).sum(-1)  # scores are spent
    return weights, top, entropy


def key_lengths(
    mask: torch.Tensor | None, causal: bool, n_queries: int, n_keys: int
) -> list[int] | None:
    """Each batch row's number of keys when ``mask`` only hides keys from that number on (right
    padding; on top of the causal triangle when ``causal``); ``None`` when it does more."""
    if mask is None or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
        return None
    if mask.shape[-1] != n_keys or mask.shape[-2] not in (1, n_queries):
        return None
    keys = mask[:, 0].any(dim=-2)  # (B, S) keys someone sees
    lengths = keys.sum(-1)
    expected = torch.arange(n_keys, device=mask.device)[None, :] < lengths[:, None]  # (B, S)
    full = expected[:, None, :].expand(-1, mask.shape[-2], -1)
    if causal:
        row = torch.arange(mask.shape[-2], device=mask.device)[:, None] + n_keys - n_queries
        full = full & (torch.arange(n_keys, device=mask.device)[None, :] <= row)
    if not torch.equal(mask[:, 0], full):
        return None
    return [int(n) for n in lengths.tolist()]


def _rows(m: torch.Tensor, start: int, stop: int, n_queries: int) -> torch.Tensor:
    """Rows ``start:stop`` of a mask or bias broadcastable to ``(B, H, T, S)``."""
    if m.dim() >= 2 and m.shape[-2] == n_queries:
        return m[..., start:stop, :]
    return m


class StreamingAttention:
    """Context manager: ``lm``'s attention layers compute their output in query blocks and hand
    each block to ``consumer`` (:class:`BlockConsumer`).

    Args:
        lm: the model.
        consumer: gets ``columns``, ``block`` and ``layer_done`` calls during each forward pass.
        block_elements: about this many weights per block.
        dtype: precision of ``q k^T`` (default: the model's).
        stop_after_last: end the forward pass as soon as every layer's attention has been
            handed out: what comes after (the last layer's output projection and MLP, final
            norms, any head on top) cannot change a pattern. The ``with`` block then ends at the
            forward call, without an error, and the model returns nothing.

    Example:
        >>> with StreamingAttention(lm, consumer):   # doctest: +SKIP
        ...     lm.model(**batch)
    """

    def __init__(
        self,
        lm: LoadedModel,
        consumer: BlockConsumer,
        *,
        block_elements: int = 1 << 20,
        dtype: torch.dtype | None = None,
        stop_after_last: bool = False,
    ) -> None:
        if block_elements < 1:
            raise InputError(f"block_elements must be 1 or more, got {block_elements}")
        self.lm = lm
        self.consumer = consumer
        self.block_elements = block_elements
        self.dtype = dtype
        self.stop_after_last = stop_after_last
        self._pending: set[int] = set()  # layers not yet seen in this forward pass
        self._removers: list[Any] = []
        self._workspace = Workspace()
        # every layer of a forward pass gets the same mask tensor: its lengths are found once
        # (the tensor is held, so a later mask cannot be mistaken for it)
        self._mask: tuple[Any, ...] | None = None

    def _lengths(
        self, mask: torch.Tensor | None, causal: bool, n_queries: int, n_keys: int
    ) -> list[int] | None:
        shape = (causal, n_queries, n_keys)
        cached = self._mask
        if cached is None or cached[0] is not mask or cached[1] != shape:
            cached = self._mask = (mask, shape, key_lengths(mask, causal, n_queries, n_keys))
        return cached[2]

    def _layer(self, layer: int) -> Any:
        consumer = self.consumer

        def attend(
            module: nn.Module,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            mask: Any,
            kwargs: dict[str, Any],
        ) -> torch.Tensor:
            for name in ("softcap", "s_aux", "sinks"):
                if kwargs.get(name) is not None:
                    raise InputError(
                        f"layer {layer} uses attention {name!r}, which headlab's block attention "
                        "does not implement"
                    )
            flag = kwargs.get("is_causal")
            flag = getattr(module, "is_causal", True) if flag is None else flag
            n_queries, n_keys = query.shape[2], key.shape[2]
            # sdpa's rule, and a causal model's own mask implies it whenever S == T
            causal = bool(flag) and n_queries > 1 and (mask is None or n_keys == n_queries)
            scaling = kwargs.get("scaling")
            scaling = float(scaling) if scaling is not None else query.shape[-1] ** -0.5

            def on_block(start: int, *parts: Any) -> None:
                consumer.block(layer, start, *parts)

            mask = mask if isinstance(mask, torch.Tensor) else None
            out = attention_blocks(
                query,
                key,
                value,
                mask=mask,
                causal=causal,
                scaling=scaling,
                on_block=on_block,
                columns=consumer.columns(layer),
                bias=kwargs.get("position_bias"),
                block_elements=self.block_elements,
                dtype=self.dtype,
                workspace=self._workspace,
                lengths=self._lengths(mask, causal, n_queries, n_keys),
            )
            consumer.layer_done(layer)
            if self.stop_after_last:
                self._pending.discard(layer)
                if not self._pending:
                    self._pending = set(range(len(self.lm.layers)))
                    raise _ForwardDone
            return out

        return attend

    def __enter__(self) -> StreamingAttention:
        self._pending = set(range(len(self.lm.layers)))
        try:
            for layer, handles in enumerate(self.lm.layers):
                self._removers.append(observe(handles.attention, self._layer(layer)))
        except BaseException:
            self.__exit__(None)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> bool:
        while self._removers:
            self._removers.pop()()
        self._mask = None
        return exc_type is _ForwardDone


class _ForwardDone(BaseException):
    """Raised inside the model once every layer's attention has been seen
    (``stop_after_last``); :class:`StreamingAttention` swallows it on exit. Not an
    ``Exception``: no ``except Exception`` in model code may mistake it for an error."""
