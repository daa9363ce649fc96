"""One sentence JSON for every page: the report's viewer and the live explorer encode the same
sentence the same way (``headlab.models.sentence_view.sentence_json``), and what they encode is
the model's attention, measured again here without the builder."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from headlab.explore.sentence import capture_sentence
from headlab.models import load
from headlab.models.analysis import pattern_from_bytes, sink_index, word_attention
from headlab.models.sentence_view import MAX_VIEW_TOKENS, MAX_VIEW_WORDS
from headlab.report.data import viewer_sentence

#: what only the explorer carries: tokens, weights x value norm, the word it opens on
EXPLORER_ONLY = {"tokens", "token_special", "token_patterns", "norm_patterns"}
EXPLORER_ONLY |= {"norm_token_patterns", "word", "focus", "truncated"}

LONG = " ".join(f"word{i}" for i in range(120)) + "."


def _shared(sentence: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sentence.items() if k not in EXPLORER_ONLY}


@pytest.mark.parametrize(
    ("model", "text"),
    [
        (None, "The chef who ran to the store was out of food."),
        ("tiny-shakespeare", "To be or not to be, that is the question."),
        (None, LONG),
    ],
)
def test_the_report_and_the_explorer_encode_a_sentence_alike(model: str | None, text: str) -> None:
    lm = load(model)
    report = viewer_sentence(lm, text)
    explorer = capture_sentence(lm, text).to_json()
    assert report["schema"] == explorer["schema"] == "headlab.sentence/1"
    assert _shared(report) == _shared(explorer)
    # the report leaves out what its viewer does not draw, the explorer keeps it
    assert report["tokens"] is None and report["token_patterns"] is None
    assert report["norm_patterns"] is None and report["norm_token_patterns"] is None
    assert explorer["token_patterns"] is not None and explorer["norm_patterns"] is not None
    cut = report["truncated"]
    whole = explorer["truncated"] or {"words": len(explorer["words"])}
    assert (cut is not None) == (whole["words"] > MAX_VIEW_WORDS)  # tokens alone cut no words
    if cut is not None:
        assert cut["words"] == explorer["truncated"]["words"] > MAX_VIEW_WORDS
        assert len(explorer["tokens"]) == MAX_VIEW_TOKENS

    # the oracle: the model's attention and sink, measured again without the builder
    wa = word_attention(lm, text)
    n = len(report["words"])
    assert list(wa.alignment.words[:n]) == report["words"]
    sink = sink_index(wa.alignment) if lm.causal else None
    assert report["sink"] == (-1 if sink is None or sink >= n else sink)
    assert (report["sink"] >= 0) == (model == "tiny-shakespeare")
    for layer in (0, lm.n_layers - 1):
        for head in (0, lm.layout.heads_per_layer[layer] - 1):
            drawn = pattern_from_bytes(report["patterns"][layer], head, n)
            assert torch.allclose(drawn, wa.patterns[layer][head, :n, :n].float(), atol=0.5 / 255)


def test_one_reader_gives_the_report_and_the_explorer_the_same_words_weights_and_notice(
    browser,
) -> None:
    """draw.js's ``readSentence`` in a real browser, on both pages' JSON of one long sentence: the
    same words, sink and weights; the report's notice counts words, the explorer's tokens too."""
    from importlib.resources import files

    lm = load()
    report = viewer_sentence(lm, LONG)
    explorer = capture_sentence(lm, LONG).to_json()
    assets = files("headlab.page") / "assets"
    page = browser.new_page()
    try:
        for name in ("draw.js", "grid.js"):
            page.add_script_tag(content=(assets / name).read_text(encoding="utf-8"))
        read = page.evaluate(
            """(both) => both.map((d) => { const s = readSentence(d);
                return { notice: s.notice, side: s.side, p: s.pattern(1, 2),
                         tokens: s.tokenSide && s.tokenSide.words.length }; })""",
            [report, explorer],
        )
    finally:
        page.close()
    shown, live = read
    # the notice counts LONG's words (120 and a full stop), not [CLS] and [SEP] (#58)
    total, drawn = len(LONG.replace(".", " .").split()), MAX_VIEW_WORDS - 1  # [CLS] drawn first
    assert report["words"][0] == "[CLS]" and report["special"].count(True) == 1
    assert report["truncated"]["words"] == total == 121
    tokens = explorer["truncated"]["tokens"]
    assert shown["notice"] == f"Long input: showing the first {drawn} of {total} words."
    assert live["notice"] == (
        f"Long input: showing the first {drawn} of {total} words"
        f" and {MAX_VIEW_TOKENS} of {tokens} tokens."
    )
    assert shown["side"] == live["side"] and shown["side"]["sink"] == -1
    assert shown["p"] == live["p"]
    expected = pattern_from_bytes(report["patterns"][1], 2, MAX_VIEW_WORDS)
    assert torch.allclose(
        torch.tensor(shown["p"], dtype=torch.float64), expected.double(), atol=1e-6
    )
    assert shown["tokens"] is None and live["tokens"] == MAX_VIEW_TOKENS
