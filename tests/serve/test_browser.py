"""The live explorer in a real browser: Debian's chromium through Playwright, against a server
on a free localhost port started by the fixture (and stopped after)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.serve.conftest import watch

pytestmark = pytest.mark.slow  # the page opens on the real MiniLM


@pytest.fixture
def page(browser, server):
    page = watch(browser.new_page(viewport={"width": 1400, "height": 1100}))
    page.goto(server.url)
    page.wait_for_selector("body[data-ready='1']", timeout=60_000)
    yield page
    page.close()


def run_sentence(page, text: str) -> None:
    page.fill("#text", text)
    page.press("#text", "Enter")
    page.wait_for_function(
        "t => document.body.getAttribute('data-sentence') === t && !document.body.hasAttribute('data-busy')",
        arg=text,
    )


def grid_labels(page) -> list[str]:
    return page.eval_on_selector_all("#heads .hl-grid button", "bs => bs.map(b => b.textContent)")


def test_a_new_sentence_updates_the_grid_and_a_click_shows_the_head(page, server) -> None:
    assert page.locator("#heads .hl-grid button").count() == 6 * 12
    before = grid_labels(page)
    assert "fish" in before  # the lesson's sentence: where "prepared" attends
    run_sentence(page, "The old sailor mended his torn nets slowly.")
    after = grid_labels(page)
    words = {"The", "old", "sailor", "mended", "his", "torn", "nets", "slowly", "."}
    assert len(after) == 72 and after != before and set(after) <= words  # the new words
    page.click("#heads .hl-grid button[data-layer='4'][data-head='7']")
    heads = page.locator("#heads")
    assert heads.get_attribute("data-layer") == "4" and heads.get_attribute("data-head") == "7"
    assert page.locator("#head-info h3").text_content() == "Layer 4, head 7"
    assert page.locator("#heads .hl-lines svg line").count() >= 1  # the chosen word's lines
    tokens = page.locator("#heads .hl-tokens table.heat thead th").count() - 1
    # token to token: [CLS] the old sailor men ##ded his torn nets slowly . [SEP]
    assert tokens == 12 and "##ded" in page.locator("#heads .hl-tokens").text_content()
    assert page.locator("#heads .hl-tokens table.heat td").count() == tokens * tokens
    page.click("#heads .hl-lines svg text[data-word='3']")  # follow "sailor"
    assert page.locator("#heads .hl-lines svg text.chosen").text_content() == "sailor"
    assert page.locator("#heads .hl-grid").get_attribute("data-word") == "3"
    assert page.errors == []
    assert all(url.startswith(server.url) or url.startswith("data:") for url in page.requests)


def test_switching_heads_off_changes_similarity_and_prediction(page, server) -> None:
    page.click("#heads .hl-grid button[data-layer='0'][data-head='3']")
    page.click("#toggle")
    page.wait_for_selector("#effect[data-off='1']")
    text = page.locator("#effect .similarity").text_content()
    cosine = float(text.rsplit(" ", 1)[1])
    assert 0.5 < cosine < 0.9999
    page.fill("#other", "A cook made dinner.")
    page.press("#other", "Enter")
    page.wait_for_selector("#effect .other-similarity")
    assert "with all heads" in page.locator("#effect .other-similarity").text_content()
    # the decoder: the top-5 next tokens with every head, then with a layer's heads off
    page.select_option("#model", "tiny-shakespeare")
    page.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('tiny-shakespeare')"
    )
    assert page.locator("#heads .hl-grid button").count() == 16
    assert page.locator("#off-list").text_content() == "none"  # a new model: all heads on
    assert page.locator("#other-box").is_hidden()
    rows = page.locator("#effect table.next-token tr")
    assert rows.count() == 6
    before = page.eval_on_selector_all(
        "#effect table.next-token td", "ts => ts.map(t => t.textContent)"
    )
    assert before[0::4] == before[2::4]  # nothing off yet: the same tokens both sides
    for head in range(4):
        page.click(
            f"#heads .hl-grid button[data-layer='0'][data-head='{head}']", modifiers=["Shift"]
        )
    page.wait_for_selector("#effect[data-off='4']")
    assert page.locator("#heads .hl-grid button.off").count() == 4
    after = page.eval_on_selector_all(
        "#effect table.next-token td", "ts => ts.map(t => t.textContent)"
    )
    assert after[0::4] == before[0::4]  # the left column stays the full model's
    assert after[1::4] == before[1::4] and after[2::4] + after[3::4] != before[2::4] + before[3::4]
    assert page.errors == []
    assert all(url.startswith(server.url) or url.startswith("data:") for url in page.requests)


def test_oversized_input_gets_a_clear_message(page) -> None:
    page.fill("#text", "word " * 300)
    page.press("#text", "Enter")
    status = page.locator("#status")
    assert status.get_attribute("class") == "error"
    assert status.text_content() == "Too long: 1500 characters; the limit is 1000."
    # the last sentence's grid does not stay under the new text (#46, item 7)
    assert page.locator("#heads .hl-grid button").count() == 0
    assert page.get_attribute("body", "data-sentence") is None
    page.fill("#text", "The chef cooked the fish.")  # and the next sentence draws again
    page.press("#text", "Enter")
    page.wait_for_selector("body[data-sentence='The chef cooked the fish.']")
    assert page.locator("#heads .hl-grid button").count() == 72
    assert page.errors == []


def test_user_text_is_shown_as_text(page) -> None:
    text = "<img src=x onerror=window.__pwned=1> cooked <b>fish</b>"
    run_sentence(page, text)
    words = page.eval_on_selector_all(
        "#heads .hl-lines svg text", "ts => ts.map(t => t.textContent)"
    )
    assert "<" in words and "img" in words
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#heads b").count() == 0
    assert page.errors == []


def test_the_address_bar_is_a_permalink_to_sentence_word_and_head(page, browser, server) -> None:
    """#46, item 9: the explorer's state in the URL; opening it again shows the same view."""
    run_sentence(page, "The old sailor mended his torn nets slowly.")
    page.click("#heads .hl-grid button[data-layer='2'][data-head='5']")
    link = page.evaluate("location.href")
    assert "layer=2" in link and "head=5" in link and "sailor" in link
    other = browser.new_page(viewport={"width": 1400, "height": 1100})
    other.goto(link)
    other.wait_for_selector("body[data-ready='1']", timeout=60_000)
    assert other.input_value("#text") == "The old sailor mended his torn nets slowly."
    assert other.get_attribute("#heads", "data-layer") == "2"
    assert other.get_attribute("#heads", "data-head") == "5"
    assert other.locator("#heads .hl-grid button.selected").get_attribute("data-head") == "5"
    other.close()


