"""Attention math as free functions: the fused path and the explicit path, same results.

``attend`` computes ``softmax(q k^T * scale + mask) v`` for every head (Vaswani et al. 2017,
eq. 1), with grouped key/value heads (Ainslie et al. 2023: query head ``h`` reads key/value head
``h // G``). It takes torch's fused ``scaled_dot_product_attention`` when nothing per-head is
needed, and the explicit path when the attention weights must be returned. ``attend_blocks`` is
that explicit path in one native pass (float32 CPU inference, no mask or the causal one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from headlab import native
from headlab.attention import memory
from headlab.attention.masks import causal_mask

_FAST_PATH_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


@dataclass(frozen=True, kw_only=True)
class AttendResult:
    """What :func:`attend` returns.

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


def repeat_kv(x: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Expand key/value heads to query heads: ``(B, Hkv, S, D) -> (B, Hkv * G, S, D)``.

    Query head ``h`` reads key/value head ``h // G``, so each key/value head is repeated ``G``
    times in place (not tiled).
    """
    if n_groups == 1:
        return x
    return x.repeat_interleave(n_groups, dim=1)  # (B, H, S, D)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    causal_top_left: bool = False,
) -> AttendResult:
    """Scaled dot-product attention for all heads.

    Args:
        q: queries ``(B, H, T, D)``.
        k: keys ``(B, Hkv, S, D)``; ``H`` must be a multiple of ``Hkv``.
        v: values ``(B, Hkv, S, D)``.
        mask: boolean, broadcastable to ``(B, H, T, S)``, True = may attend; ``None`` for none.
        scale: multiplies the scores, usually ``1 / sqrt(D)``.
        dropout_p: dropout on the attention weights (0 in eval).
        need_weights: also return the ``(B, H, T, S)`` weights (explicit path).
        causal_top_left: the caller's mask is exactly the plain causal mask with ``T == S``
            (lets the fused kernel use its own causal mode).

    A query row whose keys are all masked gets zero weights and a zero output.
    """
    n_heads, n_kv_heads = q.shape[1], k.shape[1]
    n_groups = n_heads // n_kv_heads

    # Rows with no key to attend would be NaN after softmax. Let them see every key (so nothing
    # is NaN, in the forward or the backward pass), then zero them.
    empty_rows: torch.Tensor | None = None
    if mask is not None and not causal_top_left:
        has_key = mask.any(dim=-1, keepdim=True)  # (1|B, 1|H, T, 1)
        empty_rows = ~has_key
        mask = mask | empty_rows

    if need_weights:
        reason = "per-head attention weights requested"
        if causal_top_left:
            mask = causal_mask(q.shape[2], k.shape[2], device=q.device)  # (T, S)
        k_full, v_full = repeat_kv(k, n_groups), repeat_kv(v, n_groups)  # (B, H, S, D)
        # Scaling q (T x D) is cheaper than scaling the scores (T x S), and leaves q contiguous.
        q_scaled = q if scale == 1.0 else q * scale  # (already scaled by the projection)
        keys_t = k_full.transpose(-2, -1)  # (B, H, D, S)
        tracked = torch.is_grad_enabled() and (
            q_scaled.requires_grad or keys_t.requires_grad or v_full.requires_grad
        )
        shape = (*q_scaled.shape[:-1], keys_t.shape[-1])
        n_bytes = math.prod(shape) * q_scaled.dtype.itemsize
        if tracked or n_bytes < memory.HUGE_FROM:
            scores = torch.matmul(q_scaled, keys_t)  # (B, H, T, S)
        else:  # large weights on huge pages (about 2x faster to write, see memory.empty)
            scores = memory.empty(shape, dtype=q_scaled.dtype, device=q_scaled.device)
            torch.matmul(q_scaled, keys_t, out=scores)  # (B, H, T, S)
        if mask is not None:
            scores = scores.masked_fill_(~mask, float("-inf"))
        if tracked:  # in place, with a backward that needs only the weights
            weights = _SoftmaxInPlace.apply(scores)  # (B, H, T, S), each row sums to 1
        else:  # no graph: the same softmax without the autograd function's cost per call
            weights = torch.softmax(scores, dim=-1, out=scores)
        if empty_rows is not None:
            weights = weights.masked_fill(empty_rows, 0.0)
        dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        head_outputs = torch.matmul(dropped, v_full)  # (B, H, T, D)
        return AttendResult(head_outputs=head_outputs, weights=weights, why_not_fast_path=reason)

    kwargs = {}
    if n_groups > 1:
        if _FAST_PATH_GQA:
            kwargs["enable_gqa"] = True
        else:  # older torch: expand the key/value heads ourselves
            k, v = repeat_kv(k, n_groups), repeat_kv(v, n_groups)
    head_outputs = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=None if causal_top_left else mask,
        dropout_p=dropout_p,
        is_causal=causal_top_left,
        scale=scale,
        **kwargs,
    )  # (B, H, T, D)
    if empty_rows is not None:
        head_outputs = head_outputs.masked_fill(empty_rows, 0.0)
    return AttendResult(head_outputs=head_outputs, weights=None, why_not_fast_path=None)


def attend_blocks_wins(head_dim: int, n_keys: int) -> bool:
    """Whether :func:`attend_blocks` beats torch's ops for heads of this width over this many
    keys: the native kernels are built with their AVX-512 paths (without them MKL's products
    win, see :func:`headlab.native.fused_scores`), heads are at most 64 wide (at 128, MKL's
    deeper products were as fast), and one head's keys and values fit in half the L2 cache
    (each block of rows reads them again: with 1 MiB of them in a 2 MiB L2, 0.86x torch's
    time; with 2 MiB, 1.3x to 1.6x)."""
    return (
        head_dim <= 64
        and 2 * head_dim * n_keys * 4 <= native.l2_bytes() // 2
        and native.fused_scores()
    )


def attend_blocks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    biases: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
    scale: float,
    causal: bool,
) -> AttendResult:
    """The explicit path of :func:`attend` (weights returned) in one native pass per block of
    query rows (8 with AVX-512): scores, softmax and the values' product while the block is in
    the L1 cache,
    instead of torch's passes over the whole ``(B, H, T, S)`` tensor. No autograd, no dropout,
    float32 on the CPU; masks: none, or causal (bottom-right aligned, ``T <= S``).

    Args:
        q: ``(B, H, T, D)``, k and v: ``(B, Hkv, S, D)``; any strides whose last is 1, so the
            head views of a fused projection are read where they lie.
        biases: the projections' biases of q, k and v (``(H D)``, ``(Hkv D)``, ``(Hkv D)`` or
            ``None``), added as the kernel reads (the projection then skips a pass over its
            output).
        scale: multiplies the scores.
        causal: query ``t`` sees keys ``j <= t + S - T``.

    The head outputs come back as a ``(B, H, T, D)`` view of their concatenation ``(B, T, H D)``
    (already laid out for the output projection).
    """
    b, h, t, d = q.shape
    s = k.shape[2]
    weights = memory.empty((b, h, t, s), dtype=q.dtype, device=q.device)  # (B, H, T, S)
    concat = torch.empty(b, t, h, d, dtype=q.dtype, device=q.device)  # (B, T, H, D)
    heads = concat.transpose(1, 2)  # (B, H, T, D) view
    native.attend_heads(
        q, k, v, scale=scale, causal=causal, biases=biases, weights=weights, out=heads
    )
    return AttendResult(
        head_outputs=heads,
        weights=weights,
        why_not_fast_path="per-head attention weights requested",
    )
