"""What the pages read of a roles run's head: one shape for the report and the explorer.

The grid of heads and a head's evidence panel (``assets/grid.js``) are one piece of code on
both pages, so both hand it the same keys of each head of ``headlab roles --json``
(``RoleReport.to_json()["heads"]``): the report its whole roles run, the live explorer
:func:`panel_head` of each head of the run it shows.
"""

from __future__ import annotations

from typing import Any

#: what the grid (the head's cell, its role and stability) and the evidence panel (its role,
#: scores, baseline, margin, the evidence with p, q and Wilson intervals) read of each head
PANEL_KEYS = (
    "layer",
    "head",
    "role",
    "roles",
    "detail",
    "score",
    "baseline",
    "margin",
    "stability",
    "stable",
    "measured_role",
    "scores",
    "evidence",
)


def panel_head(head: dict[str, Any]) -> dict[str, Any]:
    """``head`` (one head of a roles run) cut to :data:`PANEL_KEYS`; a key an older file lacks
    is ``None``.

    Example:
        >>> panel_head({"layer": 0, "head": 1, "role": "broad", "original_head": 4})["head"]
        1
    """
    return {key: head.get(key) for key in PANEL_KEYS}
