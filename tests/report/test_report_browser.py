"""The HTML report in a real browser: Debian's chromium driven by Playwright (no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from headlab.cli import main

pytestmark = pytest.mark.slow

XSS = "<script>window.__pwned = 1</script> The chef <b>cooked</b> & left __JS__ __DATA__ __CSS__"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rep") / "report"
    argv = ["report", "--out", str(out), "--limit", "40", "--replicates", "10"]
    assert main([*argv, "--sentence", XSS]) == 0
    return out


@pytest.fixture
def page(browser, report: Path):
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.errors = []  # type: ignore[attr-defined]
    page.requests = []  # type: ignore[attr-defined]
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("request", lambda r: page.requests.append(r.url))
    page.goto((report / "index.html").as_uri())
    page.wait_for_selector("body[data-ready='1']")
    yield page
    page.close()


def test_files_written(report: Path) -> None:
    assert (report / "index.html").is_file()
    pngs = sorted(p.name for p in (report / "figures").glob("*.png"))
    assert "role_grid.png" in pngs and any(n.startswith("heatmap_") for n in pngs)
    assert not any(p.name.endswith(".tmp") for p in report.parent.iterdir())


def test_opens_offline_on_the_lesson_without_errors(page, tmp_path: Path) -> None:
    assert page.errors == []
    remote = [u for u in page.requests if not u.startswith(("file://", "data:"))]
    assert remote == []
    assert page.locator("#model").text_content() == "all-MiniLM-L6-v2"
    assert page.locator("#grid button").count() == 72
    chosen = page.locator("#viewer svg text.chosen")
    assert chosen.count() == 1 and chosen.text_content() == "prepared"
    assert page.locator("#viewer svg line").count() > 12  # every head's lines from "prepared"
    # figures load from disk
    widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.naturalWidth)")
    assert widths and all(w > 0 for w in widths)
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_names_the_decoders_page(page) -> None:
    """The encoder's page points to the decoder's: a link when that report sits beside it,
    else the command that writes it; an encoder's page has no decoder section."""
    line = page.locator("#companion").text_content()
    assert "SmolLM2-135M" in line and "headlab report --model smollm2" in line
    assert page.locator("#decoder-section").is_hidden()


def test_clicking_a_head_changes_the_viewer(page) -> None:
    before = page.locator("#viewer").inner_html()
    page.click("#grid button[data-layer='3'][data-head='1']")
    viewer = page.locator("#viewer")
    assert viewer.get_attribute("data-layer") == "3" and viewer.get_attribute("data-head") == "1"
    assert viewer.inner_html() != before
    assert page.locator("#details h3").text_content().startswith("Layer 3, head 1")
    page.select_option("#mode", "heatmap")
    assert page.locator("#viewer table.heat td").count() > 50
    page.hover("#grid button[data-layer='0'][data-head='2']")
    assert page.locator("#details h3").text_content().startswith("Layer 0, head 2")
    assert page.errors == []


def test_user_text_is_inert(page) -> None:
    index = page.eval_on_selector_all(
        "#sentence option", "os => os.findIndex(o => o.textContent.includes('<script>'))"
    )
    assert index >= 1
    page.select_option("#sentence", str(index))
    words = page.eval_on_selector_all("#viewer svg text", "ts => ts.map(t => t.textContent)")
    assert "<" in words and "script" in words  # shown as words, not run
    assert page.evaluate("window.__pwned") is None
    # the text's <b>cooked</b> is not markup (the head's strongest link, "cooked → chef" in
    # a <b> of the report's own, may name the word)
    bold = page.eval_on_selector_all("b", "bs => bs.map(b => b.textContent)")
    assert "cooked" not in bold
    assert page.errors == []


def violations_to(found: list[str]):
    return lambda m: "Content Security Policy" in m.text and found.append(m.text)


