"""Attention masks: one boolean convention, True means "may attend".

Edge cases, spelled out:

* **Causal with a cache.** With ``P`` cached positions, query ``i`` of the new block sits at
  absolute position ``P + i`` and may attend keys ``0 .. P + i``. The mask is therefore aligned
  to the bottom right of the ``(T, S)`` score matrix, not the top left.
* **Key padding.** ``key_padding_mask`` ``(B, S)`` is True for real tokens and False for padding,
  like Hugging Face's ``attention_mask``. Padded keys get no attention from any query.
* **A query with no key left.** When masks leave a query row with no key at all (a padded query
  under a causal mask, say), softmax is undefined. headlab defines that row's attention weights
  and output as zeros, never NaN, and propagates zero gradients through it: the one convention
  of the attention engine, :mod:`headlab.attention.blocks`.
"""

from __future__ import annotations

import torch

from headlab.errors import MaskError


def causal_rows(
    start: int,
    stop: int,
    n_queries: int,
    n_keys: int,
    *,
    first_key: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The causal rule, bottom-right aligned, for query rows ``start:stop`` of ``T = n_queries``
    over keys ``first_key:S`` (``S = n_keys``): True where query ``i`` may attend key ``j``,
    that is ``j <= i + S - T`` (query ``i`` sits at absolute position ``i + S - T``). The only
    place headlab writes this rule; :func:`causal_mask` is its whole matrix.

    Shape:
        returns ``(stop - start, S - first_key)``.
    """
    q_pos = torch.arange(start, stop, device=device)[:, None] + (n_keys - n_queries)  # (t, 1)
    k_pos = torch.arange(first_key, n_keys, device=device)[None, :]  # (1, s)
    return k_pos <= q_pos  # (t, s)


def causal_keys(stop: int, n_queries: int, n_keys: int) -> int:
    """How many keys (``0:n``) query rows before ``stop`` can see under :func:`causal_rows`."""
    return max(0, min(n_keys, stop + n_keys - n_queries))


def causal_mask(
    n_queries: int, n_keys: int, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """Boolean causal mask aligned to the last query, True where a query may attend a key.

    Shape:
        returns ``(T, S)`` with ``T = n_queries``, ``S = n_keys``; queries sit at absolute
        positions ``S - T .. S - 1``.

    Example:
        >>> causal_mask(2, 3).tolist()
        [[True, True, False], [True, True, True]]
    """
    if n_queries > n_keys:
        raise MaskError(f"a causal mask needs n_keys >= n_queries, got T={n_queries}, S={n_keys}")
    return causal_rows(0, n_queries, n_queries, n_keys, device=device)  # (T, S)


def _check_bool(name: str, mask: torch.Tensor) -> None:
    if mask.dtype != torch.bool:
        raise MaskError(
            f"{name} must be a boolean tensor (True = may attend), got dtype {mask.dtype}"
        )


def combine_masks(
    *,
    batch: int,
    n_heads: int,
    n_queries: int,
    n_keys: int,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    is_causal: bool,
    device: torch.device,
) -> torch.Tensor | None:
    """Validate and merge the masks a caller gave into one boolean mask, or ``None`` for no mask.

    Shape:
        attn_mask: ``(T, S)``, ``(B, T, S)`` or ``(B, H, T, S)``.
        key_padding_mask: ``(B, S)``.
        returns: broadcastable to ``(B, H, T, S)``: ``(1|B, 1|H, T, S)``.
    """
    mask: torch.Tensor | None = None
    if attn_mask is not None:
        _check_bool("attn_mask", attn_mask)
        t_s = (n_queries, n_keys)
        if attn_mask.dim() == 2 and tuple(attn_mask.shape) == t_s:
            mask = attn_mask[None, None]  # (1, 1, T, S)
        elif attn_mask.dim() == 3 and tuple(attn_mask.shape) == (batch, *t_s):
            mask = attn_mask[:, None]  # (B, 1, T, S)
        elif attn_mask.dim() == 4 and tuple(attn_mask.shape) == (batch, n_heads, *t_s):
            mask = attn_mask  # (B, H, T, S)
        else:
            raise MaskError(
                f"attn_mask must have shape (T, S)={t_s}, (B, T, S)={(batch, *t_s)} or "
                f"(B, H, T, S)={(batch, n_heads, *t_s)}, got {tuple(attn_mask.shape)}"
            )
        mask = mask.to(device)
    if key_padding_mask is not None:
        _check_bool("key_padding_mask", key_padding_mask)
        if tuple(key_padding_mask.shape) != (batch, n_keys):
            raise MaskError(
                f"key_padding_mask must have shape (B, S)={(batch, n_keys)}, "
                f"got {tuple(key_padding_mask.shape)}"
            )
        padding = key_padding_mask.to(device)[:, None, None, :]  # (B, 1, 1, S)
        mask = padding if mask is None else mask & padding
    if is_causal:
        causal = causal_mask(n_queries, n_keys, device=device)[None, None]  # (1, 1, T, S)
        mask = causal if mask is None else mask & causal
    return mask
