"""Assemble the self-contained page: one HTML file with its data, script and style inline.

The template's markers (``__DATA__``, ``__JS__``...) are replaced in one pass over the template
alone, so text from the user or the model that happens to spell a marker stays as it is. The
page's Content-Security-Policy allows exactly the inline script and style it ships (by their
sha256), nothing from the network, no forms, no ``<base>``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from importlib.resources import files
from typing import Any

from headlab._version import __version__


def safe_json(data: Any) -> str:
    """JSON that cannot close its ``<script>`` element or open a comment: ``<``, ``>`` and
    ``&`` become ``\\u003c``, ``\\u003e``, ``\\u0026`` (still the same JSON values)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


#: the report's sections of causal results: their id, heading and the box its script fills
SECTIONS = {
    "patch": ("Which heads carry the behaviour: patching", "patch-heads"),
    "circuit": ("The circuit", "circuit-heads"),
}


def section(key: str, path: str, caption: str) -> str:
    """A causal result's own section: its figure at full width, a link to the image at full
    size, its caption, and a box the page's script fills with the heads (``report.js``)."""
    heading, box = SECTIONS[key]
    src, text = html.escape(path), html.escape(caption)
    return (
        f'<section id="{key}-section" class="causal">\n<h2>{heading}</h2>\n'
        f'<figure class="full"><a href="{src}" title="the figure at full size">'
        f'<img src="{src}" alt="{text}"></a>\n<figcaption>{text} '
        f'(<a href="{src}">full size</a>)</figcaption></figure>\n'
        f'<div id="{box}"></div>\n</section>'
    )


def render(
    data: dict[str, Any],
    figures: list[tuple[str, str]],
    sections: dict[str, tuple[str, str]] | None = None,
) -> str:
    """The page for ``data``, with ``figures`` given as ``(relative path, caption)``;
    ``sections``: a patching result's (``"patch"``) and a circuit's (``"circuit"``) figure as
    ``(relative path, caption)``, each drawn in a section of its own (:func:`section`)."""
    assets = files("headlab.page") / "assets"
    template = (assets / "template.html").read_text(encoding="utf-8")
    figure_html = "\n".join(
        f'<figure><img src="{html.escape(path)}" alt="{html.escape(caption)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        for path, caption in figures
    )
    sections = sections or {}
    unknown = set(sections) - set(SECTIONS)
    if unknown:  # the report's own keys: a bug, not user input
        raise RuntimeError(f"no report section {sorted(unknown)}; expected {sorted(SECTIONS)}")
    css = (assets / "report.css").read_text(encoding="utf-8")
    js = script(assets)
    parts = {
        "__VERSION__": html.escape(__version__),
        "__CSP__": content_security_policy(scripts=[js], styles=[css]),
        "__CSS__": css,
        "__FIGURES__": figure_html,
        "__PATCH__": section("patch", *sections["patch"]) if "patch" in sections else "",
        "__CIRCUIT__": section("circuit", *sections["circuit"]) if "circuit" in sections else "",
        "__DATA__": safe_json(data),
        "__ATTENDS__": html.escape(decoder_roles_prose()),
        "__JS__": js,
    }
    return fill(template, parts)


def decoder_roles_prose() -> str:
    """Where each causal role's head attends (the registry's ``attends``), for the prose of
    the decoder section (``__ATTENDS__``): "an induction head attends from ..., a
    previous-token head to ..."."""
    from headlab.roles import registry  # torch: the explorer and circuit pages stay light

    parts = []
    for i, role in enumerate(r for r in registry.roles() if r.causal):
        article = "an" if role.name[0] in "aeiou" else "a"
        verb = "attends " if i == 0 else ""
        parts.append(f"{article} {role.name} head {verb}{role.attends}")
    return ", ".join(parts)


#: the page's script, in order: the drawing of a head, the grid of heads and a head's evidence
#: panel (both shared with the explorer), the viewer, the tables, the decoder's parts and start,
#: the sections of a patching result and a circuit
SCRIPT_PARTS = ("draw.js", "grid.js", "report.js", "tables.js", "decoder.js", "causal.js")


def script(assets: Any) -> str:
    """The page's one inline script: :data:`SCRIPT_PARTS` joined inside one strict function,
    so that they share its names and leave no global behind."""
    parts = [(assets / name).read_text(encoding="utf-8") for name in SCRIPT_PARTS]
    return '"use strict";\n(function () {\n' + "\n".join(parts) + "})();\n"


def fill(template: str, parts: dict[str, str]) -> str:
    """``template`` with each marker of ``parts`` replaced, in one pass over the template only:
    replacement text is never searched again, so it may contain markers.

    Example:
        >>> fill("<p>__A__|__B__</p>", {"__A__": "__B__", "__B__": "x"})
        '<p>__B__|x</p>'
    """
    found = re.findall(r"__[A-Z]+__", template)
    if sorted(found) != sorted(parts):  # the template ships with headlab: a bug, not user input
        raise RuntimeError(f"template markers {sorted(found)} differ from {sorted(parts)}")
    pattern = re.compile("|".join(re.escape(key) for key in parts))
    return pattern.sub(lambda m: parts[m.group(0)], template)


def _sha256_source(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def content_security_policy(*, scripts: list[str], styles: list[str]) -> str:
    """The page's policy: only the given inline scripts and styles (by hash) run, images from
    the report's folder or ``data:``, nothing else loads, no form submits, no ``<base>``.

    Styles set from the script through the CSSOM (``node.style.x = ...``) are not inline
    styles and need no ``'unsafe-inline'``. Browsers ignore ``frame-ancestors`` and sandboxing
    in a ``<meta>`` policy, and no shipped CSP directive restricts top-level navigation; the
    script never navigates, and without ``'unsafe-inline'`` no injected handler can.
    """
    script_src = " ".join(_sha256_source(s) for s in scripts)
    style_src = " ".join(_sha256_source(s) for s in styles)
    return (
        "default-src 'none'; img-src 'self' file: data:; "
        f"style-src {style_src}; script-src {script_src}; "
        "form-action 'none'; base-uri 'none'; object-src 'none'"
    )
