"""Attention masks: boolean, True means "may attend", except torch's ``key_padding_mask``.

Edge cases, spelled out:

* **Causal with a cache.** With ``P`` cached positions, query ``i`` of the new block sits at
  absolute position ``P + i`` and may attend keys ``0 .. P + i``. The mask is therefore aligned
  to the bottom right of the ``(T, S)`` score matrix, not the top left.
* **Key padding, two spellings.** ``key_mask`` ``(B, S)`` is True for real tokens and False for
  padding, like Hugging Face's ``attention_mask``. ``key_padding_mask`` ``(B, S)`` means what it
  means in ``torch.nn.MultiheadAttention``: True for padding (ignored), False for real tokens, so
  code ported from torch gives torch's answer. Pass one or the other, not both. Padded keys get
  no attention from any query.
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


def _check_bool(name: str, mask: torch.Tensor, meaning: str = "True = may attend") -> None:
    if mask.dtype != torch.bool:
        raise MaskError(f"{name} must be a boolean tensor ({meaning}), got dtype {mask.dtype}")


def key_real_mask(
    *, key_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None
) -> torch.Tensor | None:
    """The keys that are real tokens, ``(B, S)`` True = real, from either spelling, or ``None``.

    ``key_mask`` is True for real tokens (Hugging Face's ``attention_mask``);
    ``key_padding_mask`` is True for padding (``torch.nn.MultiheadAttention``'s). Giving both is
    an error: they could disagree.

    Example:
        >>> key_real_mask(key_mask=None, key_padding_mask=torch.tensor([[False, True]])).tolist()
        [[True, False]]
    """
    if key_mask is not None and key_padding_mask is not None:
        raise MaskError(
            "pass key_mask (True = real token) or key_padding_mask (True = padding), not both"
        )
    if key_mask is not None:
        _check_bool("key_mask", key_mask, "True = real token")
        return key_mask
    if key_padding_mask is not None:
        _check_bool("key_padding_mask", key_padding_mask, "True = padding, as in torch")
        return ~key_padding_mask
    return None


def combine_masks(
    *,
    batch: int,
    n_heads: int,
    n_queries: int,
    n_keys: int,
    attn_mask: torch.Tensor | None,
    key_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool,
    device: torch.device,
) -> torch.Tensor | None:
    """Validate and merge the masks a caller gave into one boolean mask (True = may attend), or
    ``None`` for no mask.

    Shape:
        attn_mask: ``(T, S)``, ``(B, T, S)`` or ``(B, H, T, S)``, True = may attend.
        key_mask: ``(B, S)``, True = real token (Hugging Face's ``attention_mask``).
        key_padding_mask: ``(B, S)``, True = padding (``torch.nn.MultiheadAttention``'s).
        returns: broadcastable to ``(B, H, T, S)``: ``(1|B, 1|H, T, S)``.
    """
    real = key_real_mask(key_mask=key_mask, key_padding_mask=key_padding_mask)
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
    if real is not None:
        name = "key_mask" if key_mask is not None else "key_padding_mask"
        if tuple(real.shape) != (batch, n_keys):
            raise MaskError(
                f"{name} must have shape (B, S)={(batch, n_keys)}, got {tuple(real.shape)}"
            )
        keys = real.to(device)[:, None, None, :]  # (B, 1, 1, S)
        mask = keys if mask is None else mask & keys
    if is_causal:
        causal = causal_mask(n_queries, n_keys, device=device)[None, None]  # (1, 1, T, S)
        mask = causal if mask is None else mask & causal
    return mask
