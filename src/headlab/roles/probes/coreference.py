"""Coreference heads, on GAP (Webster et al. 2018).

For each pronoun with exactly one correct candidate name, a head is right when the pronoun's
word-level attention to the correct name is higher than to the other candidate (a name of several
words counts by its most-attended word). Clark et al. (2019, section 4.2) score heads this way on
CoNLL-2012 and find one at 65% against 27% for always choosing the nearest mention. Baselines:
the candidate nearest the pronoun (in characters), and the first candidate in the text.
"""

from __future__ import annotations

import torch

from headlab.roles.bootstrap import Sums, ratio
from headlab.roles.geometry import Geometry

BASELINES = ("nearest", "first")


def pronoun_row(pattern: torch.Tensor, geo: Geometry, pronoun: torch.Tensor) -> torch.Tensor:
    """The pronoun's word-level attention ``(B, H, W)`` from a full pattern ``(B, H, T, T)``."""
    batch = torch.arange(pronoun.shape[0], device=pronoun.device)
    rows = geo.from_words[batch, pronoun]  # (B, T)
    seen = (rows[:, None, None, :] @ pattern).squeeze(2)  # (B, H, T)
    return to_word_row(seen, geo)


def to_word_row(seen: torch.Tensor, geo: Geometry) -> torch.Tensor:
    """Token-level attention ``(B, H, T)`` summed into words ``(B, H, W)``."""
    return (seen[:, :, None, :] @ geo.to_words[:, None]).squeeze(2)


def collect(row: torch.Tensor, candidates: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """Correct choices ``(B, H)``.

    row ``(B, H, W)``: the pronoun's word-level attention (:func:`pronoun_row`); candidates
    ``(B, 2, W)`` bool word masks of names A and B; answer ``(B,)`` 0 or 1.
    """
    masked = row[:, :, None, :].masked_fill(~candidates[:, None], -1.0)  # (B, H, 2, W)
    best = masked.max(-1).values  # (B, H, 2)
    right = best.gather(2, answer[:, None, None].expand(-1, best.shape[1], 1)).squeeze(2)
    wrong = best.gather(2, (1 - answer)[:, None, None].expand(-1, best.shape[1], 1)).squeeze(2)
    return (right > wrong).float()


def scores(sums: Sums) -> dict[str, torch.Tensor]:
    """``coreference`` accuracy ``(R+1, L, H)`` and each baseline's accuracy ``(R+1,)``."""
    n = sums.get("coref.examples")
    out = {"coreference": ratio(sums.get("coref.hits"), n[:, None, None])}
    for name in BASELINES:
        out[f"coref_{name}"] = ratio(sums.get(f"coref.{name}"), n)
    return out
