"""What a command shows a person (:mod:`headlab.text`), printed by the CLI's one printer."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from headlab.cli._output import show
from headlab.text import human_bytes, human_count, table


def _printed(parts) -> str:  # type: ignore[no-untyped-def]
    buffer = io.StringIO()
    show(parts, Console(file=buffer, width=100, highlight=False, color_system=None))
    return buffer.getvalue()


def test_tables_and_lines_print_in_order_numbers_to_the_right() -> None:
    parts = [
        "first line",
        table(
            ("head", "effect"), [("0.1", "+0.50"), ("23.10", "-12.25")], title="heads", right=(1,)
        ),
        "last line",
    ]
    text = _printed(parts)
    assert text.index("first line") < text.index("heads") < text.index("last line")
    rows = [line for line in text.splitlines() if "0.1 " in line or "23.10" in line]
    # right-justified: the numbers end in the same column
    ends = [len(line.rstrip().rstrip("│").rstrip()) for line in rows]
    assert len(rows) == 2 and ends[0] == ends[1]


def test_a_row_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(ValueError, match="a row of 1 cells in a table of 2"):
        table(("a", "b"), [("only one",)])


def test_human_units() -> None:
    assert human_bytes(131072) == "128.0 KiB" and human_bytes(512) == "512 B"
    assert human_count(1_342_177_280) == "1.34 G" and human_count(999) == "999"
