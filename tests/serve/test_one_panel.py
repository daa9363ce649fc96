"""The report and the live explorer show one head through the same grid and evidence panel
(#45, "one sentence view"): a roles run's head has the same role, scores, p, q and Wilson
intervals on both pages, and its cell the same role."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.serve.conftest import watch

from headlab.cli import main

pytestmark = pytest.mark.slow  # a roles run and both pages on the real MiniLM

#: what the panel shows of a head's role, the same on both pages
PARTS = ("p.role", "p.scores", "p.evidence", "table.data")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("one") / "report"
    # 100 sentences and GAP rows: MiniLM's coreference heads, tested against their baseline
    argv = ["report", "--out", str(out), "--limit", "100", "--roles-only", "--replicates", "5"]
    assert main(argv) == 0
    return out


def _panel(page: Any, box: str) -> dict[str, str]:
    return {part: page.locator(f"{box} {part}").inner_text() for part in PARTS}


def _role_title(page: Any, cell: str) -> str:
    return (page.get_attribute(cell, "title") or "").split("\u2014 role: ")[1]


def test_both_pages_show_a_head_with_the_same_panel(browser, report: Path, tmp_path) -> None:
    from headlab.serve import Explorer, RoleSources, Shelf, start_server

    page = watch(browser.new_page(viewport={"width": 1280, "height": 1000}))
    page.goto((report / "index.html").as_uri())
    page.wait_for_selector("body[data-ready='1']")
    data = json.loads(page.evaluate("document.getElementById('headlab-data').textContent"))
    # a head whose role a test against its baseline decided: p, q and Wilson intervals
    head = next(h for h in data["roles"]["heads"] if (h["evidence"] or {}).get("interval"))
    layer, number = head["layer"], head["head"]
    cell = f"button[data-layer='{layer}'][data-head='{number}']"
    page.click(f"#grid {cell}")
    shown = _panel(page, "#details")
    assert page.locator("#details h3").inner_text() == f"Layer {layer}, head {number}"

    runs = tmp_path / "roles.json"  # the report's own roles run, given to the explorer
    runs.write_text(json.dumps(data["roles"]), encoding="utf-8")
    server = start_server(Explorer(Shelf(), RoleSources([runs])), port=0)
    live = watch(browser.new_page(viewport={"width": 1400, "height": 1100}))
    try:
        live.goto(server.url)
        live.wait_for_selector("body[data-ready='1']", timeout=60_000)
        assert str(runs) in live.locator("#roles-note").inner_text()
        live.click(f"#heads .hl-grid {cell}")
        assert live.locator("#head-info h3").inner_text() == f"Layer {layer}, head {number}"
        assert _panel(live, "#head-info") == shown
        assert _role_title(live, f"#heads .hl-grid {cell}") == _role_title(page, f"#grid {cell}")
        assert live.get_attribute(f"#heads .hl-grid {cell}", "data-roles") == page.get_attribute(
            f"#grid {cell}", "data-roles"
        )
        assert live.errors == []
    finally:
        live.close()
        server.stop()
    evidence = shown["p.evidence"]
    ev = head["evidence"]
    assert f"p = {ev['p']:.2g}".replace("e-0", "e-") in evidence, evidence
    assert f"q = {ev['q']:.2g}".replace("e-0", "e-") in evidence, evidence
    low, high = (100 * x for x in ev["interval"])
    assert f"[{low:.1f}\u2013{high:.1f}]" in evidence  # its 95% Wilson interval
    scores = f"score {head['score']:.3f} against a baseline of {head['baseline']:.3f}"
    assert scores in shown["p.scores"]
    assert page.errors == []
    page.close()
