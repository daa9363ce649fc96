"""One rule for a decoder's attention sink (#46, item 2): its share is shown apart in
``headlab heads``, the library's rows, the explorer, the notebook and the report, and the cell
names the word a head attends to most among the others."""

from __future__ import annotations

import json

import pytest
from tests.serve.conftest import watch

import headlab
from headlab.cli import main
from headlab.models.analysis import sink_index
from headlab.models.words import Alignment

TEXT = "The king said that the queen would come to the castle"


@pytest.fixture(scope="module")
def heads():
    return headlab.capture("tiny-shakespeare", TEXT)


def test_the_sink_is_a_decoders_first_word_and_an_encoder_has_none() -> None:
    words = Alignment(
        text="a b",
        words=("a", "b"),
        is_special=(False, False),
        token_to_word=(0, 1),
        word_spans=((0, 1), (2, 3)),
    )
    assert sink_index(words) == 0
    bos = Alignment(
        text="a b",
        words=("<s>", "a", "b"),
        is_special=(True, False, False),
        token_to_word=(0, 1, 2),
        word_spans=((-1, -1), (0, 1), (2, 3)),
    )
    assert sink_index(bos) is None  # a BOS is the sink, already shown apart as special
    minilm = headlab.capture("minilm", "The chef prepared the fish.")
    assert minilm.sink is None and minilm.to_json()["sink"] == -1
    assert all("sink" not in row for row in minilm.table()["heads"])


def test_rows_set_the_sink_apart_and_name_the_best_other_word(heads, capsys) -> None:
    assert heads.sink == "The" and heads.to_json()["sink"] == 0
    assert main(["heads", TEXT, "--model", "tiny-shakespeare", "--json", "-q"]) == 0
    rows = json.loads(capsys.readouterr().out)["heads"]
    assert len(rows) == 16
    last = len(heads.words) - 1
    for row in rows:
        pattern = heads.pattern(row["layer"], row["head"])[last]  # (W,)
        assert row["sink"]["word"] == "The"
        assert row["sink"]["weight"] == pytest.approx(float(pattern[0]), abs=1e-4)
        best = max(range(1, len(pattern)), key=lambda j: float(pattern[j]))
        assert row["top"][0]["weight"] == pytest.approx(float(pattern[best]), abs=1e-4)
        assert all(t["word"] != "The" for t in row["top"])
    # the weight adds up: the words shown, the words not shown, the sink and specials
    total = sum(float(w) for w in heads.pattern(0, 0)[last])
    assert total == pytest.approx(1.0, abs=1e-4)


@pytest.mark.slow
def test_the_grid_names_other_words_and_marks_where_the_sink_takes_most(heads, browser) -> None:
    page = watch(browser.new_page())
    page.set_content("<html><body>" + heads._repr_html_() + "</body></html>")
    page.wait_for_function("() => document.querySelector('.hl-notebook[data-ready=\"1\"]')")
    cells = page.locator(".hl-grid button")
    labels = [cells.nth(i).inner_text().lstrip("\u2022") for i in range(cells.count())]
    assert len(labels) == 16 and "The" not in labels
    last = len(heads.words) - 1
    marked = {
        (
            int(cells.nth(i).get_attribute("data-layer")),
            int(cells.nth(i).get_attribute("data-head")),
        )
        for i in range(cells.count())
        if "apart" in (cells.nth(i).get_attribute("class") or "")
    }
    expected = set()
    for layer in range(4):
        for head in range(4):
            row = heads.pattern(layer, head)[last]
            if float(row[0]) > max(float(w) for w in row[1:]) + 1 / 255:
                expected.add((layer, head))
    assert marked >= expected and expected, (marked, expected)
    note = page.locator(".hl-note").inner_text()
    assert "the sink \u201cThe\u201d" in note
    cells.first.hover()
    assert "to \u201cThe\u201d" in (cells.first.get_attribute("title") or "")
    assert page.errors == []
    page.close()


def test_every_row_gives_the_heads_share_to_the_sink(heads) -> None:
    """``sink_share`` in every row of ``headlab heads --json``, as ``headlab roles`` counts the
    sink: a decoder without a BOS its first word, an encoder its [CLS] and [SEP]; from the
    word pattern the page draws."""
    last = len(heads.words) - 1
    for row in heads.table()["heads"]:
        pattern = heads.pattern(row["layer"], row["head"])[last]
        assert row["sink_share"] == pytest.approx(float(pattern[0]) + row["special"], abs=2e-4)
    minilm = headlab.capture("minilm", "The chef prepared the fish.")
    words = minilm.attention.alignment
    special = [j for j, s in enumerate(words.is_special) if s]
    assert [words.words[j] for j in special] == ["[CLS]", "[SEP]"]
    chef = words.word_index("chef")
    for row in minilm.table(word="chef")["heads"]:
        pattern = minilm.pattern(row["layer"], row["head"])[chef]
        assert row["sink_share"] == pytest.approx(sum(float(pattern[j]) for j in special), abs=2e-4)
