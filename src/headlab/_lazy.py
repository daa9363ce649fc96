"""How every package of headlab offers its names: one list, read by people, type checkers and the
import system alike.

A package's ``__init__.py`` is its docstring (what the package holds, module by module), the
names it offers imported under ``if TYPE_CHECKING:`` (each as ``name as name``, an explicit
re-export), and one line that makes that list lazy (PEP 562)::

    from typing import TYPE_CHECKING

    from headlab._lazy import attach

    if TYPE_CHECKING:
        from headlab.models.loading import LoadedModel as LoadedModel
        from headlab.models.loading import load as load

    __getattr__, __dir__, __all__ = attach(__name__, __file__)

``headlab.models.load`` then imports :mod:`headlab.models.loading` on first use, and importing
one module of a package (``headlab.models.names``) runs nothing of its siblings: the package's
``__init__`` never imports torch, whatever its names need. This is the scientific Python
community's lazy-loading convention (SPEC 1, ``lazy_loader.attach_stub``) with the stub kept in
the ``__init__`` itself.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def exported(source: str) -> dict[str, tuple[str, str]]:
    """The names an ``__init__``'s source imports under ``if TYPE_CHECKING:``, each mapped to
    ``(module, name there)``."""
    found: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                if (
                    isinstance(statement, ast.ImportFrom)
                    and statement.module
                    and not statement.level
                ):
                    for alias in statement.names:
                        found[alias.asname or alias.name] = (statement.module, alias.name)
    return found


def attach(
    package: str, init_file: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The ``__getattr__``, ``__dir__`` and ``__all__`` of ``package`` (its ``__init__`` at
    ``init_file``), from the names its ``if TYPE_CHECKING:`` block imports."""
    where = exported(Path(init_file).read_text(encoding="utf-8"))
    names = sorted(where)

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, original = where[name]
        value = getattr(importlib.import_module(module), original)
        setattr(sys.modules[package], name, value)  # the next lookup finds it directly
        return value

    def __dir__() -> list[str]:
        return sorted({*names, *vars(sys.modules[package])})

    return __getattr__, __dir__, names
