"""The lock of the set-up path (constraints.txt): the tests run with what it locks, it covers
every dependency pyproject.toml names, and the README's commands install with it."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lock_module() -> Any:
    spec = importlib.util.spec_from_file_location("headlab_lock", ROOT / "tools" / "lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lock = _lock_module()


def test_installed_versions_match_the_lock() -> None:
    """What this run tests with is what a fresh machine gets; a miss names the package."""
    misses = lock.mismatches(lock.read_lock())
    assert not misses, misses[0] + (f" (and {len(misses) - 1} more)" if len(misses) > 1 else "")


def test_a_moved_package_is_named_in_one_line(tmp_path: Path) -> None:
    pins = lock.read_lock()
    installed = dict(pins)
    installed["transformers"] = "5.24.0"
    del installed["numpy"]
    misses = lock.mismatches(pins, installed)
    assert misses == [
        "numpy is not installed; constraints.txt locks " + pins["numpy"],
        f"transformers 5.24.0 is installed; constraints.txt locks {pins['transformers']} "
        "(pip install -c constraints.txt ... moves it)",
    ]
    # a local label (torch's +cpu) is the same release
    installed = {**pins, "torch": pins["torch"] + "+cpu"}
    assert lock.mismatches(pins, installed) == []


def test_a_malformed_lock_line_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "constraints.txt"
    bad.write_text("# comment\nnumpy==2.0\ntransformers>=5\n")
    with pytest.raises(ValueError, match=r"constraints.txt:3: expected name==version"):
        lock.read_lock(bad)


def _names(requirements: list[str]) -> set[str]:
    return {lock.normalize(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in requirements}


def test_the_lock_covers_every_dependency_of_the_readme_commands() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = _names(project["dependencies"]) | _names(project["optional-dependencies"]["test"])
    needed |= {"torch", *_names(list(lock.NO_DEPS))}
    pins = lock.read_lock()
    assert needed - set(pins) == set(), "run python tools/lock.py write"
    assert pins["torch"] == "2.13.0"  # the CPU build on our machines, as the README pins it


def test_both_readme_commands_install_with_the_lock() -> None:
    for which in ("main", "test"):
        command = subprocess.run(
            [sys.executable, str(ROOT / ".ci" / "readme_command.py"), which],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        installs = [p for p in command.split("&&") if "pip install" in p]
        assert installs, which
        for part in installs:
            assert "-c constraints.txt" in part, (which, part)


def test_the_readme_names_the_locked_versions() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    pins = lock.read_lock()
    for name in ("transformers", "tokenizers", "numpy", "torch"):
        assert f"{name} {pins[name]}" in readme, f"README.md should say {name} {pins[name]}"
