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
