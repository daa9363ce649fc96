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


def _python_blocks() -> list[str]:
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", readme, re.S)


def test_readme_python_examples_run_and_say_what_they_print() -> None:
    """Every Python example of the README runs as written, and the values its comments show
    are what it computes (shapes, the contributions' sum, the words a head attends to)."""
    import ast

    import pytest
    import torch

    blocks = _python_blocks()
    assert len(blocks) >= 2
    first: dict = {}
    exec(blocks[0], first)  # the README's own example
    out, y, mha = first["out"], first["y"], first["mha"]
    assert tuple(out.weights.shape) == (2, 12, 10, 10)
    assert torch.allclose(out.weights.sum(-1), torch.ones(2, 12, 10), atol=1e-5)
    assert tuple(out.head_outputs.shape) == (2, 12, 10, 32)
    assert tuple(out.contributions.shape) == (2, 12, 10, 384)
    assert mha.n_heads == 12 - 3  # after prune_heads([0, 1, 2]): one whole KV group
    assert torch.allclose(out.contributions.sum(1) + mha.out_proj.bias, y, atol=1e-5)
    namespace: dict = {}
    for block in blocks[1:]:
        exec(block, namespace)
    checked = 0
    for block in blocks[1:]:
        for line in block.splitlines():
            code, _, comment = line.partition("  # ")
            if not comment.startswith("[("):
                continue
            claimed = ast.literal_eval(comment)
            got = eval(code, namespace)
            assert [w for w, _ in got] == [w for w, _ in claimed], line
            assert [x for _, x in got] == pytest.approx([x for _, x in claimed], abs=0.005), line
            checked += 1
    assert checked >= 1


def test_readme_cli_examples_parse() -> None:
    """Every ``headlab ...`` line in the README's shell examples is a valid command line: its
    subcommand and flags exist (parsed, not run)."""
    import re
    import shlex

    from headlab.cli import build_parser

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", readme, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].split(" > ")[0].strip()
            if line.startswith("headlab "):
                lines.append(line)
    assert len(lines) >= 20
    parser = build_parser()
    for line in lines:
        try:
            parser.parse_args(shlex.split(line)[1:])
        except SystemExit as exc:
            raise AssertionError(f"README example does not parse: {line}") from exc
