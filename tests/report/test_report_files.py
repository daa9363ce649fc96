"""Report output rules that need no browser: safe embedding, atomic folders, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headlab.cli import main
from headlab.errors import OutputExistsError
from headlab.outputs import atomic_folder
from headlab.page.html import render, safe_json


def test_safe_json_cannot_close_the_script_element() -> None:
    data = {"text": "</script><script>alert(1)</script> & <!--"}
    text = safe_json(data)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == data


MARKERS = ["__VERSION__", "__CSP__", "__CSS__", "__FIGURES__", "__DATA__", "__JS__"]


def test_user_text_spelling_every_marker_stays_text() -> None:
    """Markers of the template in user text (sentence, figure caption) are not substituted: the
    page keeps one copy of the script and of the data, and the data reads back unchanged."""
    import html as html_lib
    import re

    text = " ".join(MARKERS) + " " + "".join(MARKERS)
    data = {"sentence": text, "nested": {m: m for m in MARKERS}}
    page = render(data, [(f"figures/{MARKERS[0]}.png", text)])
    for marker in MARKERS:
        assert f"<script>{marker}" not in page and f"<style>{marker}" not in page
    found = re.search(r'<script type="application/json" id="headlab-data">(.*?)</script>', page)
    assert found is not None and json.loads(found.group(1)) == data
    assert page.count("<script>") == 1 and page.count('"use strict"') == 1
    assert html_lib.escape(text) in page  # the caption, as text
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page)
    assert csp is not None and "unsafe-inline" not in csp.group(1)


def test_the_policy_allows_exactly_the_inline_script_and_style() -> None:
    """The Content-Security-Policy names the sha256 of the page's one inline script and style,
    refuses forms and <base>, and loads nothing else."""
    import base64
    import hashlib
    import re

    page = render({"x": 1}, [])
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page)
    assert csp is not None
    directives = dict(d.strip().split(" ", 1) for d in csp.group(1).split(";"))
    script = re.search(r"<script>(.*?)</script>", page, re.S)
    style = re.search(r"<style>(.*?)</style>", page, re.S)
    assert script is not None and style is not None

    def sha(text: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"

    assert directives["script-src"] == sha(script.group(1))
    assert directives["style-src"] == sha(style.group(1))
    assert directives["default-src"] == "'none'"
    assert directives["form-action"] == "'none'" and directives["base-uri"] == "'none'"


def test_atomic_folder_replaces_only_when_allowed(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with atomic_folder(target) as tmp:
        (tmp / "a.txt").write_text("first")
    with pytest.raises(OutputExistsError, match="already exists"), atomic_folder(target):
        pass
    with pytest.raises(RuntimeError), atomic_folder(target, overwrite=True) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("interrupted")
    assert (target / "a.txt").read_text() == "first"  # the old result survives an interruption
    with atomic_folder(target, overwrite=True) as tmp:
        (tmp / "a.txt").write_text("second")
    assert (target / "a.txt").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert oct(target.stat().st_mode & 0o777) != oct(0o700)  # not left private like mkdtemp


def test_report_refuses_a_folder_that_is_not_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main(["report", "--out", str(mine), "--limit", "5", "--replicates", "0"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep me"


def test_report_rejects_a_bad_pruning_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "p.json"
    bad.write_text("[1, 2]")
    assert main(["report", "--pruning", str(bad), "--out", str(tmp_path / "r")]) == 1
    assert "expected a JSON object" in capsys.readouterr().err


def test_report_shows_pruning_and_experiment_results(tmp_path: Path) -> None:
    pruning = {
        "model": "all-MiniLM-L6-v2",
        "metric": "stsb",
        "unit": "Spearman x100",
        "importance": "gradient",
        "curve": [
            {"heads_removed": 0, "fraction": 0.0, "metric": 86.7, "loss": 0.0},
            {"heads_removed": 36, "fraction": 0.5, "metric": 85.9, "loss": 0.8},
        ],
    }
    experiment = {
        "summary": [
            {"task": "binding", "n_heads": 1, "metric": "accuracy", "mean": 0.3, "std": 0.1},
            {"task": "binding", "n_heads": 8, "metric": "accuracy", "mean": 1.0, "std": 0.0},
        ]
    }
    (tmp_path / "p.json").write_text(json.dumps(pruning))
    (tmp_path / "e.json").write_text(json.dumps(experiment))
    out = tmp_path / "r"
    argv = ["report", "--out", str(out), "--limit", "8", "--replicates", "0", "--no-gap"]
    argv.append("--roles-only")
    assert (
        main(
            [*argv, "--pruning", str(tmp_path / "p.json"), "--experiment", str(tmp_path / "e.json")]
        )
        == 0
    )
    page = (out / "index.html").read_text()
    assert (out / "figures" / "pruning_curve.png").stat().st_size > 1000
    assert 'src="figures/pruning_curve.png"' in page
    start = page.index('id="headlab-data">') + len('id="headlab-data">')
    data = json.loads(page[start : page.index("</script>", start)])
    assert data["pruning"]["curve"][1]["heads_removed"] == 36
    assert data["experiment"]["summary"][1]["n_heads"] == 8
    assert data["roles"]["data"]["treebank"]["used"] == 8


def test_long_sentences_are_cut_for_the_viewer_with_a_notice() -> None:
    from headlab.models import load
    from headlab.models.sentence_view import MAX_VIEW_WORDS
    from headlab.report.data import viewer_sentence

    text = " ".join(f"word{i}" for i in range(120)) + "."
    s = viewer_sentence(load(), text)
    assert s["truncated"]["words"] > MAX_VIEW_WORDS
    assert s["truncated"]["tokens"] is None  # the report's viewer draws no tokens
    assert len(s["words"]) == MAX_VIEW_WORDS
    from headlab.models.analysis import pattern_from_bytes

    first = pattern_from_bytes(s["patterns"][0], 0, MAX_VIEW_WORDS)  # head 0, decoded
    assert first.shape == (MAX_VIEW_WORDS, MAX_VIEW_WORDS)
    rows = first.sum(-1)  # part of each word's attention: the rest goes to the words cut
    assert (rows > 0).all() and (rows < 1 + MAX_VIEW_WORDS / 255).all()


def test_the_viewer_opens_on_the_chosen_occurrence() -> None:
    from headlab.report.data import _focus_index

    sentence = {
        "words": ["[CLS]", "The", "chef", "prepared", "the", "fish", "[SEP]"],
        "special": [True, False, False, False, False, False, True],
    }
    assert _focus_index(sentence, "prepared") == 3
    assert _focus_index(sentence, "the") == 4  # the word as written first (#58)
    assert _focus_index(sentence, "The") == 1
    assert _focus_index(sentence, "the#2") == -1  # absent: the viewer opens on no word
    assert _focus_index(sentence, "[CLS]") == -1  # special tokens are not words to follow


def test_the_viewer_opens_on_the_first_sentence_that_has_the_word() -> None:
    """``report --sentence "Your own sentence." --word own``: the lesson's sentence lacks
    "own", so the viewer opens on the user's sentence at that word."""
    from headlab.report.data import _focus

    lesson = {"words": ["[CLS]", "The", "chef", "[SEP]"], "special": [True, False, False, True]}
    own = {
        "words": ["[CLS]", "Your", "own", "sentence", ".", "[SEP]"],
        "special": [True, False, False, False, False, True],
    }
    assert _focus([lesson, own], "own") == {"sentence": 1, "word": "own", "index": 2}
    assert _focus([lesson, own], "chef") == {"sentence": 0, "word": "chef", "index": 2}
    assert _focus([lesson, own], "salmon") == {"sentence": 0, "word": "salmon", "index": -1}
