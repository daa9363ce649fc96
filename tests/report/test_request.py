"""What ``headlab report`` was asked for, checked before any model is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from headlab.errors import InputError
from headlab.report.request import ReportRequest, check_request


def test_the_folder_and_what_is_measured_follow_the_flags() -> None:
    assert ReportRequest().folder == "headlab-report"
    assert ReportRequest(model="smollm2").folder == "headlab-report-smollm2"
    assert ReportRequest(model="gemma3").folder == "headlab-report-gemma3"
    assert ReportRequest(out="mine").folder == "mine"
    assert ReportRequest().measure == "quick"
    assert ReportRequest(prune=True).measure == "full"
    assert ReportRequest(prune=True, roles_only=True).measure == "curve"
    assert ReportRequest(roles_only=True).measure == "roles"


def test_bad_requests_are_refused_before_the_folder_is_touched(tmp_path: Path) -> None:
    out = tmp_path / "report"
    with pytest.raises(InputError, match="add --prune"):
        check_request(ReportRequest(out=str(out), text="held-out.txt"))
    with pytest.raises(InputError, match="--word 'zzzz' is in none of the viewer's 1 sentence"):
        check_request(ReportRequest(out=str(out), word="zzzz"))
    assert not out.exists()
    sentences, word = ReportRequest(sentence=("A cat sat .",), word="cat").viewer(causal=False)
    assert word == "cat" and sentences[1] == "A cat sat ."


def test_the_word_is_looked_for_in_the_treebank_sentences_shown_too(tmp_path: Path) -> None:
    """#58: the viewer shows a few treebank sentences beside its own; ``--word`` may name a
    word of one of them (the viewer opens there), and a word in none of them is refused with
    the one message, as a word in none of the viewer's own sentences is."""
    from headlab.report.build import treebank_sentences, viewer_sentences
    from headlab.report.data import _focus
    from headlab.roles.workflow import read_gold

    gold = read_gold()
    beside = treebank_sentences(gold)
    own, _ = viewer_sentences(False)
    only_there = next(
        w for s in beside for w in s.split() if w.isalpha() and w not in " ".join(own).split()
    )
    request = ReportRequest(out=str(tmp_path / "r"), word=only_there)
    check_request(request, gold)  # accepted: the viewer shows a sentence that has it
    sentences, word = request.viewer(causal=False, gold=gold)
    assert sentences == own and word == only_there
    shown = [*own, *beside]
    viewer = [{"words": s.split(), "special": [False] * len(s.split())} for s in shown]
    assert _focus(viewer, only_there)["sentence"] >= len(own)
    messages = set()
    for mine in ((), ("A cat sat .",)):
        with pytest.raises(InputError) as info:
            check_request(ReportRequest(out=str(tmp_path / "r"), word="zzzz", sentence=mine), gold)
        messages.add(str(info.value).split(" sentence(s)")[0].rsplit(" ", 1)[0])
    assert messages == {"--word 'zzzz' is in none of the viewer's"}
