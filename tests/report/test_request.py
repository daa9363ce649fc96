"""What ``headlab report`` was asked for, checked before any model is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from headlab.errors import HeadlabError, InputError
from headlab.report.request import ReportRequest


def test_the_folder_and_what_is_measured_follow_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the default folders are checked where the report would go

    def request(**flags: object) -> ReportRequest:
        return ReportRequest(limit=3, no_gap=True, **flags)  # type: ignore[arg-type]

    assert request().folder == "headlab-report"
    assert request(model="smollm2").folder == "headlab-report-smollm2"
    assert request(model="gemma3").folder == "headlab-report-gemma3"
    assert request(out="mine").folder == "mine"
    assert request().measure == "quick"
    assert request(prune=True).measure == "full"
    assert request(prune=True, roles_only=True).measure == "curve"
    assert request(roles_only=True).measure == "roles"
    assert list(tmp_path.iterdir()) == []  # checked, not written


def test_bad_requests_are_refused_before_the_folder_is_touched(tmp_path: Path) -> None:
    out = tmp_path / "report"
    with pytest.raises(InputError, match="add --prune"):
        ReportRequest(out=str(out), text="held-out.txt")
    with pytest.raises(InputError, match="--word 'zzzz' is in none of the viewer's 5 sentence"):
        ReportRequest(out=str(out), word="zzzz")
    assert not out.exists()
    sentences, word = ReportRequest(sentence=("A cat sat .",), word="cat").viewer(causal=False)
    assert word == "cat" and sentences[1] == "A cat sat ."


def test_bad_gold_data_is_refused_by_the_request_before_any_model(tmp_path: Path) -> None:
    """The gold-data flags are the request's: a missing treebank, a GAP file that is not GAP
    and a bad limit are refused on creation, in one line naming the file, folder untouched."""
    out = tmp_path / "report"
    with pytest.raises(InputError, match=r"cannot read treebank .*none\.conllu"):
        ReportRequest(out=str(out), treebank=str(tmp_path / "none.conllu"))
    with pytest.raises(InputError, match="--limit"):
        ReportRequest(out=str(out), limit=0)
    not_gap = tmp_path / "gap.tsv"
    not_gap.write_text("not a GAP file\n")
    with pytest.raises(HeadlabError, match=r"gap\.tsv"):
        ReportRequest(out=str(out), gap=str(not_gap))
    assert not out.exists()
    request = ReportRequest(out=str(out), limit=7, no_gap=True)  # read once, kept for the run
    assert len(request.gold.treebank.sentences) == 7 and request.gold.gap is None


def test_the_word_is_looked_for_in_the_treebank_sentences_shown_too(tmp_path: Path) -> None:
    """#58: the viewer shows a few treebank sentences beside its own; ``--word`` may name a
    word of one of them (the viewer opens there), and a word in none of them is refused with
    the one message, as a word in none of the viewer's own sentences is."""
    from headlab.report.build import treebank_sentences, viewer_sentences
    from headlab.report.data import _focus

    request = ReportRequest(out=str(tmp_path / "r"))
    beside = treebank_sentences(request.gold)
    own, _ = viewer_sentences(False)
    only_there = next(
        w for s in beside for w in s.split() if w.isalpha() and w not in " ".join(own).split()
    )
    request = ReportRequest(out=str(tmp_path / "r"), word=only_there)  # accepted
    sentences, word = request.viewer(causal=False)
    assert sentences == own and word == only_there
    shown = [*own, *beside]
    viewer = [{"words": s.split(), "special": [False] * len(s.split())} for s in shown]
    assert _focus(viewer, only_there)["sentence"] >= len(own)
    messages = set()
    for mine in ((), ("A cat sat .",)):
        with pytest.raises(InputError) as info:
            ReportRequest(out=str(tmp_path / "r"), word="zzzz", sentence=mine)
        messages.add(str(info.value).split(" sentence(s)")[0].rsplit(" ", 1)[0])
    assert messages == {"--word 'zzzz' is in none of the viewer's"}
