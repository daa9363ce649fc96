"""What a command shows a person: tables and lines, built by the library from a result and
printed by the CLI (``headlab.cli._output.show``), so that a command is parse, call, print, and
a notebook can show the same text without the CLI.

A :class:`TextTable` is plain data (strings already formatted); rendering, colour and width are
the printer's business.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TextTable:
    """One table: ``columns`` headers, ``rows`` of already formatted cells.

    Attributes:
        right: indices of the columns justified right (numbers).
        fold: indices of the columns whose long cells wrap instead of being cut.
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    title: str | None = None
    caption: str | None = None
    right: frozenset[int] = frozenset()
    fold: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"a row of {len(row)} cells in a table of {len(self.columns)}")


#: what a command prints, in order: a table or a line of text
Part = TextTable | str


def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    title: str | None = None,
    caption: str | None = None,
    right: Iterable[int] = (),
    fold: Iterable[int] = (),
) -> TextTable:
    """A :class:`TextTable` from lists (each cell converted to ``str``)."""
    return TextTable(
        columns=tuple(columns),
        rows=tuple(tuple(str(c) for c in row) for row in rows),
        title=title,
        caption=caption,
        right=frozenset(right),
        fold=frozenset(fold),
    )


def human_bytes(n: float) -> str:
    """``131072`` -> ``"128.0 KiB"``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def human_count(n: float) -> str:
    """``1342177280`` -> ``"1.34 G"``."""
    value = float(n)
    for unit in ("", " k", " M", " G", " T"):
        if abs(value) < 1000 or unit == " T":
            return f"{value:.0f}" if unit == "" else f"{value:.2f}{unit}"
        value /= 1000
    raise AssertionError("unreachable")  # pragma: no cover
