"""Positional heads.

For each offset ``k`` in -3..+3, the share of (real, non-special) query tokens whose attention
argmax is the token at ``t + k``; a head is positional when one offset reaches 0.9 (Voita et al.
2019, "Analyzing Multi-Head Self-Attention", section 4.2). Also the mean weight on the previous and
on the next token (Clark et al. 2019, "What Does BERT Look At?", section 3.1).

On a causal model the later offsets cannot be reached (their weights are 0), so the offsets are
-3..0 and the rows are the tokens that see all four of them (from the fourth token on); the
mean weight on the next token does not exist there.
"""

from __future__ import annotations

import torch

from headlab.attention.blocks import cpu_kernels, positional_rows
from headlab.roles.bootstrap import Sums, ratio
from headlab.roles.geometry import Geometry

OFFSETS = (-3, -2, -1, 0, 1, 2, 3)


def collect(
    pattern: torch.Tensor,
    geo: Geometry,
    start: int = 0,
    *,
    top: torch.Tensor | None = None,
    native: bool = True,
) -> dict[str, torch.Tensor]:
    """pattern rows ``(B, H, t, T)`` (queries ``start..start+t``) -> ``hits (B, H, 7)``,
    ``previous (B, H)``, ``next (B, H)``.

    A row's argmax is at offset ``k`` when the weight on ``t + k`` is the row's largest and no
    nearer-left offset ties it; ``top`` ``(B, H, t)``, each row's largest weight, when the caller
    has it. Only the seven weights near the diagonal are read, never a whole row again. With
    ``native`` (the default), float32 CPU weights and :mod:`headlab.native`'s kernels built,
    one pass in C over each head's rows (``positional_rows``) counts the same."""
    n_batch, n_heads, n_rows, n_keys = pattern.shape
    if top is None:
        top = pattern.amax(-1)  # (B, H, t)
    if native and pattern.device.type == "cpu" and pattern.dtype == torch.float32 and cpu_kernels():
        counted = geo.query.to(torch.uint8)  # (B, T)
        hits, near = positional_rows(pattern, top.float(), counted, start)
        return {"positional.hits": hits, "previous": near[..., 0], "next": near[..., 1]}
    query = geo.query[:, None, start : start + n_rows, None]  # (B, 1, t, 1)
    device = pattern.device
    offsets = torch.tensor(OFFSETS, device=device)
    key = torch.arange(start, start + n_rows, device=device)[:, None] + offsets  # (t, 7)
    ok = (key >= 0) & (key < n_keys)
    idx = key.clamp(0, n_keys - 1).expand(n_batch, n_heads, n_rows, len(OFFSETS))
    near = pattern.gather(-1, idx) * ok  # (B, H, t, 7): weights at t-3 .. t+3
    hit = (near >= top[..., None]) & ok
    hit &= hit.cumsum(-1) == 1  # the first (leftmost) maximum only, as argmax
    hits = (hit & query).sum(2)  # (B, H, 7)
    near = near * query
    return {
        "positional.hits": hits.float(),
        "previous": near[..., OFFSETS.index(-1)].sum(-1),
        "next": near[..., OFFSETS.index(1)].sum(-1),
    }


def scores(sums: Sums) -> dict[str, torch.Tensor]:
    """``positional`` (best offset's share), ``positional_offset``, ``previous``, ``next``.

    A causal model's pass counts its own rows (``positional.queries``: those that see the
    offsets -3..0); no row of it sees the next token, so it has no ``next``."""
    causal = "positional.queries" in sums
    queries = sums.get("positional.queries" if causal else "queries")[:, None, None]
    shares = ratio(sums.get("positional.hits"), queries[..., None])  # (R+1, L, H, 7)
    best, where = shares.max(-1)
    out = {
        "positional": best,
        "positional_offset": torch.tensor(OFFSETS, device=where.device)[where],
        "previous": ratio(sums.get("previous"), queries),
    }
    if not causal:
        out["next"] = ratio(sums.get("next"), queries)
    return out
