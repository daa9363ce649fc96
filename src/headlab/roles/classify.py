"""From scores to roles: each head's dominant role, or "unclassified".

A role is open to a head when its score clears the role's bar: the literature's threshold
(positional 0.9, delimiter 0.5, rare-token 0.5, broad 0.78 of the largest entropy; on causal
models induction 0.3, previous-token 0.5, duplicate-token 0.3) or, for syntactic and
coreference heads, the best baseline plus a margin (10 points) *and* a significant difference
on the same arcs (exact McNemar test, Benjamini-Hochberg q < 0.05). Among the open roles the
dominant one is the one that clears its bar by the largest share of the room left above it,
``(score - bar) / (1 - bar)``. A head that clears no bar is "unclassified": an honest answer
for most heads, not a failure.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headlab.roles.geometry import BROAD_RATIO

ROLES = (
    "positional",
    "delimiter",
    "rare-token",
    "syntactic",
    "coreference",
    "broad",
    "induction",
    "previous-token",
    "duplicate-token",
)
#: roles measured on causal models only (an induction pass over repeated sequences)
CAUSAL_ROLES = ("induction", "previous-token", "duplicate-token")
UNCLASSIFIED = "unclassified"
LETTERS = {
    "positional": "P",
    "delimiter": "D",
    "rare-token": "R",
    "syntactic": "S",
    "coreference": "C",
    "broad": "B",
    "induction": "I",
    "previous-token": "T",
    "duplicate-token": "U",
    UNCLASSIFIED: "·",
}


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    """Bars a score must clear for each role (defaults from the papers named in each probe)."""

    positional: float = 0.9
    delimiter: float = 0.5
    rare_token: float = 0.5
    syntactic_margin: float = 0.10
    coreference_margin: float = 0.10
    broad: float = BROAD_RATIO
    induction: float = 0.3
    #: mean weight on the previous token: most of the head's weight (docs/roles.md)
    previous_token: float = 0.5
    #: mean weight on the earlier occurrence of the same token, on induction's scale
    duplicate_token: float = 0.3
    #: relations with fewer gold arcs than this do not make a head syntactic
    min_relation_count: int = 100
    #: a syntactic or coreference head must also beat its baseline on the same arcs with a
    #: Benjamini-Hochberg q-value below this (exact McNemar test; docs/roles.md)
    significance: float = 0.05
    #: with folds, a head is named only when at least this share of folds gives it its role
    stable: float = 0.8


@dataclass(frozen=True, kw_only=True)
class RoleEvidence:
    """Per role, ``(R+1, L, H)`` tensors: ``score``, ``baseline`` and the ``bar`` it must clear."""

    score: dict[str, torch.Tensor]
    baseline: dict[str, torch.Tensor]
    bar: dict[str, torch.Tensor]

    def excess(self) -> torch.Tensor:
        """``(roles, R+1, L, H)``: how far above its bar each score is, -inf below or missing."""
        rows = []
        for role in ROLES:
            if role not in self.score:
                rows.append(torch.full_like(next(iter(self.score.values())), -torch.inf))
                continue
            s, bar = self.score[role], self.bar[role]
            room = (1.0 - bar).clamp_min(1e-6)
            e = (s - bar) / room
            rows.append(torch.where(torch.isfinite(e) & (s >= bar), e, -torch.inf))
        return torch.stack(rows)

    def dominant(self) -> torch.Tensor:
        """``(R+1, L, H)`` role index into ``ROLES``; ``len(ROLES)`` means unclassified."""
        excess = self.excess()
        best, where = excess.max(0)
        return torch.where(torch.isfinite(best), where, torch.full_like(where, len(ROLES)))


def role_name(index: int) -> str:
    return ROLES[index] if index < len(ROLES) else UNCLASSIFIED
