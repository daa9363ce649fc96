"""Assemble the self-contained page: one HTML file with its data, script and style inline."""

from __future__ import annotations

import html
import json
from importlib.resources import files
from typing import Any

from headlab import __version__


def safe_json(data: Any) -> str:
    """JSON that cannot close its ``<script>`` element or open a comment: ``<``, ``>`` and
    ``&`` become ``\\u003c``, ``\\u003e``, ``\\u0026`` (still the same JSON values)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(data: dict[str, Any], figures: list[tuple[str, str]]) -> str:
    """The page for ``data``, with ``figures`` given as ``(relative path, caption)``."""
    assets = files("headlab.report") / "assets"
    template = (assets / "template.html").read_text(encoding="utf-8")
    figure_html = "\n".join(
        f'<figure><img src="{html.escape(path)}" alt="{html.escape(caption)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        for path, caption in figures
    )
    parts = {
        "__VERSION__": html.escape(__version__),
        "__CSS__": (assets / "report.css").read_text(encoding="utf-8"),
        "__FIGURES__": figure_html,
        "__DATA__": safe_json(data),
        "__JS__": (assets / "report.js").read_text(encoding="utf-8"),
    }
    out = template
    for key, value in parts.items():  # data goes in last-but-one; nothing after it is data
        out = out.replace(key, value, 1)
    return out
