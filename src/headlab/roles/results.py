"""What ``headlab roles`` measured: per-head results and the stable JSON form."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlab.errors import DataFormatError, InputError
from headlab.roles.classify import LETTERS, ROLES, Thresholds
from headlab.roles.probes.syntactic import RELATION_SET

#: the JSON of ``headlab roles --json``: its schema, written and read here alone. Version 2:
#: the attention sink is its own score and role, and "delimiter" is punctuation alone
SCHEMA = "headlab.roles/2"
#: what the earlier schema was, and why it is not read
_OLDER = {"headlab.roles/1": "delimiter then counted the attention sink ([CLS], [SEP], BOS)"}


def read_roles_json(
    path: str | Path, what: str = "roles file", *, heads: bool = True
) -> dict[str, Any]:
    """The JSON of ``headlab roles --json`` in ``path``, checked to be one: its schema, and
    with ``heads`` its model and heads (a relation table needs neither).

    Raises:
        InputError: the file cannot be read.
        DataFormatError: not JSON, or not the :data:`SCHEMA` (an older one says so).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataFormatError(f"{path}: not JSON ({exc})") from None
    if isinstance(data, dict) and data.get("schema") in _OLDER:
        raise DataFormatError(
            f"{path}: made by an older headlab ({data['schema']}: {_OLDER[data['schema']]}); "
            "measure it again with `headlab roles --json`"
        )
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise DataFormatError(f"{path}: expected the JSON of `headlab roles --json` ({SCHEMA})")
    if heads and (
        not isinstance(data.get("heads"), list) or not isinstance(data.get("model"), str)
    ):
        raise DataFormatError(f"{path}: a roles file needs its model and its heads")
    return data


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
    #: the role the whole data gives; ``role`` is "unclassified" when it did not replicate
    measured_role: str = ""
    #: with folds: whether at least ``Thresholds.stable`` of the folds agree (else ``None``)
    stable: bool | None = None
    #: share of folds whose role is ``measured_role`` (``None`` without folds)
    fold_agreement: float | None = None
    #: share of bootstrap resamples whose role is ``measured_role`` (``None`` without them)
    bootstrap_stability: float | None = None
    #: what decided the role: probe, relation, accuracy, Wilson interval over documents and its
    #: design effect, baseline, p, q
    evidence: dict[str, Any] | None = None


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
    #: 95% Wilson intervals of ``accuracy`` and ``baseline`` over documents: on the effective
    #: count of arcs, ``count / design_effect`` (1 without bootstrap resamples)
    interval: list[float | None] | None = None
    baseline_interval: list[float | None] | None = None
    design_effect: float | None = None
    #: exact McNemar p-value against the baseline on the same arcs, and its BH q-value (``None``
    #: outside the family: a relation outside the set or with too few arcs)
    p: float | None = None
    q: float | None = None
    #: whether the relation is in the a-priori set that decides syntactic roles
    in_set: bool = True


@dataclass(frozen=True, kw_only=True)
class CoreferenceResult:
    """The best coreference head on GAP, and the baselines' accuracies."""

    layer: int
    head: int
    accuracy: float
    count: int
    baselines: dict[str, float]
    interval: list[float | None] | None = None
    design_effect: float | None = None
    #: the stronger baseline, which the head is tested against
    baseline: str = ""
    baseline_interval: list[float | None] | None = None
    p: float | None = None
    q: float | None = None


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
    #: folds of documents the roles were also assigned on (0: none)
    folds: int = 0

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
        """How many heads have each primary role (unclassified included)."""
        counts = Counter(h.role for h in self.heads)
        return {role: counts.get(role, 0) for role in (*ROLES, "unclassified")}

    def grid(self) -> list[list[str]]:
        """Role letters, ``layers x heads`` (``-`` where a pruned layer has no such head)."""
        return [
            [LETTERS[self.head(layer, h).role] if h < count else "-" for h in range(self.n_heads)]
            for layer, count in enumerate(self.layer_heads)
        ]

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (schema :data:`SCHEMA`; 0-based layer and head)."""
        return {
            "schema": SCHEMA,
            "model": self.model,
            "layers": self.n_layers,
            "heads_per_layer": self.n_heads,
            "heads_in_layer": list(self.layer_heads),
            "replicates": self.replicates,
            "folds": self.folds,
            "relation_set": list(RELATION_SET),
            "correction": "benjamini-hochberg",
            "thresholds": self.thresholds.to_json(),
            "data": self.data,
            "role_counts": self.role_counts(),
            "unstable": sum(1 for h in self.heads if h.stable is False),
            "heads": [_rounded(vars(h)) for h in self.heads],
            "relations": [_rounded(vars(r)) for r in self.relations],
            "coreference": None if self.coreference is None else _rounded(vars(self.coreference)),
        }


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        if math.isnan(obj):
            return None
        return float(f"{obj:.3g}") if obj and abs(obj) < 1e-4 else round(obj, 4)  # p-values
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v) for v in obj]
    return obj


def heads_csv(report: Any) -> str:
    """One row per head: position, role, score, baseline, margin, stability, every score."""
    names = sorted({k for h in report.heads for k in h.scores})
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(
        [
            *("layer", "head", "role", "measured_role", "roles", "detail"),
            *("score", "score_low", "score_high", "baseline", "margin", "p", "q"),
            *("count", "design_effect"),
            *("stability", "stable", "fold_agreement", "bootstrap_stability"),
            *names,
        ]
    )
    for h in report.heads:
        ev = h.evidence or {}
        low, high = ev.get("interval") or (None, None)
        stable = "" if h.stable is None else str(h.stable).lower()
        writer.writerow(
            [h.layer, h.head, h.role, h.measured_role, "+".join(h.roles), h.detail]
            + [fmt4(v) for v in (h.score, low, high, h.baseline, h.margin)]
            + [fmt_p(ev.get("p")), fmt_p(ev.get("q"))]
            + [str(ev.get("count", "")), fmt4(ev.get("design_effect"))]
            + [fmt4(h.stability), stable, fmt4(h.fold_agreement), fmt4(h.bootstrap_stability)]
            + [fmt4(h.scores.get(n)) for n in names]
        )
    return buf.getvalue()


def fmt4(v: float | None) -> str:
    """A score as the CSV and the tables write it: 4 decimals, blank for none."""
    return "" if v is None else f"{v:.4f}"


def fmt_p(v: float | None) -> str:
    """A p- or q-value: 3 significant digits, blank for none."""
    return "" if v is None else f"{v:.3g}"
