"""What ``headlab heads`` prints, built from its JSON without a model: a sentence's table (a
decoder's sink column, an encoder-decoder's sides, Whisper's moments), an image's table and
grids, and a traced word's table."""

from __future__ import annotations

from typing import Any

from headlab.datasets.treebank import TreebankSentence
from headlab.explore.heads_text import (
    GAP,
    SHADES,
    heads_text,
    image_text,
    patch_grids,
    trace_text,
)
from headlab.roles.results import RelationRow
from headlab.roles.trace import ArcTrace, HeadWeight, SentenceTrace
from headlab.text import TextTable


def _row(layer: int, head: int, sink: float | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "layer": layer,
        "head": head,
        "top": [{"word": "cat", "weight": 0.5}, {"word": "mat", "weight": 0.25}],
        "special": 0.125,
    }
    if sink is not None:
        row["sink"] = {"word": "The", "weight": sink}
    return row


def _only(parts: list[Any]) -> TextTable:
    (table,) = parts
    assert isinstance(table, TextTable)
    return table


def test_a_decoders_table_names_its_sink() -> None:
    data = {"model": "smollm2", "text": "The cat sat.", "word": "sat", "heads": [_row(0, 1, 0.6)]}
    table = _only(heads_text(data, 2))
    assert table.title == "smollm2: where 'sat' attends" and table.caption == "The cat sat."
    assert table.columns == (
        "layer",
        "head",
        "top 2 words (weight)",
        "to special tokens",
        "to the sink 'The'",
    )
    assert table.rows == (("0", "1", "cat 0.50, mat 0.25", "0.12", "0.60"),)
    encoder = _only(heads_text({**data, "heads": [_row(0, 1)]}, 2))
    assert len(encoder.columns) == 4  # no sink, no column


def test_an_encoder_decoders_table_says_which_side_it_reads() -> None:
    data = {
        "model": "bart",
        "text": "The cat sat.",
        "target": "Le chat.",
        "attention": "cross",
        "word": "chat",
        "heads": [_row(1, 0)],
    }
    table = _only(heads_text(data, 3))
    assert table.title == "bart: where 'chat' attends (cross attention, to source words)"
    assert table.caption == "source: The cat sat.\ntarget: Le chat."
    decoder = _only(heads_text({**data, "attention": "decoder"}, 3))
    assert decoder.title.endswith("(decoder attention, to target words)")
    alone = {**data, "model": "bart (encoder)", "attention": "encoder", "target": None}
    table = _only(heads_text(alone, 3, model="bart"))  # the model asked for, not its encoder
    assert table.title == "bart: where 'chat' attends (encoder attention, to source words)"
    assert table.caption == "The cat sat."


def test_whisper_hears_moments_of_its_sound() -> None:
    data = {
        "model": "whisper",
        "text": "The cat sat.",
        "target": "The cat sat.",
        "audio": "tone.wav",
        "seconds": 0.5,
        "attention": "encoder",
        "word": "0.25s",
        "heads": [_row(0, 0)],
    }
    table = _only(heads_text(data, 3, hears=True, seconds=0.4999))
    assert (
        table.title == "whisper: where '0.25s' attends (encoder attention, to the sound's moments)"
    )
    assert table.columns[2:] == ("top 3 moments (weight)", "to silence (padding)")
    assert table.caption == "source: tone.wav (0.50 s)\ntranscript: The cat sat."
    silent = {k: v for k, v in data.items() if k not in ("audio", "seconds")}
    decoder = _only(heads_text({**silent, "attention": "decoder"}, 3, hears=True))
    assert decoder.caption == "source: (silence)\ntranscript: The cat sat."


def _image(query: Any = "class") -> dict[str, Any]:
    grid = [[0.0, 0.5], [0.1, 0.02]]  # 2 x 2 patches; the largest 0.5
    return {
        "model": "vit",
        "image": "cat.png",
        "grid": {"rows": 2, "cols": 2, "patch_size": 8},
        "query": query,
        "heads": [
            {
                "layer": layer,
                "head": head,
                "top": [{"patch": [0, 1], "weight": 0.5}],
                "class": 0.25,
                "grid": grid,
            }
            for layer in range(2)
            for head in range(2)
        ],
    }


def test_an_images_table_and_its_grids() -> None:
    table, legend = image_text(_image([1, 0]), 1)
    assert isinstance(table, TextTable) and isinstance(legend, str)
    assert table.title == "vit: where the patch (1,0) attends"
    assert table.caption == "cat.png: 2x2 patches of 8 px, (row,col) from the top left"
    assert table.columns == ("layer", "head", "top 1 patches (weight)", "to class token")
    assert table.rows[3] == ("1", "1", "(0,1) 0.50", "0.25")
    assert legend.startswith("Each head's grid: one cell per patch")
    # labels are 12 characters: two grids fit in 26 columns, so two bands of two
    lines = patch_grids(_image(), 26)
    assert lines[0] == "" and lines[4] == ""
    assert lines[1].split(GAP) == ["0.0 cls 0.25", "0.1 cls 0.25"]
    assert (
        lines[2]
        == f"{SHADES[0]} {SHADES[-1] * 2}".ljust(12) + GAP + f"{SHADES[0]} {SHADES[-1] * 2}"
    )
    assert lines[3].startswith(SHADES[1] * 2 + SHADES[0])  # 0.1 of 0.5: a light shade
    assert len(patch_grids(_image(), 200)) == 1 + 1 + 2  # all four side by side


def test_a_traced_words_table() -> None:
    sentence = TreebankSentence(
        sent_id="s1",
        words=("chefs", "cook", "fish"),
        heads=(1, -1, 1),
        relations=("nsubj", "root", "obj"),
        upos=("NOUN", "VERB", "NOUN"),
    )
    gold = RelationRow(
        relation="nsubj",
        direction="head_to_dependent",
        layer=2,
        head=3,
        accuracy=0.456,
        baseline=0.1,
        baseline_offset=-1,
        count=40,
    )
    top = (HeadWeight(layer=2, head=3, weight=0.61), HeadWeight(layer=0, head=1, weight=0.2))
    arcs = (
        ArcTrace(
            relation="nsubj:pass",
            dependent="chefs",
            dependent_index=0,
            top=top,
            gold=gold,
            gold_relation="nsubj",
            gold_weight=0.61,
            gold_rank=1,
            gold_target="chefs",
            gold_hit=True,
        ),
        ArcTrace(
            relation="obj",
            dependent="fish",
            dependent_index=2,
            top=top,
            gold=None,
            gold_relation=None,
            gold_weight=None,
            gold_rank=None,
            gold_target=None,
            gold_hit=None,
        ),
    )
    trace = SentenceTrace(
        model="bert",
        sentence=sentence,
        word="cook",
        word_index=1,
        k=2,
        n_heads=16,
        table_source="roles.json",
        arcs=arcs,
    )
    table = _only(trace_text(trace))
    assert table.title == "bert: where 'cook' sends its attention, dependent by dependent"
    assert table.caption is not None and table.caption.startswith("chefs cook fish\n")
    assert "(roles.json); rank among 16 heads" in table.caption
    assert table.columns[2:4] == ("top 2 heads (weight)", "gold head (acc.)")
    assert table.rows == (
        (
            "nsubj:pass",
            "chefs",
            "2.3 0.61, 0.1 0.20",
            "2.3 (46%) as nsubj",
            "0.61",
            "1",
            "chefs",
            "agree",
        ),
        ("obj", "fish", "2.3 0.61, 0.1 0.20", "-", "-", "-", "-", "no gold row"),
    )