def test_a_view_exports_to_json_svg_and_png(page) -> None:
    import json

    page.click("#heads .hl-grid button[data-layer='1'][data-head='3']")
    got = {}
    for kind in ("json", "svg", "png"):
        with page.expect_download() as info:
            page.click(f"#export-{kind}")
        path = info.value.path()
        got[kind] = Path(path).read_bytes()
        assert info.value.suggested_filename.endswith(f"L1H3.{kind}")
    view = json.loads(got["json"])
    assert (view["layer"], view["head"], view["word"]) == (1, 3, "prepared")
    n = len(view["words"])
    assert len(view["pattern"]) == n and all(abs(sum(r) - 1) < 0.05 for r in view["pattern"][1:-1])
    assert got["svg"].lstrip().startswith(b"<svg") and b"<line" in got["svg"]
    assert got["png"][:8] == b"\x89PNG\r\n\x1a\n" and len(got["png"]) > 2000
    assert page.errors == []


def test_the_model_view_shows_every_head_at_once(page) -> None:
    page.click("#model-view summary")
    page.wait_for_selector("#thumbs canvas")
    assert page.locator("#thumbs canvas").count() == 6 * 12
    page.click("#thumbs canvas[data-layer='4'][data-head='7']")
    assert page.get_attribute("#heads", "data-layer") == "4"
    assert page.get_attribute("#heads", "data-head") == "7"
    assert page.locator("#thumbs canvas.selected").get_attribute("data-head") == "7"
    # each thumbnail is its head's pattern: a pixel per word pair, darker for more weight
    drawn = page.evaluate(
        "() => { const c = document.querySelector('#thumbs canvas[data-layer=\\'0\\'][data-head=\\'2\\']');"
        " const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        " let lit = 0; for (let i = 3; i < px.length; i += 4) if (px[i] > 128) lit++; return [c.width, lit]; }"
    )
    assert drawn[0] >= 8 and drawn[1] >= drawn[0] // 2  # a positional head: one strong cell a row
    assert page.errors == []


def test_weights_scaled_by_value_norms_beside_the_raw_ones(page, browser) -> None:
    """#46, item 9 (Kobayashi et al. 2020): the view switches to attention x value norm and
    shows the library's weighted pattern; the export and the permalink say which it shows."""
    import json

    from headlab.explore.sentence import capture_sentence
    from headlab.models import load

    def export() -> dict:
        with page.expect_download() as info:
            page.click("#export-json")
        return json.loads(Path(info.value.path()).read_bytes())

    page.click("#heads .hl-grid button[data-layer='2'][data-head='0']")
    raw = export()
    page.select_option("#heads .hl-weighting", "norm")
    assert page.get_attribute("#heads", "data-weighting") == "norm"
    weighted = export()
    assert (raw["weighting"], weighted["weighting"]) == ("attention", "norm")
    heads = capture_sentence(load(), raw["text"])
    for view, kind in ((raw, "attention"), (weighted, "norm")):
        want = heads.pattern(2, 0, weighting=kind)
        got = torch.tensor(view["pattern"])
        assert (got - want).abs().max() <= 1 / 255 + 1e-6, kind  # bytes of round(255 * w)
    special = torch.tensor(raw["special"])
    rows = ~special
    share = [torch.tensor(v["pattern"])[rows][:, special].sum(-1).mean() for v in (raw, weighted)]
    assert share[1] < share[0], share  # [CLS] and [SEP] carry less than they draw
    assert "weights=norm" in page.evaluate("location.href")
    other = watch(browser.new_page(viewport={"width": 1400, "height": 1100}))
    other.goto(page.evaluate("location.href"))
    other.wait_for_selector("body[data-ready='1']", timeout=60_000)
    other.wait_for_selector("#heads[data-weighting='norm']")
    assert other.input_value("#heads .hl-weighting") == "norm"
    assert other.errors == [] and page.errors == []
    other.close()


def test_resample_ablation_names_the_sentence_it_resampled_from(page) -> None:
    """#46, item 9: beside zero and mean, a switched-off head can say what it said on another
    sentence; the page names that sentence and the similarity moves with the mode."""
    page.click("#heads .hl-grid button[data-layer='0'][data-head='3']")
    page.click("#toggle")
    page.wait_for_selector("#effect[data-off='1']")
    zero = page.locator("#effect .similarity").text_content()
    page.select_option("#mode", "resample")
    page.wait_for_selector("#effect[data-mode='resample'] .resampled")
    note = page.locator("#effect .resampled").text_content()
    assert "on \u201c" in note and "(UD EWT)" in note
    assert page.locator("#effect .similarity").text_content() != zero
    assert page.errors == []
