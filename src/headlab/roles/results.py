"""What ``headlab roles`` measured: per-head results and the stable JSON form."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from headlab.roles.classify import LETTERS, ROLES, Thresholds


@dataclass(frozen=True, kw_only=True)
class HeadRole:
    """One head's result. ``layer`` and ``head`` are 0-based."""

    layer: int
    head: int
    role: str
    roles: tuple[str, ...]
    score: float | None
    baseline: float | None
    margin: float | None
    detail: str
    stability: float | None
    scores: dict[str, float | None]
    #: the head's id in the unpruned model (differs from ``head`` in a folder pruned by headlab)
    original_head: int | None = None


@dataclass(frozen=True, kw_only=True)
class RelationRow:
    """The best head for one relation and direction, against the best fixed offset."""

    relation: str
    direction: str
    layer: int
    head: int
    accuracy: float
    baseline: float
    baseline_offset: int
    count: int


@dataclass(frozen=True, kw_only=True)
class CoreferenceResult:
    """The best coreference head on GAP, and the baselines' accuracies."""

    layer: int
    head: int
    accuracy: float
    count: int
    baselines: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class RoleReport:
    """Everything ``headlab roles`` measured (see :meth:`to_json` for the schema)."""

    model: str
    n_layers: int
    n_heads: int
    heads: list[HeadRole]
    #: heads of each layer, when not ``n_heads`` everywhere (a model pruned layer by layer)
    heads_in_layer: tuple[int, ...] | None = None
    relations: list[RelationRow]
    coreference: CoreferenceResult | None
    data: dict[str, Any]
    thresholds: Thresholds
    replicates: int

    @property
    def layer_heads(self) -> tuple[int, ...]:
        """Heads of each layer."""
        return self.heads_in_layer or (self.n_heads,) * self.n_layers

    def head(self, layer: int, head: int) -> HeadRole:
        counts = self.layer_heads
        if not 0 <= head < counts[layer]:
            raise IndexError(f"layer {layer} has heads 0..{counts[layer] - 1}, not {head}")
        return self.heads[sum(counts[:layer]) + head]

    def role_counts(self) -> dict[str, int]:
        """How many heads have each dominant role (unclassified included)."""
        counts = Counter(h.role for h in self.heads)
        return {role: counts.get(role, 0) for role in (*ROLES, "unclassified")}

    def grid(self) -> list[list[str]]:
        """Role letters, ``layers x heads`` (``-`` where a pruned layer has no such head)."""
        return [
            [LETTERS[self.head(layer, h).role] if h < count else "-" for h in range(self.n_heads)]
            for layer, count in enumerate(self.layer_heads)
        ]

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (schema ``headlab.roles/1``; 0-based layer and head)."""
        return {
            "schema": "headlab.roles/1",
            "model": self.model,
            "layers": self.n_layers,
            "heads_per_layer": self.n_heads,
            "heads_in_layer": list(self.layer_heads),
            "replicates": self.replicates,
            "thresholds": vars(self.thresholds),
            "data": self.data,
            "role_counts": self.role_counts(),
            "heads": [_rounded(vars(h)) for h in self.heads],
            "relations": [_rounded(vars(r)) for r in self.relations],
            "coreference": None if self.coreference is None else _rounded(vars(self.coreference)),
        }


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return None if math.isnan(obj) else round(obj, 4)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v) for v in obj]
    return obj
