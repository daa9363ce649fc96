"""Indirect object identification prompts (Wang et al. 2022): the names, templates, places and
objects they are drawn from, and the fixed-seed draw. Plain text, no model: the IOI metric of
pruning (:mod:`headlab.pruning.tasks`) and the patching task (:mod:`headlab.causal.generators`)
both start here."""

from __future__ import annotations

import random
from dataclasses import dataclass

from headlab.errors import InputError

NAMES = (
    "Mary", "John", "Tom", "James", "Sarah", "Anna", "Mike", "David", "Lisa", "Kate",
    "Paul", "Emma", "Alice", "Bob", "Peter", "Jack", "Lucy", "Dan", "Sam", "Max",
    "Ben", "Amy", "Rose", "Jane", "Mark", "Adam", "Ryan", "Laura",
)  # fmt: skip
#: ``{io}``/``{s}``: the names; the subject ``{s}`` is repeated, the prompt ends before the answer
TEMPLATES = (
    "When {a} and {b} went to the {place}, {s} gave a {thing} to",
    "Then, {a} and {b} went to the {place}. {s} gave a {thing} to",
    "After {a} and {b} went to the {place}, {s} gave a {thing} to",
    "While {a} and {b} were working at the {place}, {s} gave a {thing} to",
    "Friends {a} and {b} went to the {place}. {s} gave a {thing} to",
)
PLACES = ("store", "park", "school", "hospital", "office", "station")
THINGS = ("drink", "book", "ring", "letter", "bag", "gift")
#: templates, places and objects only held-out prompts use (a circuit found on the ones above
#: is measured on sentences it never saw: headlab.causal.generators' held-out part)
HELD_OUT_TEMPLATES = (
    "As {a} and {b} walked to the {place}, {s} handed a {thing} to",
    "Once {a} and {b} had reached the {place}, {s} passed a {thing} to",
    "Later, {a} and {b} stayed at the {place}, and {s} offered a {thing} to",
)
HELD_OUT_PLACES = ("library", "market", "garden", "museum")
HELD_OUT_THINGS = ("pen", "card", "cake", "hat")


@dataclass(frozen=True, kw_only=True)
class IoiPrompt:
    text: str
    io: str  # the indirect object, the right answer
    s: str  # the subject, the wrong one


def ioi_prompts(names: list[str], n: int, *, seed: int = 0) -> list[IoiPrompt]:
    """``n`` prompts from :data:`TEMPLATES` with pairs of distinct ``names``, half ABBA and half
    BABA, the same for the same arguments."""
    if len(set(names)) < 2:
        raise InputError(f"IOI prompts need at least 2 distinct names, got {names}")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        io, s = rng.sample(names, 2)
        a, b = (io, s) if i % 2 == 0 else (s, io)  # ABBA, then BABA
        text = TEMPLATES[i % len(TEMPLATES)].format(
            a=a, b=b, s=s, place=rng.choice(PLACES), thing=rng.choice(THINGS)
        )
        out.append(IoiPrompt(text=text, io=io, s=s))
    return out


def single_token_names(tokenizer: object, names: tuple[str, ...] = NAMES) -> list[str]:
    """The names that ``tokenizer`` encodes, after a space, as one token each."""
    return [
        name
        for name in names
        if len(tokenizer(" " + name, add_special_tokens=False)["input_ids"]) == 1  # type: ignore[operator]
    ]
