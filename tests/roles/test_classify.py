"""The primary role's one rule (roles/classify.py): the largest excess over a role's bar, never
the order of the roles; the sink only where nothing else clears its bar; every cleared role
listed, the primary one first."""

from __future__ import annotations

import torch

from headlab.roles.classify import FALLBACK_ROLES, ROLES, RoleEvidence, role_name

#: the heads of the fixture, in order (one row, one layer)
HEADS = (
    "sinks on prose and matches prefixes",  # sink 0.95, induction 0.87: induction
    "only sinks",  # sink 0.97: sink
    "nothing clears a bar",  # unclassified
    "induction just above its bar, sink far above",  # induction 0.31, sink 0.99: induction
    "punctuation and the sink",  # delimiter 0.6, sink 0.9: delimiter
    "two non-sink roles",  # positional 0.95 ((0.95-0.9)/0.1 = 0.5), induction 0.79 (0.7): induction
)


def _evidence() -> RoleEvidence:
    n = len(HEADS)
    values = {role: torch.zeros(1, 1, n, dtype=torch.float64) for role in ROLES}
    bars = {
        "positional": 0.9,
        "delimiter": 0.5,
        "rare-token": 0.5,
        "broad": 0.78,
        "sink": 0.5,
        "induction": 0.3,
        "previous-token": 0.5,
        "duplicate-token": 0.3,
        "syntactic": 0.4,
        "coreference": 0.6,
    }
    set_ = {
        ("sink", 0): 0.95, ("induction", 0): 0.87,
        ("sink", 1): 0.97,
        ("sink", 2): 0.2,
        ("induction", 3): 0.31, ("sink", 3): 0.99,
        ("delimiter", 4): 0.6, ("sink", 4): 0.9,
        ("positional", 5): 0.95, ("induction", 5): 0.79,
    }  # fmt: skip
    for (role, head), v in set_.items():
        values[role][0, 0, head] = v
    bar = {r: torch.full((1, 1, n), bars[r], dtype=torch.float64) for r in ROLES}
    return RoleEvidence(score=values, baseline=dict(bar), bar=bar)


def test_the_sink_is_primary_only_where_nothing_else_clears() -> None:
    primary = [role_name(int(i)) for i in _evidence().dominant()[0, 0]]
    assert FALLBACK_ROLES == ("sink",)
    assert primary == [
        "induction",
        "sink",
        "unclassified",
        "induction",
        "delimiter",
        "induction",
    ]
