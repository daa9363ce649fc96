"""#59: ``headlab report --patch --circuit`` gives each result a section of its own, its figure at
full width and linked at full size, its heads as links to the grid, and the grid's panel of a
head that appears in them links back; a head patching ranks high that the circuit leaves out is
named. Seen in Chromium on a tiny random Llama."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from tests.causal.test_circuit_cli import HELD_OUT
from tests.causal.test_patch_cli import PROMPTS, _jsonl
from tests.models.tiny import build

from headlab.cli import main
from headlab.report.causal import TOP_PATCHED, circuit_heads, left_out_text, patched_heads


def _json_of(argv: list[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return json.loads(out.getvalue())


def _without(circuit: dict[str, Any], name: str) -> dict[str, Any]:
    """The circuit with head ``name`` (``"L.H"``) taken out: its node, its class evidence and
    every edge it sends or whose queries it reads."""
    layer, head = (int(x) for x in name.split("."))
    edges = [e for e in circuit["edges"] if name not in (e["sender"], e["receiver"][2:])]
    return {
        **circuit,
        "nodes": [n for n in circuit["nodes"] if n["name"] != name],
        "heads": [h for h in circuit["heads"] if (h["layer"], h["head"]) != (layer, head)],
        "edges": edges,
        "classes": {k: [h for h in v if h != [layer, head]] for k, v in circuit["classes"].items()},
        "circuit": {**circuit["circuit"], "edges": len(edges)},
    }


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    """The report of a tiny Llama with its patching result and its circuit, from which the
    head patching ranks first is taken out (a circuit that misses a head patching names)."""
    tmp = tmp_path_factory.mktemp("causal-report")
    folder = build("llama", tmp / "llama", lm_head=True, seed=5)
    found, held = _jsonl(tmp / "find.jsonl", PROMPTS), _jsonl(tmp / "held.jsonl", HELD_OUT)
    patch = _json_of(["-q", "patch", "--model", str(folder), "--prompts", str(found), "--json"])
    argv = ["-q", "circuit", "--model", str(folder), "--prompts", str(found), "--json"]
    circuit = _json_of([*argv, "--eval-prompts", str(held), "--method", "eap"])
    first = max(patch["heads"], key=lambda h: abs(h["effect"]))
    missing = f"{first['layer']}.{first['head']}"
    (tmp / "patch.json").write_text(json.dumps(patch))
    (tmp / "circuit.json").write_text(json.dumps(_without(circuit, missing)))
    out = tmp / "report"
    argv = ["-q", "report", "--model", str(folder), "--out", str(out), "--limit", "8"]
    argv += ["--replicates", "0", "--no-gap", "--roles-only", "--patch", str(tmp / "patch.json")]
    assert main([*argv, "--circuit", str(tmp / "circuit.json")]) == 0
    return out, patch, missing


def test_the_views_rank_heads_and_name_what_the_circuit_leaves_out() -> None:
    """Ranks by |effect| against a sort done here; a KV head's effect on each of its query
    heads; the heads of patching's top that the circuit lacks, and only those."""
    rows = [{"layer": la, "head": h, "effect": e} for la, h, e in [(0, 0, 0.1), (0, 1, -0.7)]]
    rows += [{"layer": 1, "head": h, "effect": 0.05 * h} for h in range(2)]
    patch = {"task": "ioi", "component": "z", "heads": rows}
    view = patched_heads(patch, [2, 2])
    assert [(r["layer"], r["head"], r["rank"]) for r in view["top"]] == [
        (0, 1, 1),
        (0, 0, 2),
        (1, 1, 3),
        (1, 0, 4),
    ]
    kv = {"task": "ioi", "component": "v", "kv_heads": [{"layer": 0, "kv_head": 1, "effect": 0.4}]}
    assert [(h["head"], h["kv_head"]) for h in patched_heads(kv, [4])["heads"]] == [(2, 1), (3, 1)]
    circuit = {
        "task": "ioi",
        "edges_total": 9,
        "circuit": {"edges": 3, "faithfulness": 0.8},
        "heads": [{"layer": 0, "head": 0, "class": "name mover", "dla": 1.0}],
    }
    out = circuit_heads(circuit, patch)["left_out"]
    assert [(r["layer"], r["head"], r["rank"]) for r in out] == [(0, 1, 1), (1, 1, 3), (1, 0, 4)]
    assert circuit_heads(circuit, None)["left_out"] == []
    # without a patching result, the circuit's own heads left out (effects from its edges)
    own = {**circuit, "left_out": [{"layer": 1, "head": 1, "effect": 0.2, "rank": 2, "of": 4}]}
    view = circuit_heads(own, None)
    assert view["left_out_by"] == "edges"
    assert view["left_out"] == [{"layer": 1, "head": 1, "effect": 0.2, "rank": 2}]
    assert "1.1 +0.20 (2nd)" in left_out_text(view) and "estimated from their edges" in (
        left_out_text(view)
    )
    assert circuit_heads(own, patch)["left_out_by"] == "patching"
    assert TOP_PATCHED >= 4


