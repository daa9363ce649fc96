"""The floors of docs/architecture.md hold: no module imports from a floor above its own or from
another package of its own floor, and no import circle, counting imports inside functions.

Read from the source with :mod:`ast` (nothing is imported), so a new upward import fails here with
the module, the line and the floors involved."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from headlab._lazy import exported

SRC = Path(__file__).resolve().parents[1] / "src"

#: each top-level module or package of headlab and its floor (docs/architecture.md)
FLOORS = {
    "_version": 0,
    "_lazy": 0,
    "request": 0,
    "errors": 0,
    "cache": 0,
    "outputs": 0,
    "text": 0,
    "progress": 1,
    "layout": 1,
    "datasets": 1,
    "native": 1,
    "attention": 2,
    "models": 3,
    "distributed": 3,
    "roles": 4,
    "pruning": 4,
    "causal": 4,
    "training": 4,
    "page": 5,
    "experiments": 6,
    "report": 7,
    "explore": 7,
    "serve": 8,
    "cli": 9,
    "__main__": 10,  # python -m headlab: the CLI
    "api": 10,  # the front door's functions
    "": 11,  # headlab/__init__.py: the front door, its names loaded on use
}


@dataclass(frozen=True)
class Import:
    source: str  # headlab.x.y
    target: str  # headlab.a.b (a module, or the package the name came from)
    line: int
    in_function: bool
    typing: bool = False  # under ``if TYPE_CHECKING:``: never run


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / "headlab").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(mods: dict[str, Path], *, third_party: bool = False) -> Iterator[Import]:
    """Every import of headlab's modules (``third_party``: of anything) in ``mods``."""
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for found in _walk(tree, name, package, mods, in_function=False, typing=False):
            if third_party or found.target == "headlab" or found.target.startswith("headlab."):
                yield found


def _walk(
    node: ast.AST,
    name: str,
    package: str,
    mods: dict[str, Path],
    *,
    in_function: bool,
    typing: bool,
) -> Iterator[Import]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield Import(name, alias.name, child.lineno, in_function, typing)
        elif isinstance(child, ast.ImportFrom):
            if child.level:
                parts = package.split(".")
                base = parts[: len(parts) - child.level + 1]
                prefix = ".".join([*base, *([child.module] if child.module else [])])
            else:
                prefix = child.module or ""
            for alias in child.names:
                full = f"{prefix}.{alias.name}"
                target = full if full in mods else _defined_in(prefix, alias.name, mods)
                yield Import(name, target, child.lineno, in_function, typing)
        else:
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            unrun = typing or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            )
            yield from _walk(child, name, package, mods, in_function=inside, typing=unrun)


def _defined_in(package: str, name: str, mods: dict[str, Path]) -> str:
    """The module a package's lazy name comes from (headlab._lazy), else the package."""
    path = mods.get(package)
    if path is None or path.name != "__init__.py":
        return package
    module, _ = exported(path.read_text(encoding="utf-8")).get(name, (package, name))
    return module if module in mods else package


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


MODULES = modules()
IMPORTS = list(imports(MODULES))


def test_every_package_has_a_floor() -> None:
    missing = sorted({top(m) for m in MODULES} - set(FLOORS))
    assert not missing, f"give these a floor in FLOORS and docs/architecture.md: {missing}"


def test_no_import_goes_up_or_sideways() -> None:
    wrong = []
    for imp in IMPORTS:
        here, there = top(imp.source), top(imp.target)
        if here == there:
            continue
        if FLOORS[there] > FLOORS[here] or (FLOORS[there] == FLOORS[here] and FLOORS[here] > 0):
            where = MODULES[imp.source].relative_to(SRC)
            wrong.append(
                f"{where}:{imp.line} imports {imp.target} "
                f"(floor {FLOORS[here]} {here or 'headlab'} -> floor {FLOORS[there]} {there})"
            )
    assert not wrong, "\n".join(wrong)


