"""A head card's one-line verdict, written from its numbers by the rules of
:data:`VERDICT_RULES` (:mod:`headlab.experiments.cards` builds the cards).

Where attention and causal evidence disagree, the verdict says both: a head whose roles run
names one role and which carries a task whose heads act as another (the induction task's
carriers, patched at the last position, act as induction heads) "looks like a delimiter head,
acts like an induction head".
"""

from __future__ import annotations

from typing import Any

from headlab.text import Part, table

#: a task's patching effect (share of its logit difference) that counts as carrying it
CARRIES = 0.1
#: |direct logit attribution| that counts as writing the answer, as a share of the task's largest
DIRECT = 0.3
#: a copying score at least this copies what the head attends to (at most minus this: suppresses)
COPIES = 0.5
#: a sender named as what the head reads: composition at least this many times the baseline
COMPOSES = 2.0
#: the role a task's carriers act as, where the task has one
TASK_ROLES = {"induction": "induction"}
#: the IOI classes of ``headlab circuit`` that name what a head does (from its DLA)
CAUSAL_CLASSES = ("name mover", "negative name mover")
#: the rules, in the order the verdict says them
VERDICT_RULES = [
    "role: the head's role in the roles run (unclassified: none), with its score against its "
    "bar and, with folds, how many folds agree",
    f"carries: each built-in task whose activation-patching effect is >= {CARRIES} (as a share "
    "of the task's logit difference), largest first",
    "acts like: its IOI class as headlab circuit names a circuit's heads, where that class "
    "rests on its direct effect (name mover: positive DLA >= 0.1 of the largest, attends to the "
    "indirect object and copies it; negative name mover: the same attention, negative DLA); "
    "else, patched at the last position, a carried task's role (the induction task: an "
    "induction head); when the roles run names another role, the verdict says both: 'looks "
    "like a R head, acts like a T head'. Patched at every position, a task's carriers include "
    "the heads that feed its role's heads (the previous-token heads of induction): no role is "
    "inferred",
    f"writes: |direct logit attribution| >= {DIRECT} of the task's largest head: 'writes the "
    "answer directly' (positive) or 'pushes the answer down directly' (negative)",
    f"copies: copying score >= {COPIES} ('copies what it attends to'), <= -{COPIES} "
    "('suppresses what it attends to')",
    f"reads: its strongest K-composition sender, when >= {COMPOSES} x the random baseline, with "
    "that sender's role",
    "unexplained: none of the above",
]


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def _role(card: dict[str, Any] | None) -> str | None:
    looks = None if card is None else card.get("looks")
    role = None if looks is None else looks.get("role")
    return None if role in (None, "unclassified") else str(role)


def _role_phrase(looks: dict[str, Any], folds: int) -> str:
    numbers = []
    if looks.get("score") is not None and looks.get("baseline") is not None:
        numbers.append(f"{looks['score']:.2f} against {looks['baseline']:.2f}")
    if folds and looks.get("fold_agreement") is not None:
        numbers.append(f"{round(looks['fold_agreement'] * folds)}/{folds} folds")
    return f" ({', '.join(numbers)})" if numbers else ""


def _clauses(
    card: dict[str, Any], by_id: dict[str, dict[str, Any]], largest_dla: dict[str, float]
) -> tuple[list[str], list[tuple[str, float]]]:
    """The verdict's clauses after its first phrase, and the tasks the head carries."""
    patching = card["does"]["patching"]
    carried = sorted(
        ((t, e) for t, e in patching.items() if e is not None and e >= CARRIES),
        key=lambda item: -item[1],
    )
    clauses = [f"carries {e:.0%} of the {t} task" for t, e in carried]
    writes = card["writes"]
    for task, value in writes["dla"].items():
        top = largest_dla.get(task, 0.0)
        if value is None or top <= 0 or abs(value) < DIRECT * top:
            continue
        how = "writes the" if value > 0 else "pushes the"
        tail = "directly" if value > 0 else "down directly"
        clauses.append(f"{how} {task} answer {tail} (DLA {value:+.3g})")
    copying = writes["copying"]
    if copying is not None and copying >= COPIES:
        clauses.append(f"copies what it attends to ({copying:.2f})")
    elif copying is not None and copying <= -COPIES:
        clauses.append(f"suppresses what it attends to ({copying:.2f})")
    reads = card.get("reads") or {}
    keys = reads.get("k") or []
    if keys and keys[0]["x_baseline"] >= COMPOSES:
        sender = keys[0]["head"]
        role = _role(by_id.get(sender))
        who = f" ({_a(role)} head)" if role else ""
        clauses.append(f"reads its keys from {sender}{who}, {keys[0]['x_baseline']:.1f}x baseline")
    return clauses, carried


def verdict(
    card: dict[str, Any],
    by_id: dict[str, dict[str, Any]],
    *,
    folds: int = 0,
    largest_dla: dict[str, float] | None = None,
    position: str = "last",
) -> str:
    """One line from ``card``'s numbers by :data:`VERDICT_RULES`; ``by_id``: every card by
    ``"L.H"`` (for a sender's role), ``folds``: the roles run's, ``largest_dla``: each task's
    largest |direct logit attribution|, ``position``: where the heads were patched (``"last"``
    or ``"all"``)."""
    clauses, carried = _clauses(card, by_id, largest_dla or {})
    role = _role(card)
    ioi_class = (card["does"].get("ioi_class") or {}).get("class")
    acts = ioi_class if ioi_class in CAUSAL_CLASSES else None
    if acts is None and position == "last":  # at every position, a role's feeders carry too
        acts = next((TASK_ROLES[t] for t, _ in carried if t in TASK_ROLES), None)
    looks = card.get("looks") or {}
    if role and acts and role != acts:
        first = f"looks like {_a(role)} head{_role_phrase(looks, folds)}, acts like {_a(acts)} head"
    elif role:
        first = f"{role} head{_role_phrase(looks, folds)}"
    elif acts:
        named = "its attention names no role" if "role" in looks else "no roles run"
        first = f"acts like {_a(acts)} head ({named})"
    elif clauses:
        first = "no attention role" if "role" in looks else "no roles run"
    else:
        return "unexplained: no attention role, no effect or weight pattern past the rules' bars"
    return f"{first}: {', '.join(clauses)}" if clauses else first


def cards_text(data: dict[str, Any]) -> list[Part]:
    """What ``headlab cards`` prints from its JSON: a line per part left out, and a table of
    every head: its role, each task's patching effect, copying, what it promotes, its verdict."""
    tasks = list(data["settings"]["tasks"]) if "patch" not in data["skipped"] else []
    rows = []
    for card in data["cards"]:
        role = _role(card) or ("unclassified" if "role" in (card["looks"] or {}) else "-")
        effects = [card["does"]["patching"].get(t) for t in tasks]
        copying = card["writes"]["copying"]
        promoted = card["writes"]["promoted"] or []
        rows.append(
            [
                card["id"],
                role,
                *("" if e is None else f"{e:+.2f}" for e in effects),
                "" if copying is None else f"{copying:+.2f}",
                " ".join(repr(p["token"]) for p in promoted[:3]),
                card["verdict"],
            ]
        )
    parts: list[Part] = [
        f"{data['model']}: {len(data['cards'])} heads; roles from {data['roles_from'] or 'none'}"
    ]
    parts += [f"left out: {part} ({why})" for part, why in data["skipped"].items()]
    parts.append(
        table(
            ["head", "role", *tasks, "copying", "promotes", "verdict"],
            rows,
            right=range(2, 3 + len(tasks)),
            fold=[4 + len(tasks)],
        )
    )
    return parts
