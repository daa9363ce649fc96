"""A key/value cache for incremental (token by token) decoding.

During generation every new token attends to all earlier ones. Their keys and values do not
change, so they are kept here instead of being recomputed: each step projects only the new
tokens and appends their keys and values.
"""

from __future__ import annotations

import torch

from headlab.errors import ShapeError


class KVCache:
    """Keys and values of the positions seen so far, for one attention layer.

    Shape:
        keys, values: ``(B, Hkv, S, D)`` with ``S`` the number of cached positions.

    Example:
        >>> import torch
        >>> from headlab.attention import KVCache, MultiHeadAttention
        >>> mha = MultiHeadAttention(d_model=16, n_heads=4)
        >>> cache = KVCache()
        >>> x = torch.randn(1, 5, 16)
        >>> steps = [mha(x[:, t : t + 1], is_causal=True, kv_cache=cache) for t in range(5)]
        >>> cache.length
        5
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None  # (B, Hkv, S, D)
        self.values: torch.Tensor | None = None  # (B, Hkv, S, D)

    @property
    def length(self) -> int:
        """Number of cached positions ``S``."""
        return 0 if self.keys is None else int(self.keys.shape[2])

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new keys and values ``(B, Hkv, T, D)``; return all of them ``(B, Hkv, S, D)``."""
        if self.keys is None or self.values is None:
            self.keys, self.values = keys, values
            return keys, values
        if keys.shape[:2] != self.keys.shape[:2] or keys.shape[3] != self.keys.shape[3]:
            raise ShapeError(
                f"new keys of shape {tuple(keys.shape)} do not fit the cache "
                f"(B, Hkv, *, D) = {tuple(self.keys.shape[:2])} + (*, {self.keys.shape[3]})"
            )
        self.keys = torch.cat([self.keys, keys], dim=2)  # (B, Hkv, S + T, D)
        self.values = torch.cat([self.values, values], dim=2)  # (B, Hkv, S + T, D)
        return self.keys, self.values

    def reset(self) -> None:
        """Forget every cached position."""
        self.keys = None
        self.values = None
