"""The explorer's HTML: the live page ``headlab serve`` answers, and the notebook view.

Both draw with the report's own drawing code (``assets/draw.js``) and its grid of heads and
evidence panel (``assets/grid.js``) through one heads view (``assets/heads.js``: the layer x
head grid for a word, a head's pattern for that word and token to token). The page adds
``explorer.js``, which asks the server's JSON API on the same origin; the notebook view is one
block of HTML with its data inline, for ``_repr_html_``: nothing in either is fetched from the
network.
"""

from __future__ import annotations

import html
import secrets
from importlib.resources import files
from typing import Any

from headlab._version import __version__
from headlab.page.html import content_security_policy, fill, safe_json

#: the scripts of the page and of the notebook view, joined in order inside one function;
#: ``grid.js`` is the report's grid of heads and evidence panel, the same code on every page
PAGE_SCRIPTS = ("draw.js", "grid.js", "heads.js", "explorer.js")
NOTEBOOK_SCRIPTS = ("draw.js", "grid.js", "heads.js")


def _asset(name: str) -> str:
    return (files("headlab.page") / "assets" / name).read_text(encoding="utf-8")


def page() -> tuple[str, str]:
    """The explorer's page and the Content-Security-Policy to send with it: its own inline
    script and style (by their sha256) run, and it may ask its own origin, nothing else."""
    css = _asset("heads.css") + _asset("explorer.css")
    js = '"use strict";\n(function () {\n' + "\n".join(map(_asset, PAGE_SCRIPTS)) + "})();\n"
    html = fill(
        _asset("explorer.html"),
        {"__VERSION__": __version__, "__CSS__": css, "__JS__": js},
    )
    policy = content_security_policy(scripts=[js], styles=[css]) + "; connect-src 'self'"
    return html, policy


def notebook_html(data: dict[str, Any]) -> str:
    """One sentence's heads (``SentenceHeads.to_json()``) as a self-contained block of HTML.

    The block's script finds its own element (by a random id, so that several outputs share a
    notebook) and draws into it; its style applies only inside the block.
    """
    uid = "headlab-" + secrets.token_hex(6)
    body = "\n".join(map(_asset, NOTEBOOK_SCRIPTS))
    script = (
        '"use strict";\n(function () {\n'
        f"const box = document.getElementById({safe_json(uid)});\n"
        'const data = JSON.parse(box.querySelector("script.hl-data").textContent);\n'
        f"{body}\n"
        'const view = headsView(box.querySelector(".hl-view"), {});\n'
        "view.show(data);\n"
        'box.setAttribute("data-ready", "1");\n'
        "})();\n"
    )
    caption = html.escape(f"{data['model']}: {data['text']}")
    return (
        f'<div class="hl-notebook" id="{uid}">'
        f"<style>{_asset('heads.css')}</style>"
        f'<p class="hl-heads"><b>{caption}</b></p>'
        '<div class="hl-heads hl-view"></div>'
        f'<script type="application/json" class="hl-data">{safe_json(data)}</script>'
        f"<script>{script}</script>"
        "</div>"
    )
