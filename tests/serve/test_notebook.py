"""`headlab.capture(...)` for notebooks: the data as attributes, and `_repr_html_` as one
self-contained block that renders in chromium with no network request and no console error."""

from __future__ import annotations

import json

import pytest
import torch
from tests.serve.conftest import watch

import headlab
from headlab.cli import main

TEXT = "To be or not to be, that is the question"


@pytest.fixture(scope="module")
def heads():
    return headlab.capture("tiny-shakespeare", TEXT)


def test_capture_keeps_every_head_at_word_and_token_level(heads) -> None:
    assert heads.model == "tiny-shakespeare" and heads.causal and heads.word == "question"
    assert heads.heads_in_layer == (4, 4, 4, 4)
    words = heads.pattern(2, 3)
    tokens = heads.pattern(2, 3, tokens=True)
    assert words.shape == (len(heads.words),) * 2 and tokens.shape == (len(heads.tokens),) * 2
    assert torch.allclose(tokens.sum(-1), torch.ones(len(heads.tokens)), atol=1e-5)
    assert torch.all(torch.triu(tokens, diagonal=1) == 0)  # causal: no weight on later tokens
    sink = heads.words.index(heads.sink)  # a decoder's first word: set apart
    others = [float(w) for j, w in enumerate(words[-1]) if j != sink]
    assert heads.top(2, 3, k=1)[0][1] == pytest.approx(max(others), abs=1e-6)
    assert heads.sink_share(2, 3) == pytest.approx(float(words[-1, sink]), abs=1e-6)
    with pytest.raises(headlab.errors.InputError, match="head 4 out of range"):
        heads.pattern(0, 4)
    assert headlab.capture(heads.lm, "Hello there").lm is heads.lm  # a loaded model as is


def test_the_table_equals_the_command(heads, capsys) -> None:
    assert (
        main(["heads", TEXT, "--model", "tiny-shakespeare", "--word", "be#2", "--json", "-q"]) == 0
    )
    assert heads.table(word="be#2") == json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_repr_html_renders_offline_in_chromium(heads, browser) -> None:
    xss = headlab.capture("tiny-shakespeare", "</script><script>window.__pwned=1</script> to be")
    for shown, cells in ((heads, 16), (xss, 16)):
        page = watch(browser.new_page())
        # two outputs in one "notebook": each block draws into its own element
        page.set_content(
            "<html><body>" + shown._repr_html_() + shown._repr_html_() + "</body></html>"
        )
        page.wait_for_function(
            "() => document.querySelectorAll('.hl-notebook[data-ready=\"1\"]').length === 2"
        )
        blocks = page.locator(".hl-notebook")
        assert blocks.nth(0).locator(".hl-grid button").count() == cells
        assert blocks.nth(1).locator(".hl-grid button").count() == cells
        blocks.nth(1).locator(".hl-grid button[data-layer='1'][data-head='2']").click()
        assert blocks.nth(1).locator(".hl-view").get_attribute("data-head") == "2"
        assert blocks.nth(0).locator(".hl-view").get_attribute("data-head") == "0"
        assert blocks.nth(0).locator(".hl-lines svg line").count() >= 1
        assert page.evaluate("window.__pwned") is None
        assert page.errors == []
        assert [u for u in page.requests if u != "about:blank"] == []
        page.close()
