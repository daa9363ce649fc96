"""Shared output helpers of the CLI: JSON to stdout, tables through rich, human units."""

from __future__ import annotations

import json
import sys
from typing import Any


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
    import os

    from rich.console import Console

    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(highlight=False, width=width)


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


def data_notes(prog: str, data: dict[str, Any], folds_off: str | None, replicates: int) -> None:
    """One line on stderr for each way the role statistics fell back on small data
    (:func:`headlab.roles.folds.small_data_notes`)."""
    from headlab.roles.folds import small_data_notes

    for note in small_data_notes(data, folds_off, replicates):
        print(f"{prog}: note: {note}", file=sys.stderr, flush=True)


def native_note(prog: str) -> None:
    """One line on stderr when headlab's native row kernels cannot be built here (not when
    they are off by design): head statistics then run on torch's ops alone, more slowly."""
    from headlab.attention.blocks import cpu_kernels_missing

    reason = cpu_kernels_missing()
    if reason is not None:
        print(
            f"{prog}: note: {reason}; head statistics use torch's ops (slower). "
            "HEADLAB_NATIVE=0 silences this.",
            file=sys.stderr,
            flush=True,
        )
