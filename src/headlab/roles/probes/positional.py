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


def collect(pattern: torch.Tensor, geo: Geometry) -> dict[str, torch.Tensor]:
    """pattern ``(B, H, T, T)`` -> ``hits (B, H, 7)``, ``previous (B, H)``, ``next (B, H)``."""
    n_positions = pattern.shape[-1]
    query = geo.query[:, None, :]  # (B, 1, T)
    offset = pattern.argmax(-1) - torch.arange(n_positions)  # (B, H, T)
    hits = torch.stack([((offset == k) & query).sum(-1) for k in OFFSETS], dim=-1)
    previous = (torch.diagonal(pattern, -1, -2, -1) * query[..., 1:]).sum(-1)  # rows 1..T-1
    following = (torch.diagonal(pattern, 1, -2, -1) * query[..., :-1]).sum(-1)  # rows 0..T-2
    return {"positional.hits": hits.float(), "previous": previous, "next": following}


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
