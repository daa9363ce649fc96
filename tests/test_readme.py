"""The README and the pages of docs/ say what the code does.

The README's two opening commands are what CI runs, and they pin the CPU torch build. Every
Python example in README.md and docs/*.md runs and prints what its comments say, every
``headlab ...`` example parses, and every relative link leads to a file (and heading) that
exists. The README stays a short front door.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 250  # a front door: the explanations live in docs/
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"!?\[(?:[^\]\n]|\n(?!\n))*\]\(([^()\s]+)\)")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _command(which: str) -> str:
    out = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "readme_command.py"), which],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one() -> None:
    readme = README.read_text(encoding="utf-8")
    main_cmd, test_cmd = _command("main"), _command("test")
    assert readme.index(main_cmd) < readme.index(test_cmd) < readme.index("## ")
    for cmd in (main_cmd, test_cmd):
        assert "torch==2.13.0" in cmd  # an open range would pull a multi-GB CUDA build
    assert "pytest" in test_cmd and "ruff" in test_cmd and "mypy" in test_cmd
    assert "headlab " in main_cmd
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "readme_command.py test" in ci  # CI runs exactly the README's test command


def test_readme_is_a_short_front_door_that_links_every_docs_page() -> None:
    readme = README.read_text(encoding="utf-8")
    lines = len(readme.splitlines())
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines, expected under {README_MAX_LINES}"
    )
    pages = sorted(DOCS.glob("*.md"))
    assert len(pages) >= 8  # one page per part
    linked = {target.split("#")[0] for target in LINK.findall(FENCE.sub("", readme))}
    missing = [_name(page) for page in pages if _name(page) not in linked]
    assert not missing, f"README.md does not link to {missing}"


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


def _example(marker: str) -> str:
    """The one Python block, on whichever page it lives, that contains ``marker``."""
    found = [block for page in _pages() for block in _python_blocks(page) if marker in block]
    assert len(found) == 1, f"expected one Python example containing {marker!r}, found {len(found)}"
    return found[0]


def test_the_multi_head_attention_example_computes_what_its_comments_say() -> None:
    """The module's example: the shapes, rows summing to 1, the contributions' sum, and
    prune_heads removing one whole KV group."""
    import torch

    namespace: dict = {}
    exec(_example("MultiHeadAttention(d_model=384"), namespace)
    out, y, mha = namespace["out"], namespace["y"], namespace["mha"]
    assert tuple(out.weights.shape) == (2, 12, 10, 10)
    assert torch.allclose(out.weights.sum(-1), torch.ones(2, 12, 10), atol=1e-5)
    assert tuple(out.head_outputs.shape) == (2, 12, 10, 32)
    assert tuple(out.contributions.shape) == (2, 12, 10, 384)
    assert mha.n_heads == 12 - 3  # after prune_heads([0, 1, 2]): one whole KV group
    assert torch.allclose(out.contributions.sum(1) + mha.out_proj.bias, y, atol=1e-5)


@pytest.mark.slow
def test_every_python_example_runs_and_says_what_it_prints() -> None:
    """Every Python block of README.md and docs/*.md runs as written (the blocks of one page in
    order, sharing a namespace), and a line whose comment shows a list of (word, weight)
    pairs computes those words and weights."""
    import ast

    checked = 0
    ran = 0
    for page in _pages():
        blocks = _python_blocks(page)
        namespace: dict = {}
        for block in blocks:
            exec(compile(block, _name(page), "exec"), namespace)
            ran += 1
        for block in blocks:
            for line in block.splitlines():
                code, _, comment = line.partition("  # ")
                if not comment.startswith("[("):
                    continue
                claimed = ast.literal_eval(comment)
                got = eval(code, namespace)
                where = f"{_name(page)}: {line}"
                assert [w for w, _ in got] == [w for w, _ in claimed], where
                assert [x for _, x in got] == pytest.approx([x for _, x in claimed], abs=0.005), (
                    where
                )
                checked += 1
    assert ran >= 3
    assert checked >= 1


def test_every_cli_example_parses() -> None:
    """Every ``headlab ...`` line in the shell examples of README.md and docs/*.md is a valid
    command line: its subcommand and flags exist (parsed, not run)."""
    import shlex

    from headlab.cli import build_parser

    lines: list[tuple[str, str]] = []
    for page in _pages():
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].split(" > ")[0].strip()
                if line.startswith("headlab "):
                    lines.append((_name(page), line))
    assert len(lines) >= 20
    parser = build_parser()
    for name, line in lines:
        try:
            parser.parse_args(shlex.split(line)[1:])
        except SystemExit as exc:
            raise AssertionError(f"{name}: example does not parse: {line}") from exc


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, and -1, -2, ... on repeats."""
    anchors: set[str] = set()
    for heading in re.findall(
        r"^#{1,6}[ \t]+(.+?)[ \t#]*$", FENCE.sub("", page.read_text(encoding="utf-8")), re.M
    ):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        unique, n = slug, 0
        while unique in anchors:
            n += 1
            unique = f"{slug}-{n}"
        anchors.add(unique)
    return anchors


def test_every_relative_link_leads_to_an_existing_file_and_heading() -> None:
    broken: list[str] = []
    count = 0
    for page in _pages():
        for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            count += 1
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{_name(page)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{_name(page)}: {target} (no such heading in {dest.name})")
    assert count >= 10
    assert not broken, "broken links: " + "; ".join(broken)
