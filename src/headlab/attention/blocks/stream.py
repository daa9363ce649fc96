"""A model layer's attention computed one block of query rows at a time, each block's weights
and statistics handed out on the way (role statistics, :class:`~headlab.models.StreamingAttention`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from headlab import native
from headlab.attention.blocks.rules import (
    MASKED,
    _empty_by_rule,
    _mask_scores,
    _zero_rows,
    key_lengths,
)
from headlab.attention.masks import causal_keys
from headlab.errors import InputError


# ---------------------------------------------------------------------------- block engine
class Workspace:
    """Flat scratch tensors that blocks (and layers) reuse: a fresh tensor of several MB costs
    page faults on every block, more than the arithmetic that fills it."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def get(
        self, name: str, shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """A contiguous ``shape`` tensor (contents undefined) on ``like``'s device, valid until
        the next ``get`` of ``name``."""
        n = math.prod(shape)
        key = (name, dtype, like.device)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < n:
            buf = self._buffers[key] = like.new_empty(n, dtype=dtype)
        return buf[:n].view(shape)


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
    softcap: float | None = None,
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
        dtype: precision of ``q k^T`` (the softmax is float32; default: the query's dtype,
            except float32 for float16 queries, whose scores could overflow at 65,504).
        workspace: scratch buffers to reuse (across layers too); a fresh one by default.
        lengths: each batch row's number of keys when ``mask`` is known to be right padding
            (:func:`key_lengths` of it); found from ``mask`` when not given.
        softcap: Gemma 2's logit soft-capping: scaled scores become ``softcap *
            tanh(scores / softcap)`` before masks and bias, as in the model's eager attention.

    Entropy is ``log Z - sum_j p_j s_j`` with ``log Z = s_max - log p_max``: no logarithm per
    weight. On CPU, with :mod:`headlab.native`'s kernels built, each row's scores (float32, no
    bias, no mask beyond right padding and the causal triangle) or else its softmax, largest
    weight and entropy (and up to 4 columns' sums) come from one pass per row; otherwise from
    torch's ops on the inputs' device. A row that sees no key gets zeros (see the module's
    docstring). Masks of right padding (keys from each row's length on) and the causal triangle
    are filled as slices; other masks cell by cell.
    """
    n_batch, n_heads, n_queries, d = query.shape
    n_kv, n_keys = key.shape[1], key.shape[2]
    if n_heads % n_kv:
        raise InputError(f"{n_heads} query heads cannot share {n_kv} key/value heads evenly")
    group = n_heads // n_kv
    dtype = dtype or (torch.float32 if query.dtype == torch.float16 else query.dtype)
    # keys and values are laid out head after head (a model's head view of (B, S, Hkv, D) is
    # not): else every block's product would copy all of them again
    workspace = workspace or Workspace()
    if lengths is None:
        lengths = key_lengths(mask, causal, n_queries, n_keys)
    if lengths is not None:
        mask = None  # the lengths (and the causal triangle) say everything it says
    fused = query.device.type == "cpu" and native.kernels() is not None
    one_pass = fused and native.fused_scores() and dtype == torch.float32
    one_pass = one_pass and bias is None and mask is None and softcap is None
    columns_in_kernel, mix_in_product, values = _column_plan(value, columns, one_pass)
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
        seen = causal_keys(stop, n_queries, n_keys) if causal else n_keys  # keys it can see
        if seen == 0:  # no row of this block sees a key: zeros (the convention)
            _empty_block(query, columns, start, t, on_block)
            out[:, start:stop] = 0
            continue
        if one_pass:  # scores, masks and softmax row by row (headlab.native)
            weights, top, entropy, kernel_mixed = _native_block(
                q_rows, keys_t, start, stop, seen, n_queries, n_keys, scaling=scaling,
                lengths=lengths, key_counts=key_counts, causal=causal, columns_t=columns_t,
                workspace=workspace,
            )  # fmt: skip
        else:
            weights, top, entropy = _block_weights(
                query, k_t, start, stop, seen, scaling=scaling, dtype=dtype, group=group,
                mask=mask, bias=bias, lengths=lengths, causal=causal, fused=fused,
                workspace=workspace, softcap=softcap,
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


def _column_plan(
    value: torch.Tensor, columns: torch.Tensor | None, one_pass: bool
) -> tuple[bool, bool, torch.Tensor]:
    """Where per-key columns are summed, and the values the weights multiply.

    Without a bias or a mask beyond right padding and the causal triangle, in float32, the
    native kernel computes each row's scores and softmax in one pass (``one_pass``, with
    AVX-512), and the weighted sums of up to :data:`KERNEL_COLUMNS` columns while the row is in
    the cache. Otherwise a few float32 columns ride along in the values' product, and many
    columns (copied once per key/value head there) and lower precisions (the sums stay float32)
    get a product of their own, over all heads' rows.

    Returns:
        ``(columns in the kernel, columns in the values' product, values (B, Hkv, S, D [+ X]))``
    """
    n_batch, n_kv, n_keys, d = value.shape
    in_kernel = one_pass and columns is not None and columns.shape[-1] <= KERNEL_COLUMNS
    in_product = (
        columns is not None
        and not in_kernel
        and value.dtype == torch.float32
        and columns.shape[-1] <= d
    )
    if columns is not None and in_product:
        extra = columns[:, None].expand(n_batch, n_kv, n_keys, columns.shape[-1])
        return in_kernel, in_product, torch.cat([value, extra.to(value.dtype)], dim=-1)
    return in_kernel, in_product, value.contiguous()


def _empty_block(
    query: torch.Tensor, columns: torch.Tensor | None, start: int, t: int, on_block: Any
) -> None:
    """A block of ``t`` rows that see no key: zero weights, statistics and column sums."""
    n_batch, n_heads = query.shape[0], query.shape[1]
    weights = query.new_zeros(n_batch, n_heads, t, 0, dtype=torch.float32)
    top = query.new_zeros(n_batch, n_heads, t, dtype=torch.float32)
    entropy = torch.zeros_like(top)
    mixed = None if columns is None else top.new_zeros(*top.shape, columns.shape[-1])
    on_block(start, weights, entropy, top, mixed)


def _native_block(
    q_rows: torch.Tensor,
    keys_t: torch.Tensor,
    start: int,
    stop: int,
    seen: int,
    n_queries: int,
    n_keys: int,
    *,
    scaling: float,
    lengths: list[int] | None,
    key_counts: torch.Tensor | None,
    causal: bool,
    columns_t: torch.Tensor | None,
    workspace: Workspace,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One block's weights ``(B, H, t, seen)``, largest weights, entropies and column sums
    from :mod:`headlab.native`'s one pass per row; rows that see no key get zeros."""
    n_batch, n_heads, t = q_rows.shape[0], q_rows.shape[1], stop - start
    weights = workspace.get("scores", (n_batch, n_heads, t, seen), q_rows, torch.float32)
    top = q_rows.new_empty(n_batch, n_heads, t, dtype=torch.float32)
    entropy = torch.empty_like(top)
    mixed = None
    if columns_t is not None:
        mixed = top.new_empty(n_batch, n_heads, t, columns_t.shape[1])
    native.attend_rows(
        q_rows, keys_t, start, t, seen, scale=scaling, lengths=key_counts, causal=causal,
        weights=weights, top=top, entropy=entropy, columns_t=columns_t, mixed=mixed,
    )  # fmt: skip
    # the kernel gives a row with no key uniform weights; the convention is zeros
    empty = _empty_by_rule(lengths, causal, start, stop, n_queries, n_keys, q_rows.device)
    _zero_rows(empty, (weights, mixed), (top, entropy))
    return weights, top, entropy, mixed


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
    fused: bool,
    workspace: Workspace,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's weights ``(B, H, t, s)``, largest weights and entropies ``(B, H, t)`` from
    torch's products (any mask, bias and precision); the softmax in one native pass per row
    when ``fused``."""
    n_batch, n_heads, n_queries, d = query.shape
    n_kv, n_keys = k_t.shape[1], k_t.shape[3]
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
    if softcap is not None:  # Gemma 2: cap * tanh(scores / cap), before any mask
        scores.div_(softcap).tanh_().mul_(softcap)
    empty_rows = _mask_scores(
        scores, mask=mask, bias=bias, lengths=lengths, causal=causal, start=start,
        n_queries=n_queries, n_keys=n_keys,
    )  # fmt: skip
    if fused:  # one pass per row (headlab.native), the weights over the scores
        weights = scores
        top = query.new_empty(n_batch, n_heads, t, dtype=torch.float32)
        entropy = torch.empty_like(top)
        native.softmax_rows(scores, weights, top, entropy)
        # a row with no key came out uniform (all its scores MASKED): only rows whose largest
        # weight is 1/s can be one, and only then are the masks asked
        uniform = top * seen <= 1.001  # (B, H, t)
        empty = empty_rows() if bool(uniform.any()) else None
    else:
        weights = workspace.get("weights", scores.shape, query, torch.float32)
        s_max = scores.amax(dim=-1)  # (B, H, t)
        empty = s_max <= MASKED / 2  # every key hidden
        torch.ops.aten._softmax.out(scores, -1, False, out=weights)  # (B, H, t, s)
        top = weights.amax(dim=-1)  # (B, H, t)
        entropy = s_max - top.log() - scores.mul_(weights).sum(-1)  # scores are spent
    _zero_rows(empty, (weights,), (top, entropy))
    return weights, top, entropy