@pytest.mark.slow
def test_patching_and_the_circuit_have_sections_linked_from_the_grid(
    made: tuple[Path, dict[str, Any], str], browser: Any, tmp_path: Path
) -> None:
    out, patch, missing = made
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto((out / "index.html").as_uri())
        page.wait_for_selector("body[data-ready='1']")
        for key, png in (("patch", "patching.png"), ("circuit", "circuit.png")):
            section = page.locator(f"#{key}-section")
            assert section.is_visible(), key
            # the figure links to itself at full size and is drawn at its own width
            image = section.locator(f"a[href='figures/{png}'] img")
            natural, shown = image.evaluate("i => [i.naturalWidth, i.clientWidth]")
            assert natural > 560 and shown == natural, (key, natural, shown)
            assert section.locator(f"figcaption a[href='figures/{png}']").count() == 1
            section.screenshot(path=str(tmp_path / f"{key}.png"))
        # the patching section: its heads by |effect|, each a link to the grid's panel
        ranked = sorted(patch["heads"], key=lambda h: -abs(h["effect"]))
        rows = page.locator("#patch-heads tr.pick")
        assert rows.count() == min(TOP_PATCHED, len(ranked))
        first = rows.first.locator("button.link")
        assert first.text_content() == missing == f"{ranked[0]['layer']}.{ranked[0]['head']}"
        first.click()
        assert page.locator("#details h3").text_content() == "Layer {}, head {}".format(
            *missing.split(".")
        )
        # its panel links to both sections and says the circuit leaves it out
        notes = page.locator("#details ul.causal-notes a")
        assert notes.count() == 2
        assert notes.nth(0).get_attribute("href") == "#patch-section"
        assert f"{ranked[0]['effect']:+.2f}" in notes.nth(0).text_content()
        said = notes.nth(1).text_content()
        assert "Not in the circuit" in said and f"gives it {ranked[0]['effect']:+.2f} (1st" in said
        notes.nth(1).click()
        assert page.evaluate("location.hash") == "#circuit-section"
        left = page.locator("#left-out").text_content()
        assert missing in left and f"{ranked[0]['effect']:+.2f} (1st)" in left
        caption = page.locator("#circuit-section figcaption").text_content()
        assert f"Not in the circuit though patching ranks them in its top {TOP_PATCHED}" in caption
        # a head of the circuit: its panel links to the circuit's section, the grid marks them
        kept = page.locator("#circuit-heads ul.circuit-classes button.link").first
        kept.click()
        hrefs = page.eval_on_selector_all(
            "#details ul.causal-notes a", "as => as.map(a => a.getAttribute('href'))"
        )
        assert hrefs == ["#patch-section", "#circuit-section"]
        page.click("#circuit-section button.mark")
        n_kept = page.locator("#circuit-heads ul.circuit-classes button.link").count()
        assert n_kept == 7 and page.locator("#grid button.marked").count() == n_kept
        layer, head = missing.split(".")
        cell = page.locator(f"#grid button[data-layer='{layer}'][data-head='{head}']")
        assert "marked" not in (cell.get_attribute("class") or "").split()
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        assert errors == []
    finally:
        page.close()
