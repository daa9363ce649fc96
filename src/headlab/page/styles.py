"""How a role looks on every page and figure: its colour and its letter (the report, the
live explorer, the notebook view and the PNG figures draw roles by these)."""

from __future__ import annotations

from headlab.roles.classify import LETTERS

#: a role's colour (Tableau 10); unclassified heads stay white
ROLE_COLOURS = {
    "positional": "#4e79a7",
    "delimiter": "#76b7b2",
    "rare-token": "#edc948",
    "syntactic": "#59a14f",
    "coreference": "#e15759",
    "broad": "#f28e2b",
    "sink": "#d7d3cf",
    "induction": "#b07aa1",
    "unclassified": "#ffffff",
}
#: colours for roles the table above does not know yet, handed out in the roles' order
SPARE_COLOURS = ("#ff9da7", "#9c755f", "#17becf", "#8c564b", "#bcbd22", "#7f7f7f")


def role_styles(roles: list[str]) -> dict[str, dict[str, str]]:
    """``{role: {"colour", "letter"}}`` for every role of a roles result, the ones headlab does
    not know yet included (a spare colour; a letter from the role's words not taken yet)."""

    styles: dict[str, dict[str, str]] = {}
    taken = {LETTERS[r] for r in roles if r in LETTERS}
    spare = iter(SPARE_COLOURS)
    for role in roles:
        letter = LETTERS.get(role)
        if letter is None:
            words = role.split("-")
            options = [words[0][0].upper(), "".join(w[0] for w in words).upper(), role[:2].title()]
            letter = next((o for o in options if o not in taken), role[:3].title())
            taken.add(letter)
        colour = ROLE_COLOURS.get(role) or next(spare, "#cccccc")
        styles[role] = {"colour": colour, "letter": letter}
    return styles
