"""Broad heads: attention spread thin.

The entropy ``-sum_j p_j ln p_j`` of each query's attention row, averaged over real non-special
tokens (Clark et al. 2019, section 3.3, who call heads above about 3.8 nats on 128-token inputs
broad). Because short sentences cannot reach 3.8 nats, the role is decided on the ratio of the
entropy to its maximum ``ln(visible keys)``, with the threshold 3.8 / ln 128 = 0.78; the entropy
in nats is reported too.
"""

from __future__ import annotations

import torch

from headlab.roles.bootstrap import Sums, ratio
from headlab.roles.geometry import Geometry


def collect(
    pattern: torch.Tensor, geo: Geometry, start: int = 0, *, entropy: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """pattern rows ``(B, H, t, T)`` -> entropy and entropy-ratio sums ``(B, H)``.

    ``entropy`` ``(B, H, t)``, when the caller has it (from the log-partition function), saves
    computing it from the weights."""
    rows = slice(start, start + pattern.shape[2])
    if entropy is None:
        entropy = -torch.xlogy(pattern, pattern).sum(-1)  # (B, H, t)
    query = geo.query[:, None, rows].float()
    log_visible = geo.log_visible[:, rows]
    can = (geo.query[:, rows] & (log_visible > 0))[:, None, :].float()
    rel = entropy / log_visible.clamp_min(1e-6)[:, None, :]
    return {"broad.entropy": (entropy * query).sum(-1), "broad.ratio": (rel * can).sum(-1)}


def scores(sums: Sums) -> dict[str, torch.Tensor]:
    """``broad`` (entropy / max entropy) and ``entropy`` in nats, ``(R+1, L, H)``."""
    queries = sums.get("queries")[:, None, None]
    rows = sums.get("broad.rows")[:, None, None]
    return {
        "broad": ratio(sums.get("broad.ratio"), rows),
        "entropy": ratio(sums.get("broad.entropy"), queries),
    }