def test_no_import_circles() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in IMPORTS:
        if imp.target in MODULES and imp.source != "headlab":  # the facade imports on use
            graph[imp.source].add(imp.target)
    circles = _strongly_connected(graph)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in circles)


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively; components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
    ],
)
def test_the_circle_finder_finds_circles(
    graph: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert [sorted(c) for c in _strongly_connected(graph)] == expected


def test_the_floor_check_sees_an_upward_import(tmp_path: Path) -> None:
    """An import from a floor above, written into a copy of a module, is found."""
    fake = {"headlab.models.x": tmp_path / "x.py", "headlab.report.y": tmp_path / "y.py"}
    fake["headlab.models.x"].write_text("def f():\n    from headlab.report.y import g\n")
    fake["headlab.report.y"].write_text("g = 1\n")
    found = list(imports(fake))
    assert found == [Import("headlab.models.x", "headlab.report.y", 2, True)]


#: third-party packages whose import takes seconds (torch alone about two)
HEAVY = frozenset(
    {"torch", "transformers", "accelerate", "matplotlib", "safetensors", "spacy", "playwright"}
)


def heavy_on_import() -> dict[str, frozenset[str]]:
    """The :data:`HEAVY` packages that importing each module runs, through the imports at its
    top (and its packages' ``__init__``), not those inside functions or under TYPE_CHECKING."""
    direct: dict[str, set[str]] = {m: set() for m in MODULES}
    runs: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in imports(MODULES, third_party=True):
        if imp.in_function or imp.typing:
            continue
        root = imp.target.split(".")[0]
        if root in HEAVY:
            direct[imp.source].add(root)
        elif imp.target in MODULES:
            runs[imp.source].add(imp.target)
    for m in MODULES:  # importing headlab.a.b runs headlab/a/__init__.py first
        parts = m.split(".")
        runs[m] |= {".".join(parts[:i]) for i in range(2, len(parts))} & set(MODULES)
    heavy = {}
    for m in MODULES:  # everything the import of m runs (a package and its modules run each other)
        seen, todo = {m}, [m]
        while todo:
            for other in runs[todo.pop()] - seen:
                seen.add(other)
                todo.append(other)
        heavy[m] = frozenset().union(*(direct[s] for s in seen))
    return heavy


def test_functions_import_headlab_only_to_stay_light() -> None:
    """An import of headlab's own modules inside a function is for keeping its module light:
    it must bring a heavy package (torch, matplotlib...) the module does not already import.
    Any other belongs at the module's top, where a reader sees what the module uses."""
    heavy = heavy_on_import()
    wrong = []
    for imp in IMPORTS:
        if not imp.in_function:
            continue
        if not heavy[imp.target] - heavy[imp.source]:
            where = MODULES[imp.source].relative_to(SRC)
            has = ", ".join(sorted(heavy[imp.source])) or "nothing heavy"
            wrong.append(
                f"{where}:{imp.line} imports {imp.target} inside a function; it brings nothing "
                f"heavy that {imp.source} lacks ({has}): import it at the top"
            )
    assert not wrong, "\n".join(wrong)


#: standard-library modules some platforms lack (fcntl: not on Windows), imported where used
PLATFORM_ONLY = frozenset({"fcntl", "msvcrt", "termios", "resource"})


def test_functions_import_the_standard_library_only_at_the_top() -> None:
    """The standard library is light: imported inside a function it only hides what a module
    uses (a module some platforms lack aside)."""
    wrong = []
    for imp in imports(MODULES, third_party=True):
        root = imp.target.split(".")[0]
        if imp.in_function and root in sys.stdlib_module_names and root not in PLATFORM_ONLY:
            where = MODULES[imp.source].relative_to(SRC)
            wrong.append(f"{where}:{imp.line} imports {imp.target} inside a function")
    assert not wrong, "import these at the module's top:\n" + "\n".join(wrong)


def test_the_light_import_check_sees_torch_through_a_module() -> None:
    heavy = heavy_on_import()
    assert "torch" in heavy["headlab.attention.functional"]  # import torch at its top
    assert "torch" in heavy["headlab.models.loading"]  # through headlab.attention
    assert "torch" not in heavy["headlab.cli"]  # headlab --help: tests/cli check it is fast


#: functions still over the limit, at their present length: each may shrink, none may grow
LONG_FUNCTIONS: dict[str, int] = {}
MAX_FUNCTION_LINES = 120


def test_no_function_grows_past_120_lines() -> None:
    long = []
    for path in MODULES.values():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                where = f"{path.relative_to(SRC).as_posix()}:{node.name}"
                if lines > LONG_FUNCTIONS.get(where, MAX_FUNCTION_LINES):
                    long.append(f"{where} has {lines} lines (at most {MAX_FUNCTION_LINES})")
    assert not long, "split these into named steps:\n" + "\n".join(long)
