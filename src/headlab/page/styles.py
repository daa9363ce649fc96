"""How a role looks on every page and figure: its colour and its letter (the report, the
live explorer, the notebook view and the PNG figures draw roles by these), both from the
role's entry in :mod:`headlab.roles.registry`."""

from __future__ import annotations

from headlab.roles import registry
from headlab.roles.classify import LETTERS

#: unclassified heads stay white
UNCLASSIFIED_COLOUR = "#ffffff"
#: colours for the registered roles that have none, in the registry's order (so a role gets the
#: same one on every page and figure, whichever roles each shows), then for roles a roles result
#: names that this headlab does not know; a role's own colour is never handed out again
SPARE_COLOURS = ("#ff9da7", "#9c755f", "#17becf", "#8c564b", "#bcbd22", "#7f7f7f")
#: when the spare colours run out
LAST_COLOUR = "#cccccc"


def role_colours() -> dict[str, str]:
    """Each registered role's colour (its own, else a spare one), and unclassified's."""
    own = {r.name: r.colour for r in registry.roles() if r.colour is not None}
    spare = iter(c for c in SPARE_COLOURS if c not in own.values())
    colours = {r.name: own.get(r.name) or next(spare, LAST_COLOUR) for r in registry.roles()}
    return {**colours, registry.UNCLASSIFIED: UNCLASSIFIED_COLOUR}


def role_styles(roles: list[str]) -> dict[str, dict[str, str]]:
    """``{role: {"colour", "letter"}}`` for every role of a roles result, the ones headlab does
    not know included (a spare colour; a letter from the role's words not taken yet)."""

    colours = role_colours()
    letters = dict(LETTERS)
    styles: dict[str, dict[str, str]] = {}
    taken = {letters[r] for r in roles if r in letters}
    spare = iter(c for c in SPARE_COLOURS if c not in colours.values())  # unknown roles
    for role in roles:
        letter = letters.get(role)
        if letter is None:
            words = role.split("-")
            options = [words[0][0].upper(), "".join(w[0] for w in words).upper(), role[:2].title()]
            letter = next((o for o in options if o not in taken), role[:3].title())
            taken.add(letter)
        colour = colours.get(role) or next(spare, LAST_COLOUR)
        styles[role] = {"colour": colour, "letter": letter}
    return styles
