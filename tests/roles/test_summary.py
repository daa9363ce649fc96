"""What ``headlab roles`` prints of a report: the grid, the stability line, the evidence,
relation and coreference tables, the data used (built without a model)."""

from __future__ import annotations

from typing import Any

from headlab.roles.classify import Thresholds
from headlab.roles.probes.syntactic import RELATION_SET
from headlab.roles.results import CoreferenceResult, HeadRole, RelationRow, RoleReport
from headlab.roles.summary import roles_text
from headlab.text import TextTable


def _head(layer: int, head: int, role: str, **kw: Any) -> HeadRole:
    fields: dict[str, Any] = dict(
        roles=(role,), score=0.5, baseline=0.2, margin=0.3, detail="", stability=0.9, scores={}
    )
    return HeadRole(layer=layer, head=head, role=role, **(fields | kw))


def _report(**kw: Any) -> RoleReport:
    syntactic = RELATION_SET[0]
    heads = [
        _head(0, 0, "positional", stability=0.5),
        _head(
            0,
            1,
            "syntactic",
            detail=syntactic,
            evidence={
                "accuracy": 0.575,
                "interval": [0.553, 0.597],
                "baseline": 0.4,
                "count": 120,
                "q": 0.0123,
            },
        ),
        _head(1, 0, "unclassified", stability=None),
        _head(1, 1, "broad"),
    ]
    relations = [
        RelationRow(
            relation=syntactic,
            direction="dependent_to_head",
            layer=0,
            head=1,
            accuracy=0.575,
            baseline=0.4,
            baseline_offset=-1,
            count=120,
            interval=[0.553, 0.597],
            q=0.0123,
        ),
        RelationRow(  # outside the set and under the least count: not shown
            relation="zz-rare",
            direction="head_to_dependent",
            layer=1,
            head=0,
            accuracy=0.9,
            baseline=0.1,
            baseline_offset=2,
            count=3,
            in_set=False,
        ),
    ]
    coreference = CoreferenceResult(
        layer=1,
        head=1,
        accuracy=0.7,
        count=300,
        baselines={"nearest": 0.55},
        baseline="nearest",
        q=0.001,
    )
    fields: dict[str, Any] = dict(
        model="tiny",
        n_layers=2,
        n_heads=2,
        heads=heads,
        relations=relations,
        coreference=coreference,
        data={"treebank": {"used": 30, "skipped": {"long": 2, "empty": 0}}, "device": "cpu"},
        thresholds=Thresholds(),
        replicates=10,
    )
    return RoleReport(**(fields | kw))


def test_roles_text_shows_the_grid_the_evidence_and_the_data() -> None:
    parts = roles_text(_report())
    tables = [p for p in parts if isinstance(p, TextTable)]
    lines = [p for p in parts if isinstance(p, str)]
    grid, evidence, relations = tables
    assert grid.columns == ("layer", "0", "1")
    assert grid.rows == (("0", "P", "S"), ("1", "·", "B"))
    assert "tiny: primary role" in (grid.title or "") and "bootstrap" in (grid.title or "")
    assert "P positional" in (grid.caption or "") and "pruned" not in (grid.caption or "")
    assert "heads per role: positional 1, syntactic 1, broad 1, unclassified 1" in lines
    assert "1 of 4 heads keep their role in fewer than 80% of 10 bootstrap resamples" in lines[1]
    assert evidence.columns[:4] == ("head", "role", "decided by", "accuracy %")
    assert evidence.rows == (
        ("0.1", "syntactic", RELATION_SET[0], "57.5 [55.3-59.7]", "40.0", "120", "0.0123"),
    )
    assert relations.rows == (
        (RELATION_SET[0], "dep -> head", "0.1", "57.5 [55.3-59.7]", "40.0 (-1)", "120", "0.0123"),
    )
    assert "under 100 arcs)" in (relations.title or "")
    assert lines[2] == (
        "coreference (GAP, 300 pronouns): best head 1.1 70.0% vs baselines nearest 55.0 "
        "(q = 0.001 against nearest)"
    )
    assert lines[3] == "treebank: 30 used; skipped: 2 long"


def test_roles_text_with_folds_and_a_pruned_layer() -> None:
    heads = [
        _head(0, 0, "positional", stable=True),
        _head(0, 1, "unclassified", stable=False),
        _head(1, 0, "broad", stable=True),
    ]
    report = _report(heads=heads, heads_in_layer=(2, 1), folds=5, coreference=None, relations=[])
    parts = roles_text(report)
    grid = parts[0]
    assert isinstance(grid, TextTable)
    assert grid.rows == (("0", "P", "·"), ("1", "B", "-"))
    assert "- pruned away" in (grid.caption or "") and "5 folds" in (grid.title or "")
    assert parts[2] == (
        "1 of 3 heads get their role in fewer than 80% of 5 folds of documents: reported "
        "unclassified (measured_role in the JSON/CSV)."
    )
    assert not any(isinstance(p, str) and p.startswith("coreference") for p in parts)
