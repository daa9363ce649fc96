"""Attention math as free functions: the fused path and the explicit path, same results.

``attend`` computes ``softmax(q k^T * scale + mask) v`` for every head (Vaswani et al. 2017,
eq. 1), with grouped key/value heads (Ainslie et al. 2023: query head ``h`` reads key/value head
``h // G``). It takes torch's fused ``scaled_dot_product_attention`` when nothing per-head is
needed, and the explicit path when the attention weights must be returned: the attention engine's
:func:`~headlab.attention.blocks.explicit_attention`, the one place (with the rest of
:mod:`headlab.attention.blocks`) where headlab computes attention weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headlab.attention.blocks import AttendResult, explicit_attention, rows_without_keys

__all__ = ["AttendResult", "attend", "repeat_kv"]

_FAST_PATH_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


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

    if need_weights:
        head_outputs, weights = explicit_attention(
            q, k, v, mask=mask, scale=scale, causal=causal_top_left, dropout_p=dropout_p
        )
        return AttendResult(
            head_outputs=head_outputs,
            weights=weights,
            why_not_fast_path="per-head attention weights requested",
        )

    # Rows with no key to attend would be NaN in the fused kernel on some versions of torch. Let
    # them see every key, then zero their output (the engine's convention, see blocks.py).
    empty_rows = None if causal_top_left else rows_without_keys(mask)
    if mask is not None and empty_rows is not None:
        mask = mask | empty_rows

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
