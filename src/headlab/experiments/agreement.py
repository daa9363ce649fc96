"""Attention roles checked against causal evidence: the heads ``headlab roles`` names from
where they look, beside the heads ``headlab patch`` finds carrying the same behaviour.

A role is read from attention patterns; patching measures what a head's output does. The two
answer different questions and can disagree for good reasons (a previous-token head carries an
induction task without being an induction head; a backup head looks the part but its output is
not needed while the others work), so both are shown and the disagreements named, never hidden.

The rule, for a task whose behaviour a role names (``induction`` for the induction task):

- a head **acts** in the task when its patching effect (the share of the clean-corrupt logit
  difference that patching its output restores) is at least :data:`ACTS` (0.1);
- a head **looks** the part when its primary role is the task's role;
- roles and patching **agree** when every head that acts *and* clears the role's bar among its
  roles (``HeadRole.roles``) is named by that role: a role must never hide the evidence that
  both measurements give (the question this check was written for: Gemma 3's induction heads
  called "delimiter" because they also park attention on ``<bos>``).

Every other combination is listed, in words, "looks like X, acts like Y": a head that acts but
is named otherwise (``looks like a previous-token head, acts in the induction task``) and a head
named by the role whose patching effect is below the bar (``looks like an induction head, its
output is not needed for the task``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from headlab.causal.result import PatchingResult
from headlab.errors import InputError

#: the patching effect from which a head counts as acting in a task
ACTS = 0.1
#: the role each built-in task's behaviour is named by
TASK_ROLES = {"induction": "induction"}


@dataclass(frozen=True, kw_only=True)
class HeadEvidence:
    """One head that acts in the task or looks the part, with both measurements.

    Attributes:
        effect: its patching effect on the task.
        role: its primary role; roles: every role whose bar it clears.
        score: its score of the task's role (e.g. prefix matching), ``None`` if unmeasured.
        acts, looks: effect >= :data:`ACTS`; primary role is the task's role.
        clears: the task's role is among ``roles``.
        verdict: ``"agree"``, or what differs, in words.
    """

    layer: int
    head: int
    effect: float
    role: str
    roles: tuple[str, ...]
    score: float | None
    acts: bool
    looks: bool
    clears: bool
    verdict: str


@dataclass(frozen=True, kw_only=True)
class Agreement:
    """Roles against patching on one task of one model."""

    model: str
    task: str
    role: str
    acts: float
    heads: list[HeadEvidence]

    @property
    def hidden(self) -> list[HeadEvidence]:
        """Heads that act and clear the role's bar but are named otherwise (the rule fails)."""
        return [h for h in self.heads if h.acts and h.clears and not h.looks]

    @property
    def agrees(self) -> bool:
        """The module's rule: no head that acts and clears the bar is named otherwise."""
        return not self.hidden

    def disagreements(self) -> list[HeadEvidence]:
        return [h for h in self.heads if h.verdict != "agree"]

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "task": self.task,
            "role": self.role,
            "acts_from": self.acts,
            "agrees": self.agrees,
            "heads": [
                {**vars(h), "roles": list(h.roles), "effect": round(h.effect, 4)}
                for h in self.heads
            ],
        }


def _article(role: str) -> str:
    return "an" if role[:1] in "aeiou" else "a"


def _verdict(role: str, task_role: str, task: str, acts: bool, looks: bool) -> str:
    if acts and looks:
        return "agree"
    if acts:
        seen = "no role" if role == "unclassified" else f"{_article(role)} {role} head"
        return f"looks like {seen}, acts in the {task} task"
    return (
        f"looks like {_article(task_role)} {task_role} head, its output is not needed for the task"
    )


def induction_agreement(
    roles: dict[str, Any], patching: PatchingResult, *, acts: float = ACTS
) -> Agreement:
    """Roles (``headlab roles --json`` of the model) against ``patching`` (``headlab patch``'s
    result on a task of :data:`TASK_ROLES`, heads' outputs patched), by the module's rule.

    Raises:
        InputError: the two are of different models or head layouts, or the task names no role.
    """
    task_role = TASK_ROLES.get(patching.task)
    if task_role is None:
        raise InputError(
            f"roles can be checked against patching on the tasks {', '.join(TASK_ROLES)}, "
            f"not {patching.task!r}"
        )
    if patching.component != "z":
        raise InputError("roles are checked against patching of heads' outputs (component z)")
    by_head = {(h["layer"], h["head"]): h for h in roles["heads"]}
    measured = {(la, h) for la, h in (~patching.effects.isnan()).nonzero().tolist()}
    if set(by_head) != measured:
        raise InputError(
            f"the roles run ({roles.get('model')}) and the patching result ({patching.model}) "
            "are of different head layouts"
        )
    heads = []
    for (layer, h), info in sorted(by_head.items()):
        effect = float(patching.effects[layer, h])
        if math.isnan(effect):
            continue
        role = str(info["role"])
        looks = role == task_role
        does = effect >= acts
        if not (looks or does):
            continue
        score = (info.get("scores") or {}).get(task_role)
        heads.append(
            HeadEvidence(
                layer=layer,
                head=h,
                effect=effect,
                role=role,
                roles=tuple(info.get("roles") or ()),
                score=None if score is None else float(score),
                acts=does,
                looks=looks,
                clears=task_role in (info.get("roles") or ()),
                verdict=_verdict(role, task_role, patching.task, does, looks),
            )
        )
    heads.sort(key=lambda e: -e.effect)
    return Agreement(
        model=patching.model, task=patching.task, role=task_role, acts=acts, heads=heads
    )
