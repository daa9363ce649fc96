"""Positional heads.

For each offset ``k`` in -3..+3, the share of (real, non-special) query tokens whose attention
argmax is the token at ``t + k``; a head is positional when one offset reaches 0.9 (Voita et al.
2019, "Analyzing Multi-Head Self-Attention", section 4.2). Also the mean weight on the previous and
on the next token (Clark et al. 2019, "What Does BERT Look At?", section 3.1).
"""

from __future__ import annotations

import torch

from headlab.roles.bootstrap import Sums, ratio
from headlab.roles.geometry import Geometry

OFFSETS = (-3, -2, -1, 0, 1, 2, 3)


def collect(
    pattern: torch.Tensor, geo: Geometry, start: int = 0, *, argmax: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """pattern rows ``(B, H, t, T)`` (queries ``start..start+t``) -> ``hits (B, H, 7)``,
    ``previous (B, H)``, ``next (B, H)``. ``argmax`` ``(B, H, t)``: each row's argmax, when the
    caller already has it."""
    n_batch, n_heads, n_rows, n_keys = pattern.shape
    query = geo.query[:, None, start : start + n_rows]  # (B, 1, t)
    pos = torch.arange(start, start + n_rows)
    offset = (pattern.argmax(-1) if argmax is None else argmax) - pos  # (B, H, t)
    hits = torch.stack([((offset == k) & query).sum(-1) for k in OFFSETS], dim=-1)

    def at(delta: int) -> torch.Tensor:
        key = pos + delta
        ok = (key >= 0) & (key < n_keys)
        idx = key.clamp(0, n_keys - 1).view(1, 1, n_rows, 1).expand(n_batch, n_heads, n_rows, 1)
        return (pattern.gather(-1, idx).squeeze(-1) * (query & ok)).sum(-1)

    return {"positional.hits": hits.float(), "previous": at(-1), "next": at(1)}


def scores(sums: Sums) -> dict[str, torch.Tensor]:
    """``positional`` (best offset's share), ``positional_offset``, ``previous``, ``next``."""
    queries = sums.get("queries")[:, None, None]  # (R+1, 1, 1)
    shares = ratio(sums.get("positional.hits"), queries[..., None])  # (R+1, L, H, 7)
    best, where = shares.max(-1)
    return {
        "positional": best,
        "positional_offset": torch.tensor(OFFSETS)[where],
        "previous": ratio(sums.get("previous"), queries),
        "next": ratio(sums.get("next"), queries),
    }
