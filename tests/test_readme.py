"""The README's two opening commands are what CI runs, and they pin the CPU torch build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _command(which: str) -> str:
    out = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "readme_command.py"), which],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    main_cmd, test_cmd = _command("main"), _command("test")
    assert readme.index(main_cmd) < readme.index(test_cmd) < readme.index("## ")
    for cmd in (main_cmd, test_cmd):
        assert "torch==2.13.0" in cmd  # an open range would pull a multi-GB CUDA build
    assert "pytest" in test_cmd and "ruff" in test_cmd and "mypy" in test_cmd
    assert "headlab " in main_cmd
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "readme_command.py test" in ci  # CI runs exactly the README's test command
