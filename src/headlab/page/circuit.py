"""The circuit's page: one self-contained HTML file that draws ``headlab circuit``'s JSON as a
graph (layers bottom to top, heads as nodes coloured by class, edge width by score; the layout
and the heads named are the PNG figure's, :mod:`headlab.causal.figure`) beside its faithfulness
curve. Hovering a node shows its numbers. Nothing is fetched from the network."""

from __future__ import annotations

import html
from importlib.resources import files
from typing import Any

from headlab._version import __version__
from headlab.causal.figure import circuit_layout, labelled_heads
from headlab.page.html import content_security_policy, fill, safe_json

#: edges drawn at most (the strongest by |score|; the page says how many the circuit has)
MAX_DRAWN = 400


def _asset(name: str) -> str:
    return (files("headlab.page") / "assets" / name).read_text(encoding="utf-8")


def circuit_html(data: dict[str, Any]) -> str:
    """The page for one circuit (``headlab.circuit/1``)."""
    css = _asset("circuit.css")
    js = '"use strict";\n(function () {\n' + _asset("draw.js") + _asset("circuit.js") + "})();\n"
    # the figure's layout and labelling rule (headlab.causal.figure), drawn here in SVG
    labelled, listed = labelled_heads(data)
    drawn = {
        **data,
        "edges": data["edges"][:MAX_DRAWN],
        "edges_in_circuit": len(data["edges"]),
        "layout": {name: list(xy) for name, xy in circuit_layout(data).items()},
        "labelled": labelled,
        "listed": listed,
    }
    title = f"{data['model']}: the circuit of {data['task']}"
    return fill(
        _asset("circuit.html"),
        {
            "__VERSION__": html.escape(__version__),
            "__TITLE__": html.escape(title),
            "__HEADING__": html.escape(title),
            "__CSP__": content_security_policy(scripts=[js], styles=[css]),
            "__CSS__": css,
            "__DATA__": safe_json(drawn),
            "__JS__": js,
        },
    )
