"""The attention engine: the one place where headlab computes attention weights.

Every attention weight headlab hands out comes from this module, ``softmax(q k^T * scale +
mask)`` (Vaswani et al. 2017, eq. 1), by one of three entries that share its rules:

- :func:`attention_blocks`: a model layer's output computed one block of query rows at a time,
  each block's weights, largest weight, entropy and sums over chosen key columns handed out on
  the way (:class:`~headlab.models.StreamingAttention`, role statistics);
- :func:`attention_weights`: whole patterns of chosen heads and query rows
  (:class:`~headlab.models.HeadCapture`);
- :func:`explicit_attention`: :class:`~headlab.attention.MultiHeadAttention`'s explicit path
  (weights returned, differentiable);

The rules they share:

- **Masks**: boolean (True = may attend) or additive float, broadcastable to ``(B, H, T, S)``;
  right padding as each batch row's number of keys (:func:`key_lengths`); the causal triangle
  aligned to the bottom right (:func:`~headlab.attention.masks.causal_rows`: query ``i`` sees
  keys ``j <= i + S - T``); a sliding window is whatever the given mask says. An additive mask
  hides a key where it is ``-inf`` or at most ``max(-1e30, finfo(dtype).min)``.
- **GQA/MQA**: query head ``h`` reads key/value head ``h // G`` (``G = H // Hkv``); the heads of
  a group are stacked as rows of one product, so keys and values are never copied per head.
- **A query row with no visible key** (every key hidden: a padded query under a sliding window,
  a sentence with no keys) gets **zero weights, a zero head output, entropy 0 and largest
  weight 0**, on every path (torch's ops, the native kernels, whole patterns, the explicit
  path), never NaN, with zero gradients through it. This is what torch's
  ``scaled_dot_product_attention`` gives such a row, so a model run through headlab's engine
  matches its sdpa run there too.

The optional native kernels (:mod:`headlab.native`) sit behind this module alone: they run only
on CPU tensors, where they are built, and give the same results to float rounding. Everything
else is torch's ops on the inputs' device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from headlab import native
from headlab.attention import memory
from headlab.attention.masks import causal_keys, causal_mask, causal_rows
from headlab.errors import InputError

#: masked scores: large and finite, so that a row with no visible key gives no NaN (its weights
#: are then set to zero)
MASKED = -1e30


# ---------------------------------------------------------------------------------- masks
def _rows(m: torch.Tensor, start: int, stop: int, n_queries: int) -> torch.Tensor:
    """Rows ``start:stop`` of a mask or bias broadcastable to ``(B, H, T, S)``."""
    if m.dim() >= 2 and m.shape[-2] == n_queries:
        return m[..., start:stop, :]
    return m


def _hiding_below(dtype: torch.dtype) -> float:
    """Additive mask values at or below this hide a key."""
    return max(MASKED, torch.finfo(dtype).min)


def _empty_by_rule(
    lengths: list[int] | None,
    causal: bool,
    start: int,
    stop: int,
    n_queries: int,
    n_keys: int,
    device: torch.device,
) -> torch.Tensor | None:
    """Rows ``start:stop`` that right padding of ``lengths`` or the causal triangle leave with
    no key, ``(B|1, 1, t)`` bool; ``None`` when there are none."""
    empty = None
    if causal and start + n_keys - n_queries < 0:  # rows before the first key (T > S)
        empty = ~causal_rows(start, stop, n_queries, n_keys, device=device).any(-1)[None, None]
    if lengths is not None and min(lengths, default=1) == 0:
        none = torch.tensor([n == 0 for n in lengths], device=device)[:, None, None]  # (B, 1, 1)
        empty = none if empty is None else empty | none
    return empty


def _mask_scores(
    scores: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    lengths: list[int] | None,
    causal: bool,
    start: int,
    n_queries: int,
    n_keys: int,
) -> Callable[[], torch.Tensor | None]:
    """Add ``bias`` and hide every masked key of float32 ``scores (B, H, t, s)`` (query rows
    ``start:start+t`` over keys ``0:s``) in place: a hidden key's score becomes
    :data:`MASKED` (so a row's largest score is at most ``MASKED / 2`` exactly when it sees no
    key). Returns the function that finds the rows left with no visible key from the masks,
    bool broadcastable to ``(B, H, t)`` (``None`` when there are none for sure): called only
    when a cheaper sign says there may be some."""
    t, seen = scores.shape[-2], scores.shape[-1]
    stop = start + t
    if bias is not None:
        scores.add_(_rows(bias, start, stop, n_queries)[..., :seen].float())
    hidden = None
    if mask is not None:
        m = _rows(mask, start, stop, n_queries)[..., :seen]
        if m.dtype == torch.bool:
            hidden = ~m
            scores.masked_fill_(hidden, MASKED)
        else:
            hidden = m <= _hiding_below(m.dtype)
            scores.add_(m.float().clamp_min(MASKED).masked_fill_(hidden, MASKED))
    if lengths is not None:
        for b, n in enumerate(lengths):
            if n < seen:
                scores[b, ..., n:].fill_(MASKED)
    first = max(0, seen - t)  # only the last t keys can lie after a row of this block
    later = None
    if causal:
        allowed = causal_rows(start, stop, n_queries, n_keys, first_key=first, device=scores.device)
        later = ~allowed[:, : seen - first]  # (t, <=t)
        scores[..., first:].masked_fill_(later, MASKED)

    def empty_rows() -> torch.Tensor | None:
        empty = _empty_by_rule(lengths, causal, start, stop, n_queries, n_keys, scores.device)
        if hidden is None:
            return empty
        if later is None:
            by_mask = hidden.all(-1)
        else:
            by_mask = hidden[..., :first].all(-1) & (hidden[..., first:] | later).all(-1)
        return by_mask if empty is None else empty | by_mask

    return empty_rows


def _zero_rows(
    empty: torch.Tensor | None,
    cells: tuple[torch.Tensor | None, ...],
    rows: tuple[torch.Tensor, ...] = (),
) -> None:
    """Write zeros, in place, over the rows ``empty`` (bool broadcastable to ``(B, H, t)``) of
    ``cells`` (``(B, H, t, n)`` each) and ``rows`` (``(B, H, t)`` each): the convention for
    rows with no visible key."""
    if empty is None or not bool(empty.any()):
        return
    for x in cells:
        if x is not None:
            x.masked_fill_(empty[..., None], 0.0)
    for x in rows:
        x.masked_fill_(empty, 0.0)


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
        rule = causal_rows(0, mask.shape[-2], n_queries, n_keys, device=mask.device)  # (T|1, S)
        full = full & rule
    if not torch.equal(mask[:, 0], full):
        return None
    return [int(n) for n in lengths.tolist()]


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
        seen = causal_keys(stop, n_queries, n_keys) if causal else n_keys  # keys it can see
        if seen == 0:  # no row of this block sees a key: zeros (the convention)
            weights = query.new_zeros(n_batch, n_heads, t, 0, dtype=torch.float32)
            top = query.new_zeros(n_batch, n_heads, t, dtype=torch.float32)
            entropy = torch.zeros_like(top)
            mixed = None if columns is None else top.new_zeros(*top.shape, columns.shape[-1])
            on_block(start, weights, entropy, top, mixed)
            out[:, start:stop] = 0
            continue
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
            # the kernel gives a row with no key uniform weights; the convention is zeros
            empty = _empty_by_rule(lengths, causal, start, stop, n_queries, n_keys, query.device)
            _zero_rows(empty, (weights, kernel_mixed), (top, entropy))
        else:
            weights, top, entropy = _block_weights(
                query, k_t, start, stop, seen, scaling=scaling, dtype=dtype, group=group,
                mask=mask, bias=bias, lengths=lengths, causal=causal, fused=fused,
                workspace=workspace,
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
    fused: bool,
    workspace: Workspace,
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


# ---------------------------------------------------------------------------- whole patterns
def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    causal: bool,
    scaling: float,
    heads: list[int] | tuple[int, ...] | None = None,
    rows: tuple[int, int] | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``softmax(q k^T * scaling + mask)`` for the chosen heads and query rows, float32.

    Args:
        q: ``(B, H, T, D)``; k: ``(B, Hkv, S, D)``, ``H`` a multiple of ``Hkv``.
        mask: bool (True = attend) or additive float, broadcastable to ``(B, H, T, S)``.
        causal: bottom-right aligned causal triangle, combined with ``mask``.
        heads: query heads to compute (default all).
        rows: ``(start, stop)``, only those query positions (block-wise statistics never hold
            a whole ``T x S`` pattern).
        dtype: precision of the product ``q k^T`` (the softmax is always float32).

    Shape:
        returns ``(B, h, t, S)``; rows with no visible key are zeros.
    """
    n_batch, n_heads, n_queries, d = q.shape
    n_kv, n_keys = k.shape[1], k.shape[2]
    if n_heads % n_kv:
        raise InputError(f"{n_heads} query heads cannot share {n_kv} key/value heads evenly")
    group = n_heads // n_kv
    start, stop = rows if rows is not None else (0, n_queries)
    t = stop - start
    m = mask
    if heads is None:  # the heads of a KV group stacked as rows: keys read once per group
        q_rows = q[:, :, start:stop].to(dtype).reshape(n_batch, n_kv, group * t, d)
        scores = torch.matmul(q_rows, k.to(dtype).transpose(-2, -1))  # (B, Hkv, g t, S)
        scores = scores.view(n_batch, n_heads, t, n_keys)  # (B, H, t, S)
    else:
        idx = torch.as_tensor(list(heads), dtype=torch.long, device=q.device)
        q_sel = q[:, :, start:stop].index_select(1, idx).to(dtype)  # (B, h, t, D)
        k_sel = k.index_select(1, idx // group).to(dtype)  # (B, h, S, D)
        scores = torch.matmul(q_sel, k_sel.transpose(-2, -1))  # (B, h, t, S)
        if m is not None and m.dim() == 4 and m.shape[1] == n_heads and n_heads > 1:
            m = m.index_select(1, idx.to(m.device))
    scores = scores.float() if scores.dtype != torch.float32 else scores
    scores.mul_(scaling)
    empty_rows = _mask_scores(
        scores, mask=m, bias=None, lengths=None, causal=causal, start=start,
        n_queries=n_queries, n_keys=n_keys,
    )  # fmt: skip
    weights = torch.softmax(scores, dim=-1, out=scores)  # (B, h, t, S)
    _zero_rows(empty_rows(), (weights,))
    return weights


# ------------------------------------------------------------------ MultiHeadAttention's path
@dataclass(frozen=True, kw_only=True)
class AttendResult:
    """What :func:`~headlab.attention.functional.attend` returns.

    Attributes:
        head_outputs: ``(B, H, T, D)``, each head's weighted sum of values.
        weights: ``(B, H, T, S)`` attention weights, or ``None`` when not requested.
        why_not_fast_path: ``None`` when the fused kernel ran, else the reason it did not.
    """

    head_outputs: torch.Tensor
    weights: torch.Tensor | None
    why_not_fast_path: str | None


class _SoftmaxInPlace(torch.autograd.Function):
    """Softmax over the last dimension, written over its input.

    The scores are a fresh ``(B, H, T, S)`` tensor that nothing else needs; overwriting them
    instead of allocating a second one of that size makes this step about 3x faster on CPU
    (fresh large allocations are paged in on first touch). Backward uses the saved output:
    ``dx = y * (dy - sum(dy * y))``, in torch's fused kernel for it (one pass, one tensor).
    """

    @staticmethod
    def forward(ctx: Any, scores: torch.Tensor) -> torch.Tensor:
        torch.softmax(scores, dim=-1, out=scores)
        ctx.mark_dirty(scores)
        ctx.save_for_backward(scores)
        return scores

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (weights,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: keep the formula differentiable
            return weights * (grad - (grad * weights).sum(dim=-1, keepdim=True))
        return torch.ops.aten._softmax_backward_data(grad, weights, -1, weights.dtype)


def rows_without_keys(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The query rows a boolean ``mask (..., T, S)`` leaves with no key, ``(..., T, 1)``, or
    ``None`` without a mask."""
    if mask is None:
        return None
    return ~mask.any(dim=-1, keepdim=True)


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with its weights for all heads, in torch's ops (differentiable): returns the
    head outputs ``(B, H, T, D)`` and weights ``(B, H, T, S)``.

    Args:
        q: ``(B, H, T, D)``; k and v: ``(B, Hkv, S, D)``, ``H`` a multiple of ``Hkv``.
        mask: boolean, broadcastable to ``(B, H, T, S)``, True = may attend; ``None``.
        scale: multiplies the scores.
        causal: also the causal triangle (then ``mask`` must be ``None`` and ``T <= S``).
        dropout_p: dropout on the weights used for the values' product (the weights returned
            are not dropped).
    """
    n_batch, n_heads, n_queries, d = q.shape
    n_kv, n_keys = k.shape[1], k.shape[2]
    group = n_heads // n_kv
    if causal:
        mask = causal_mask(n_queries, n_keys, device=q.device)  # (T, S)
    # Rows with no key to attend would be NaN after softmax. Let them see every key (so nothing
    # is NaN, in the forward or the backward pass), then zero them.
    empty = None if causal else rows_without_keys(mask)  # a causal row sees key 0 (T <= S)
    if mask is not None and empty is not None:
        mask = mask | empty
    # Scaling q (T x D) is cheaper than scaling the scores (T x S), and leaves q contiguous.
    q_scaled = q if scale == 1.0 else q * scale  # (already scaled by the projection)
    # a group's heads stacked as the rows of one product: no copy of its keys and values
    q_rows = q_scaled if group == 1 else q_scaled.reshape(n_batch, n_kv, group * n_queries, d)
    keys_t = k.transpose(-2, -1)  # (B, Hkv, D, S)
    tracked = torch.is_grad_enabled() and (
        q_rows.requires_grad or keys_t.requires_grad or v.requires_grad
    )
    shape = (n_batch, n_kv, group * n_queries, n_keys)
    n_bytes = math.prod(shape) * q_rows.dtype.itemsize
    if tracked or n_bytes < memory.HUGE_FROM:
        scores = torch.matmul(q_rows, keys_t)  # (B, Hkv, G T, S)
    else:  # large weights on huge pages (about 2x faster to write, see memory.empty)
        scores = memory.empty(shape, dtype=q_rows.dtype, device=q_rows.device)
        torch.matmul(q_rows, keys_t, out=scores)  # (B, Hkv, G T, S)
    if group > 1:  # not a view for autograd: the in-place steps below would make it rebase
        scores = torch.ops.aten._unsafe_view(scores, (n_batch, n_heads, n_queries, n_keys))
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf"))
    if tracked:  # in place, with a backward that needs only the weights
        weights = _SoftmaxInPlace.apply(scores)  # (B, H, T, S), each row sums to 1
    else:  # no graph: the same softmax without the autograd function's cost per call
        weights = torch.softmax(scores, dim=-1, out=scores)
    if empty is not None and bool(empty.any()):
        # out of place under autograd: the in-place softmax saved these weights for backward
        weights = weights.masked_fill(empty, 0.0) if tracked else weights.masked_fill_(empty, 0)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    mixed = dropped if group == 1 else dropped.reshape(n_batch, n_kv, group * n_queries, n_keys)
    head_outputs = torch.matmul(mixed, v).view(n_batch, n_heads, n_queries, d)  # (B, H, T, D)
    return head_outputs, weights


# ------------------------------------------------------------ the CPU backend's one seam
# The probes' own per-block kernels (Clark et al.'s word argmax, the positional probe's offset
# counts) belong to the same optional CPU backend; they are reached here, so that no module
# but this one imports headlab.native.
WordTable = native.WordTable
word_argmax_rows = native.word_argmax_rows
positional_rows = native.positional_rows


def cpu_kernels() -> bool:
    """Whether the native CPU backend is built and loaded here (it then serves CPU tensors)."""
    return native.kernels() is not None


def cpu_kernels_missing() -> str | None:
    """Why the native CPU backend could not be built, or ``None`` when it runs or was turned
    off on purpose (``HEADLAB_NATIVE=0``, a CPU it is not built for): the note a command
    prints once."""
    if native.kernels() is not None or native.by_choice():
        return None
    return native.why_not()
