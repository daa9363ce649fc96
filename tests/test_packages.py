"""Every package of headlab offers its names one way (:mod:`headlab._lazy`): listed once, loaded on
use, none shadowed by a module; and what a command imports stays what it needs."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import headlab
from headlab._lazy import exported

SRC = Path(headlab.__file__).parent


def _packages() -> list[str]:
    return sorted(
        ".".join(("headlab", *p.parent.relative_to(SRC).parts)).rstrip(".")
        for p in SRC.rglob("__init__.py")
    )


@pytest.mark.parametrize("package", _packages())
def test_every_package_offers_its_names_one_way(package: str) -> None:
    """Each name a package offers resolves, is in ``__all__`` and ``dir()``, and no name is
    also a module of the package (once that module is imported, the module would shadow it)."""
    path = SRC.joinpath(*package.split(".")[1:], "__init__.py")
    source = path.read_text(encoding="utf-8")
    names = exported(source)
    tree_names = {p.stem for p in path.parent.iterdir() if p.suffix == ".py" or p.is_dir()}
    assert not set(names) & tree_names, f"{package}: names that are also its modules"
    module = importlib.import_module(package)
    offered = set(getattr(module, "__all__", ()))  # a package that offers nothing: a docstring
    assert set(names) <= offered and set(names) <= set(dir(module))
    for name in names:
        assert getattr(module, name) is not None
    body = [line for line in source.splitlines() if line.startswith(("def ", "class "))]
    assert not body, f"{package}'s __init__ defines {body}: move them into a module"


def test_circuit_does_not_import_the_roles_pipeline() -> None:
    """``headlab circuit`` reads a cached roles run (headlab.cache), it measures none."""
    code = (
        "import sys, headlab.experiments.circuit_request; "
        "print(sorted(m for m in sys.modules if m.startswith('headlab.roles.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    loaded = json.loads(out.stdout.replace("'", '"'))
    assert "headlab.roles.measure" not in loaded and "headlab.roles.passes" not in loaded
    assert "headlab.roles.workflow" not in loaded
