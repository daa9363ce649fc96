"""Shared output helpers of the CLI: JSON to stdout, tables through rich, human units."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from headlab.roles.folds import small_data_notes
from headlab.text import Part, human_bytes, human_count

__all__ = ["console", "emit_json", "human_bytes", "human_count", "show"]


def emit_json(data: Any) -> None:
    """Write ``data`` as indented JSON to stdout."""
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


#: the width of tables written to a file or a pipe, where no terminal says how wide it is
#: (rich would cut every table to 80 columns, numbers included); ``COLUMNS`` still wins
PIPE_WIDTH = 200


def console() -> Any:
    """A rich console on stdout (rich honours NO_COLOR and plain pipes); tables written to a
    file or pipe get :data:`PIPE_WIDTH` columns, so no number is cut."""

    from rich.console import Console

    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(highlight=False, width=width)


def show(parts: Iterable[Part], out: Any = None) -> None:
    """Print what the library built for a person (:mod:`headlab.text`): each table through
    rich, each line as it is (rich markup in it is read as markup)."""
    from rich.table import Table

    out = out or console()
    for part in parts:
        if isinstance(part, str):
            out.print(part)
            continue
        t = Table(title=part.title, caption=part.caption)
        for i, name in enumerate(part.columns):
            t.add_column(
                name,
                justify="right" if i in part.right else "left",
                overflow="fold" if i in part.fold else "ellipsis",
            )
        for row in part.rows:
            t.add_row(*row)
        out.print(t)


def output(
    args: Any,
    data: Any,
    parts: Callable[[], Iterable[Part]],
    csv: Callable[[], str] | None = None,
) -> None:
    """``data`` as JSON with ``--json``, ``csv()`` with ``--csv``, else the tables and lines
    the library's ``parts()`` builds for a person."""
    if getattr(args, "json", False):
        emit_json(data)
    elif csv is not None and getattr(args, "csv", False):
        sys.stdout.write(csv())
    else:
        show(parts())


def note(prog: str, line: str, kind: str = "note: ") -> None:
    """``prog: note: line`` on stderr, at once (``kind=""``: a plain status line)."""
    print(f"{prog}: {kind}{line}", file=sys.stderr, flush=True)


def data_notes(prog: str, data: dict[str, Any], folds_off: str | None, replicates: int) -> None:
    """One line on stderr for each way the role statistics fell back on small data
    (:func:`headlab.roles.folds.small_data_notes`)."""
    for line in small_data_notes(data, folds_off, replicates):
        note(prog, line)


def native_note(prog: str) -> None:
    """One line on stderr when headlab's native row kernels cannot be built here (not when
    they are off by design): head statistics then run on torch's ops alone, more slowly."""
    from headlab.attention.blocks.backend import cpu_kernels_missing

    reason = cpu_kernels_missing()
    if reason is not None:
        note(
            prog,
            f"{reason}; head statistics use torch's ops (slower). HEADLAB_NATIVE=0 silences this.",
        )
