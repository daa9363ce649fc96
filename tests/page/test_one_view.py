"""One grid of heads and one evidence panel (#45, "one sentence view"): the report and the live
explorer join the same ``grid.js``; neither keeps a grid, a panel or a sink rule of its own.
(Both pages drawing the same numbers for the same head: ``tests/serve/test_one_panel.py``.)"""

from __future__ import annotations

import re
from importlib.resources import files

from headlab.page import explorer, html
from headlab.page.panel import PANEL_KEYS, panel_head

ASSETS = files("headlab.page") / "assets"


def _scripts() -> dict[str, str]:
    return {
        p.name: p.read_text(encoding="utf-8") for p in ASSETS.iterdir() if p.name.endswith(".js")
    }


def _defined(name: str) -> list[str]:
    """The assets that define the function ``name``."""
    pattern = re.compile(rf"^function {name}\(", re.M)
    return sorted(f for f, text in _scripts().items() if pattern.search(text))


def test_the_grid_the_panel_and_the_sink_rule_are_defined_once_in_grid_js() -> None:
    for name in ("headGrid", "headPanel", "markRole", "setApart", "sinkOf", "strongestLink"):
        assert _defined(name) == ["grid.js"], name
    # the old copies are gone: the explorer's grid and panel, the report's panel, the sink rules
    for name in ("drawGrid", "apartKey"):
        assert _defined(name) == [], name
    scripts = _scripts()
    rules = [f for f, text in scripts.items() if re.search(r"j === sink|=== sink\)", text)]
    assert rules == ["grid.js"], rules
    assert "headGrid(" in scripts["report.js"] and "headGrid(" in scripts["heads.js"]
    assert "headPanel(" in scripts["report.js"] and "headPanel(" in scripts["explorer.js"]
    assert 'el("table")' not in scripts["report.js"]  # no grid table of the report's own


def test_every_page_joins_grid_js() -> None:
    grid = (ASSETS / "grid.js").read_text(encoding="utf-8")
    assert "grid.js" in html.SCRIPT_PARTS
    assert "grid.js" in explorer.PAGE_SCRIPTS and "grid.js" in explorer.NOTEBOOK_SCRIPTS
    assert grid in html.script(ASSETS)
    page, _policy = explorer.page()
    assert "function headPanel(" in page and "function headGrid(" in page


def test_the_explorer_hands_the_panel_the_reports_keys() -> None:
    head = {
        "layer": 2,
        "head": 5,
        "role": "syntactic",
        "roles": ["syntactic"],
        "stable": True,
        "measured_role": "syntactic",
        "scores": {"syntactic": 0.6},
        "evidence": {"p": 1e-6, "q": 1e-5, "interval": [0.5, 0.7]},
        "original_head": 7,
    }
    shown = panel_head(head)
    assert tuple(shown) == PANEL_KEYS
    assert shown["evidence"] == head["evidence"] and shown["scores"] == head["scores"]
    assert panel_head({"layer": 0, "head": 0, "role": "broad"})["stable"] is None


def test_one_reader_of_a_sentence_for_the_report_and_the_explorer() -> None:
    """draw.js's ``readSentence`` is the one reader of ``headlab.sentence/1``: the report and the
    heads view decode patterns and word the notice of a long input only through it."""
    assert _defined("readSentence") == ["draw.js"]
    scripts = _scripts()
    for name in ("report.js", "heads.js"):
        assert re.search(r"\breadSentence\b", scripts[name]), name
        assert "Long input" not in scripts[name], name  # the notice is the reader's
        assert "decodeLayer(" not in scripts[name], name  # so are the bytes
    notices = [f for f, text in scripts.items() if "Long input" in text]
    assert notices == ["draw.js"], notices
