"""Which progress a command shows, on stderr only (stdout stays for ``--json``, ``--csv`` and
tables): :class:`headlab.progress.RichProgress` on a terminal, :class:`headlab.progress.
PlainProgress` lines in a file or a pipe (CI logs, ``2> log``), nothing with ``--quiet`` or on a
torchrun rank other than 0 (``RANK`` set and not ``0``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from headlab.progress import NO_PROGRESS, PlainProgress, Progress, RichProgress


def is_rank_zero() -> bool:
    """Whether this process draws progress: not under torchrun, or its rank 0."""
    rank = os.environ.get("RANK")
    return rank is None or rank.strip() in ("", "0")


@contextmanager
def progress_for(args: argparse.Namespace, prog: str, *, draws: bool = True) -> Iterator[Progress]:
    """The reporter of one command (``prog``: ``headlab roles``...): rich on a terminal,
    plain lines elsewhere, nothing with ``--quiet``, on ranks other than 0, or unless ``draws``
    (the process that writes the result draws). A stage an error cut short is closed on the way
    out."""
    if not draws or getattr(args, "quiet", False) or not is_rank_zero():
        yield NO_PROGRESS
        return
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    reporter: RichProgress | PlainProgress
    if console.is_terminal and not console.is_dumb_terminal:
        reporter = RichProgress(console)
    else:
        reporter = PlainProgress(prog, sys.stderr)
    try:
        yield reporter
    finally:
        reporter.close()
