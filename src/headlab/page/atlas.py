"""The atlas of head cards: one self-contained HTML file that draws ``headlab cards``' JSON as a
grid of heads coloured by role, each a permalink (``#L.H``) to its card, with filters by role,
by patching effect on a task and by the tokens a head promotes. Nothing is fetched from the
network."""

from __future__ import annotations

import html
from importlib.resources import files
from typing import Any

from headlab._version import __version__
from headlab.page.html import content_security_policy, fill, safe_json
from headlab.page.styles import role_styles


def _asset(name: str) -> str:
    return (files("headlab.page") / "assets" / name).read_text(encoding="utf-8")


def atlas_html(data: dict[str, Any]) -> str:
    """The atlas of one model's cards (``headlab.cards/1``), every role's colour and letter as
    on the report's grid (:func:`~headlab.page.styles.role_styles`)."""
    css = _asset("atlas.css")
    js = (
        '"use strict";\n(function () {\n'
        + _asset("draw.js")
        + _asset("grid.js")
        + _asset("atlas.js")
        + "})();\n"
    )
    roles = sorted({c["looks"]["role"] for c in data["cards"] if c.get("looks")})
    title = f"{data['model']}: one card per head"
    return fill(
        _asset("atlas.html"),
        {
            "__VERSION__": html.escape(__version__),
            "__TITLE__": html.escape(title),
            "__HEADING__": html.escape(title),
            "__CSP__": content_security_policy(scripts=[js], styles=[css]),
            "__CSS__": css,
            "__DATA__": safe_json({**data, "styles": role_styles(roles)}),
            "__JS__": js,
        },
    )
