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
    with pytest.raises(InputError, match="'zzzz' is not in the sentence"):
        check_request(ReportRequest(out=str(out), word="zzzz"))
    assert not out.exists()
    sentences, word = ReportRequest(sentence=("A cat sat .",), word="cat").viewer(causal=False)
    assert word == "cat" and sentences[1] == "A cat sat ."
