"""Report output rules that need no browser: safe embedding, atomic folders, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headlab.cli import main
from headlab.errors import OutputExistsError
from headlab.outputs import atomic_folder
from headlab.report.html import safe_json


def test_safe_json_cannot_close_the_script_element() -> None:
    data = {"text": "</script><script>alert(1)</script> & <!--"}
    text = safe_json(data)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == data


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
