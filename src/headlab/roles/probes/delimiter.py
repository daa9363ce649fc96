"""Delimiter heads: attention parked on [CLS], [SEP] and punctuation.

Mean attention mass, over real non-special query tokens, on the [CLS] token, on the other special
tokens ([SEP], EOS, BOS) and on punctuation. Clark et al. (2019, section 3.2) found that more than
half of BERT-base's attention in layers 6-10 goes to [SEP], and read such attention as a no-op.
"""

from __future__ import annotations

import torch

from headlab.roles.bootstrap import Sums, ratio
from headlab.roles.geometry import Geometry


def columns(geo: Geometry) -> torch.Tensor:
    """``(B, T, 3)``: 1.0 on the [CLS], other special and punctuation tokens."""
    return torch.stack([geo.cls, geo.sep, geo.punct], dim=-1)


def collect(
    pattern: torch.Tensor, geo: Geometry, start: int = 0, *, mass: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """pattern rows ``(B, H, t, T)`` -> mass sums ``(B, H)`` on ``cls``, ``sep``, ``punct``.

    ``mass`` ``(B, H, t, 3)``: each row's weight on :func:`columns`, when the caller has it
    (the attention's product with its values can carry it)."""
    query = geo.query[:, None, start : start + pattern.shape[2]].float()  # (B, 1, t)
    if mass is None:
        mass = pattern @ columns(geo)[:, None, : pattern.shape[-1]]  # (B, H, t, 3)
    total = (mass * query[..., None]).sum(2)  # (B, H, 3)
    return {f"delimiter.{name}": total[..., i] for i, name in enumerate(("cls", "sep", "punct"))}


def scores(sums: Sums) -> dict[str, torch.Tensor]:
    """``delimiter`` (all three together) and ``cls``, ``sep``, ``punct`` ``(R+1, L, H)``."""
    queries = sums.get("queries")[:, None, None]
    parts = {
        name: ratio(sums.get(f"delimiter.{name}"), queries) for name in ("cls", "sep", "punct")
    }
    return {"delimiter": parts["cls"] + parts["sep"] + parts["punct"], **parts}
