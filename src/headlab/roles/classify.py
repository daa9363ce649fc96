"""From scores to roles: each head's primary role, or "unclassified".

A role is open to a head when its score clears the role's bar: the literature's threshold
(each role's in :mod:`headlab.roles.registry`: positional 0.9, delimiter 0.5, rare-token 0.5,
broad 0.78 of the largest entropy, sink 0.5; on causal models induction 0.3, previous-token 0.5,
duplicate-token 0.3) or, for syntactic and coreference heads, the best baseline plus a margin
(10 points) *and* a significant difference on the same arcs (exact McNemar test,
Benjamini-Hochberg q < 0.05).

The primary role, by one rule: among the open roles, the one whose score clears its bar by the
largest share of the room left above it, ``(score - bar) / (1 - bar)`` (the bar of a tested
role is its baseline plus the margin, so the margin over the baseline counts too); the order of
:data:`ROLES` never decides. The sink role is the exception: it is the primary role only of a
head that clears no other bar (Clark et al.'s no-op heads), since parking attention on the sink
is what a head does with the attention it does not use, not what it does: a head with strong
prefix matching is an induction head even where it sinks most of its attention on prose. Every
role a head clears stays listed (``HeadRole.roles``). A head that clears no bar is
"unclassified": an honest answer for most heads, not a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headlab.errors import InputError
from headlab.roles import registry
from headlab.roles.registry import UNCLASSIFIED

#: every registered role's name, in order (:mod:`headlab.roles.registry`; a role registered
#: later is in it too)
ROLES = registry.Names()
#: roles measured on causal models only (an induction pass over repeated sequences)
CAUSAL_ROLES = registry.Names(lambda r: r.causal)
#: roles primary only where a head clears no other bar: attention parked on the sink
FALLBACK_ROLES = registry.Names(lambda r: r.fallback)
#: each role's letter, and unclassified's
LETTERS = registry.Letters()


def _bar(name: str) -> float:
    bar = registry.role(name).bar
    if bar is None:
        raise TypeError(f"{name} is a tested role: it has a margin, not a bar")
    return bar


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    """Bars a score must clear for each role. The defaults of the roles with a bar are the
    registry's (:mod:`headlab.roles.registry`, each with the paper behind it); a role
    registered at run time without a field here clears its own :attr:`Role.bar
    <headlab.roles.registry.Role.bar>` (:meth:`bar`)."""

    positional: float = _bar("positional")
    delimiter: float = _bar("delimiter")
    rare_token: float = _bar("rare-token")
    syntactic_margin: float = 0.10
    coreference_margin: float = 0.10
    broad: float = _bar("broad")
    sink: float = _bar("sink")
    induction: float = _bar("induction")
    previous_token: float = _bar("previous-token")
    duplicate_token: float = _bar("duplicate-token")
    #: relations with fewer gold arcs than this do not make a head syntactic
    min_relation_count: int = 100
    #: a syntactic or coreference head must also beat its baseline on the same arcs with a
    #: Benjamini-Hochberg q-value below this (exact McNemar test; docs/roles.md)
    significance: float = 0.05
    #: with folds, a head is named only when at least this share of folds gives it its role
    stable: float = 0.8

    def bar(self, role: str) -> float:
        """The bar of ``role`` (a role with a bar): its field here, else the registry's."""
        found = registry.role(role)
        value = getattr(self, found.threshold, found.bar)
        if value is None:
            raise InputError(f"{role} is a tested role: it has a margin, not a bar")
        return float(value)

    def to_json(self) -> dict[str, Any]:
        """Every field, and the bar of each registered role that has no field."""
        extra = {
            r.threshold: r.bar
            for r in registry.roles()
            if r.bar is not None and not hasattr(self, r.threshold)
        }
        return {**vars(self), **extra}


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
        """``(R+1, L, H)`` the primary role's index into ``ROLES`` (the module's rule: the
        largest excess, a fallback role only where no other role is open); ``len(ROLES)``
        means unclassified."""
        excess = self.excess()
        fallback = torch.tensor([r in FALLBACK_ROLES for r in ROLES])
        shape = (len(ROLES),) + (1,) * (excess.dim() - 1)
        first = excess.masked_fill(fallback.view(shape), -torch.inf)
        best, where = first.max(0)
        last_best, last_where = excess.masked_fill(~fallback.view(shape), -torch.inf).max(0)
        unclassified = torch.full_like(where, len(ROLES))
        return torch.where(
            torch.isfinite(best),
            where,
            torch.where(torch.isfinite(last_best), last_where, unclassified),
        )


def role_name(index: int) -> str:
    return ROLES[index] if index < len(ROLES) else UNCLASSIFIED
