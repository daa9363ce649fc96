"""Roles against patching (experiments/agreement.py): the rule that a role never hides what
both measurements say, and the disagreements named in words."""

from __future__ import annotations

import pytest
import torch

from headlab.causal.result import PatchingResult
from headlab.errors import InputError
from headlab.experiments.agreement import induction_agreement


def _patching(effects: list[list[float]], task: str = "induction") -> PatchingResult:
    return PatchingResult(
        model="m",
        task=task,
        method="activation",
        position=None,
        n_prompts=8,
        clean=5.0,
        corrupt=0.5,
        effects=torch.tensor(effects, dtype=torch.float64),
    )


def _roles(rows: list[list[tuple[str, tuple[str, ...], float]]]) -> dict:
    heads = [
        {"layer": la, "head": h, "role": role, "roles": list(roles), "scores": {"induction": s}}
        for la, row in enumerate(rows)
        for h, (role, roles, s) in enumerate(row)
    ]
    return {"model": "m", "heads": heads}


def test_heads_that_act_and_clear_the_bar_must_be_named() -> None:
    roles = _roles(
        [
            [("positional", ("positional", "previous-token"), 0.05), ("sink", ("sink",), 0.0)],
            [("induction", ("induction", "sink"), 0.8), ("sink", ("sink", "induction"), 0.6)],
            [("induction", ("induction",), 0.5), ("unclassified", (), 0.1)],
        ]
    )
    patching = _patching([[0.7, 0.0], [0.4, 0.3], [0.02, 0.15]])
    got = induction_agreement(roles, patching)
    verdicts = {(h.layer, h.head): h.verdict for h in got.heads}
    assert verdicts == {
        (0, 0): "looks like a positional head, acts in the induction task",
        (1, 0): "agree",
        (1, 1): "looks like a sink head, acts in the induction task",
        (2, 0): "looks like an induction head, its output is not needed for the task",
        (2, 1): "looks like no role, acts in the induction task",
    }
    # 1.1 acts and clears the induction bar but is named "sink": the rule fails there alone
    assert not got.agrees and [(h.layer, h.head) for h in got.hidden] == [(1, 1)]
    assert [h.effect for h in got.heads] == sorted((h.effect for h in got.heads), reverse=True)
    roles["heads"][3]["role"] = "induction"
    assert induction_agreement(roles, patching).agrees


def test_other_tasks_and_layouts_are_refused() -> None:
    roles = _roles([[("induction", ("induction",), 0.5)]])
    with pytest.raises(InputError, match="tasks induction, not 'ioi'"):
        induction_agreement(roles, _patching([[0.5]], task="ioi"))
    with pytest.raises(InputError, match="different head layouts"):
        induction_agreement(roles, _patching([[0.5, 0.1]]))


def assert_roles_agree(roles: dict, patching: PatchingResult) -> None:
    """The check every causal real model's test runs: the rule holds, some head is called
    induction by both, and the strongest acting head that clears the bar is named induction;
    every head's two verdicts printed (pytest -s) for docs/roles.md."""
    agreement = induction_agreement(roles, patching)
    for h in agreement.heads:
        print(f"{h.layer}.{h.head} effect {h.effect:+.2f} {h.role} ({h.score}): {h.verdict}")
    assert agreement.agrees, [f"{h.layer}.{h.head}" for h in agreement.hidden]
    assert any(h.verdict == "agree" for h in agreement.heads)
    clearing = [h for h in agreement.heads if h.acts and h.clears]
    assert clearing and clearing[0].looks


def test_the_reports_patching_caption_names_each_disagreement() -> None:
    """``headlab report --patch`` on the induction task: the caption of the patching figure
    says which heads both call induction heads and each disagreement in words."""
    from headlab.report.folder import agreement_text
    from headlab.roles.classify import Thresholds
    from headlab.roles.results import HeadRole, RoleReport

    def head(layer: int, h: int, role: str, roles: tuple[str, ...]) -> HeadRole:
        return HeadRole(
            layer=layer, head=h, role=role, roles=roles, score=None, baseline=None,
            margin=None, detail="", stability=None, scores={"induction": 0.5},
        )  # fmt: skip

    roles = RoleReport(
        model="m",
        n_layers=1,
        n_heads=3,
        heads=[
            head(0, 0, "induction", ("induction", "sink")),
            head(0, 1, "positional", ("positional",)),
            head(0, 2, "induction", ("induction",)),
        ],
        relations=[],
        coreference=None,
        data={},
        thresholds=Thresholds(),
        replicates=0,
    )
    text = agreement_text(roles, _patching([[0.6, 0.3, 0.01]]))
    assert "1 induction head(s) both name (0.0)" in text
    assert "0.1 (+0.30) looks like a positional head, acts in the induction task" in text
    assert "0.2 (+0.01) looks like an induction head, its output is not needed" in text
    assert agreement_text(roles, _patching([[0.6, 0.3, 0.01]], task="ioi")) == ""
