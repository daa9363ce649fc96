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


def _cached_gguf(tmp_path, gguf_file: str):
    """A tiny Llama laid out as headlab's cache keeps a GGUF file's conversion: a hashed
    folder name, the file it came from recorded in ``headlab-gguf.json``."""
    from tests.models.tiny import build

    from headlab.models import gguf

    name = "SmolLM2-135M-Instruct.Q4_1-e1e82386d728"
    folder = build("llama", tmp_path / "gguf" / name, lm_head=True, seed=5)
    record = {"gguf_file": gguf_file, "architecture": "llama", "conversion": 1}
    (folder / gguf.SOURCE).write_text(json.dumps(record))
    return folder


def test_a_models_name_is_never_its_cache_folder(tmp_path) -> None:
    """#59: a GGUF file's conversion in the cache is named by that file (a bundled model's by
    its name), a Hugging Face cache snapshot by its model name, another folder by itself."""
    from tests.models.tiny import build

    from headlab.models.folder import locate

    bundled = _cached_gguf(tmp_path / "a", "/site-packages/x/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert locate(bundled)[1] == "SmolLM2-135M"
    other = _cached_gguf(tmp_path / "b", "/models/my-model.Q8_0.gguf")
    assert locate(other)[1] == "my-model.Q8_0"
    snapshot = build("llama", tmp_path / "hub" / "models--org--tiny-llama" / "snapshots" / "3f2a")
    assert locate(snapshot)[1] == "org/tiny-llama"
    plain = build("llama", tmp_path / "my-llama")
    assert locate(plain)[1] == "my-llama"


@pytest.mark.slow
def test_the_notebook_view_names_the_model_with_a_head_axis_and_a_key(tmp_path, browser) -> None:
    """#59: the view of a model loaded from its cache folder is titled by the model's name, not
    the folder's; the grid has an axis over its heads and a key to its shades; a patching
    result's notebook view has the heads' axis, a legend of its fixed scale and the PNG's
    title."""
    from tests.causal.test_patch_cli import PROMPTS

    from headlab.causal.patching import patch_heads
    from headlab.models.loading import load

    folder = _cached_gguf(tmp_path, "/site-packages/x/SmolLM2-135M-Instruct.Q4_1.gguf")
    shown = headlab.capture(str(folder), "When Mary and John went to the store")
    assert shown.model == "SmolLM2-135M"
    lm = load(folder, with_lm_head=True)
    patching = patch_heads(lm.model, lm.tokenizer, PROMPTS)
    page = watch(browser.new_page(viewport={"width": 900, "height": 900}))
    try:
        page.set_content(
            "<html><body>" + shown._repr_html_() + patching._repr_html_() + "</body></html>"
        )
        page.wait_for_selector(".hl-notebook[data-ready='1']")
        title = page.locator(".hl-notebook p.hl-heads b").text_content()
        assert title.startswith("SmolLM2-135M: ") and "e1e82386d728" not in title
        grid = page.locator(".hl-notebook .hl-grid")
        assert grid.locator("caption.hl-axis").text_content() == "head \u2192"
        assert grid.locator("tr").first.locator("th").all_text_contents() == [
            "layer \\ head",
            "0",
            "1",
            "2",
            "3",
        ]
        key = grid.locator(".hl-grid-key")
        assert "shade: the weight" in key.text_content() and key.locator("i").count() == 5
        grid.screenshot(path=str(tmp_path / "grid.png"))
        # the patching result's view
        view = page.locator(".hl-patching")
        assert view.locator("tr").count() == 3  # the heads' axis and two layers
        assert view.locator("tr").first.locator("th").all_text_contents() == [
            "layer \\ head",
            "0",
            "1",
            "2",
            "3",
        ]
        text = view.text_content()
        assert "activation patching of head outputs at every position" in text
        assert "SmolLM2-135M, " in text and "e1e82386d728" not in text  # named, not its folder
        bound = max(1.0, float(patching.effects.abs().max()))  # the fixed scale, wider past 1
        assert f"effect (share of the logit difference removed): {-bound:+.1f}" in text
        assert view.locator(".hl-legend i").count() == 5
        view.screenshot(path=str(tmp_path / "patching.png"))
        assert page.errors == []
    finally:
        page.close()
