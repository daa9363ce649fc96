"""Whole patterns of chosen heads and rows (:class:`~headlab.models.HeadCapture`), and
:class:`~headlab.attention.MultiHeadAttention`'s explicit, differentiable path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from headlab.attention import memory
from headlab.attention.blocks.rules import (
    _mask_scores,
    _zero_rows,
)
from headlab.attention.masks import causal_mask
from headlab.errors import InputError


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
    dtype: torch.dtype | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """``softmax(q k^T * scaling + mask)`` for the chosen heads and query rows, in float32
    (float64 for a float64 model); with ``softcap`` (Gemma 2's logit soft-capping) the scaled
    scores become ``softcap * tanh(scores / softcap)`` before the mask, as in the model's eager
    attention.

    Args:
        q: ``(B, H, T, D)``; k: ``(B, Hkv, S, D)``, ``H`` a multiple of ``Hkv``.
        mask: bool (True = attend) or additive float, broadcastable to ``(B, H, T, S)``.
        causal: bottom-right aligned causal triangle, combined with ``mask``.
        heads: query heads to compute (default all).
        rows: ``(start, stop)``, only those query positions (block-wise statistics never hold
            a whole ``T x S`` pattern).
        dtype: precision of the product ``q k^T`` and of the softmax (at least float32):
            default float32, or float64 for float64 queries.

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
    if dtype is None:
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    out_dtype = torch.float64 if dtype == torch.float64 else torch.float32
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
    scores = scores.to(out_dtype) if scores.dtype != out_dtype else scores
    scores.mul_(scaling)
    if softcap is not None:  # Gemma 2: cap * tanh(scores / cap), before any mask
        scores.div_(softcap).tanh_().mul_(softcap)
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