def test_the_policy_runs_the_script_and_blocks_an_injected_one(
    browser, report: Path, tmp_path: Path
) -> None:
    """Under the page's Content-Security-Policy (script and style allowed by their sha256) the
    report's own script runs and its style applies, with no violation; a script added to the
    page, inline or as an event handler, does not run."""
    html = (report / "index.html").read_text(encoding="utf-8")
    assert "unsafe-inline" not in html and "'sha256-" in html
    injected = html.replace(
        "</body>",
        '<script>window.__pwned = 1</script><img src="x.png" onerror="window.__pwned = 2"></body>',
    )
    copy = report / "injected.html"
    for name, text in (("index.html", None), ("injected.html", injected)):
        if text is not None:
            copy.write_text(text, encoding="utf-8")
        page = browser.new_page()
        violations: list[str] = []
        page.on("console", violations_to(violations))
        try:
            page.goto((report / name).as_uri())
            page.wait_for_selector("body[data-ready='1']")
            assert page.evaluate("getComputedStyle(document.body).maxWidth") == "1200px"
            assert page.evaluate("window.__pwned") is None
            if name == "index.html":
                assert violations == []
            else:
                assert violations  # the injected script and handler were refused
        finally:
            page.close()
    copy.unlink()


def test_a_model_pruned_layer_by_layer(browser, tmp_path: Path) -> None:
    """A report of a model with fewer heads in some layers: one button per remaining head, a
    dash where a head was pruned away, and the viewer offers each layer's own heads."""
    from headlab.models import load
    from headlab.pruning import prune_model, save_pruned

    small = prune_model(load(), {0: [0, 1, 2], 3: [5]})
    counts = list(small.layout.heads_per_layer)
    folder = save_pruned(small, tmp_path / "small")
    out = tmp_path / "report"
    argv = ["report", "--model", str(folder), "--out", str(out), "--limit", "20", "--roles-only"]
    assert main([*argv, "--replicates", "5", "--no-gap"]) == 0
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.goto((out / "index.html").as_uri())
    page.wait_for_selector("body[data-ready='1']")
    assert page.locator("#grid button").count() == sum(counts)
    assert page.locator("#grid td.pruned").count() == len(counts) * max(counts) - sum(counts)
    assert page.locator("#grid button[data-layer='0'][data-head='9']").count() == 0
    assert str(counts) in page.locator("#summary").text_content()
    page.click("#grid button[data-layer='0'][data-head='8']")  # the last head of layer 0
    assert page.locator("#details h3").text_content().startswith("Layer 0, head 8")
    assert page.locator("#head option").count() == counts[0] + 1  # "all heads" and 0..8
    page.select_option("#layer", "1")
    assert page.locator("#head option").count() == counts[1] + 1
    page.select_option("#head", "10")
    page.select_option("#layer", "0")  # layer 0 has no head 10 any more: all of its heads
    assert page.locator("#head").input_value() == "all"
    assert page.locator("#viewer").get_attribute("data-head") == "all"
    assert page.locator("#viewer svg line").count() > 0
    assert errors == []
    page.close()


def test_the_ledger_renders_and_each_link_lands_on_its_section(page) -> None:
    """The page opens on the ledger: one row per claim of the lesson, a verdict in each, and
    every "details" link scrolls to a section of the page that exists."""
    from headlab.report.ledger import HOLDS, MISSING, PART, SCALE

    rows = page.locator("#ledger table.ledger tr")
    assert rows.count() == 1 + 8  # the header and the eight claims
    verdicts = page.eval_on_selector_all("#ledger td.verdict", "ts => ts.map(t => t.textContent)")
    assert len(verdicts) == 8 and set(verdicts) <= {HOLDS, PART, SCALE, MISSING}
    # the default run measures every claim of an encoder's page (#46: never mostly blank)
    assert MISSING not in verdicts, verdicts
    links = page.eval_on_selector_all("#ledger a", "as => as.map(a => a.getAttribute('href'))")
    assert len(links) == 8
    for href in links:
        tag = page.evaluate(f"(document.querySelector({href!r}) || {{}}).tagName")
        assert tag == "SECTION", href
        page.click(f"#ledger a[href='{href}'] >> nth=0")
        assert page.evaluate("location.hash") == href
        top = page.evaluate(f"document.querySelector({href!r}).getBoundingClientRect().top")
        assert abs(top) < 5 or page.evaluate(  # at the top, or the page cannot scroll further
            "window.innerHeight + window.scrollY >= document.body.scrollHeight - 2"
        )
    assert page.errors == []
