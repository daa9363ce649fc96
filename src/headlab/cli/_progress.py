"""Progress of long commands, on stderr only (stdout stays for ``--json``/``--csv`` and tables).

- stderr a terminal: a rich bar per stage, with items per second and the time left; each
  finished stage leaves its bar behind as one line.
- stderr a file or a pipe (CI logs, ``2> log``): one plain line per stage when it ends
  (``headlab roles: treebank: 500/500 sentences, 12.3 s (40.6 sentences/s)``), and a line with
  the time left every :data:`PLAIN_INTERVAL` seconds of a long stage.
- ``--quiet``, or a torchrun rank other than 0 (``RANK`` set and not ``0``): nothing.

Library code never prints: it reports to the :class:`headlab.progress.Progress` made here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

from headlab.progress import NO_PROGRESS, Progress

#: seconds between the plain lines of one long stage (its end always gets one)
PLAIN_INTERVAL = 30.0
#: seconds between redraws of the rich bar, drawn between batches (no drawing thread)
RICH_INTERVAL = 0.25


def is_rank_zero() -> bool:
    """Whether this process draws progress: not under torchrun, or its rank 0."""
    rank = os.environ.get("RANK")
    return rank is None or rank.strip() in ("", "0")


@contextmanager
def progress_for(args: argparse.Namespace, prog: str) -> Iterator[Progress]:
    """The reporter of one command (``prog``: ``headlab roles``...): rich on a terminal,
    plain lines elsewhere, nothing with ``--quiet`` or on ranks other than 0. A stage an error
    cut short is closed on the way out."""
    if getattr(args, "quiet", False) or not is_rank_zero():
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


def _columns() -> tuple[Any, ...]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        ProgressColumn,
        Task,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        """Items per second: the recent rate while running, the stage's mean once done."""

        def render(self, task: Task) -> Text:
            unit = task.fields.get("unit", "items")
            if task.finished and task.elapsed:
                speed: float | None = task.completed / task.elapsed
            else:
                speed = task.speed
            shown = "?" if speed is None else f"{speed:,.1f}"
            return Text(f"{shown} {unit}/s", style="progress.data.speed")

    return (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        TextColumn("•"),
        RateColumn(),
        TextColumn("•"),
        TimeElapsedColumn(),
        TextColumn("elapsed •"),
        TimeRemainingColumn(),
        TextColumn("left in this stage"),
        TextColumn("{task.fields[note]}"),
    )


class RichProgress:
    """One rich bar per stage on ``console`` (a terminal); see the module docstring.

    The bar is redrawn from :meth:`advance`, at most every :data:`RICH_INTERVAL` seconds, not
    by rich's refresh thread: on a CPU whose cores all run torch's threads, a thread that
    wakes ten times a second stalls each parallel loop it lands in.
    """

    def __init__(self, console: Any, *, interval: float = RICH_INTERVAL) -> None:
        self.console = console
        self.interval = interval
        self._bar: Any = None
        self._task: Any = None
        self._drawn = 0.0

    def start(self, name: str, total: int | None = None, unit: str = "items") -> None:
        from rich.progress import Progress as Bar

        self.close()
        self._bar = Bar(*_columns(), console=self.console, transient=False, auto_refresh=False)
        self._task = self._bar.add_task(name, total=total, unit=unit, note="")
        self._bar.start()
        self._bar.refresh()
        self._drawn = time.monotonic()

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        if self._bar is None:
            return
        if note is None:
            self._bar.advance(self._task, n)
        else:
            self._bar.update(self._task, advance=n, note=note)
        now = time.monotonic()
        if now - self._drawn >= self.interval:
            self._drawn = now
            self._bar.refresh()

    def end(self) -> None:
        if self._bar is not None:
            task = self._bar.tasks[0]
            if task.total is None or task.completed > task.total:  # the total was a guess
                self._bar.update(self._task, total=task.completed)
        self.close()

    def close(self) -> None:
        """Stop drawing (the last frame stays on the terminal)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = self._task = None


class PlainProgress:
    """One line per stage on ``stream``, and one every ``interval`` seconds of a long stage."""

    def __init__(
        self,
        prog: str,
        stream: IO[str],
        *,
        interval: float = PLAIN_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prog, self.stream, self.interval, self.clock = prog, stream, interval, clock
        self._name: str | None = None
        self._total: int | None = None
        self._unit = "items"
        self._done = 0
        self._note: str | None = None
        self._began = self._last = 0.0
        self._seen = (0.0, 0)  # (time, items) at the last line: the recent rate's start

    def start(self, name: str, total: int | None = None, unit: str = "items") -> None:
        self._name, self._total, self._unit = name, total, unit
        self._done, self._note = 0, None
        self._began = self._last = self.clock()
        self._seen = (self._began, 0)

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        if self._name is None:
            return
        self._done += n
        if note is not None:
            self._note = note
        now = self.clock()
        unfinished = self._total is None or self._done < self._total  # else end() says it
        if unfinished and now - self._last >= self.interval:
            self._last = now
            self._write(now, final=False)

    def end(self) -> None:
        if self._name is not None:
            self._write(self.clock(), final=True)
        self._name = None

    def close(self) -> None:
        """Forget a stage an error cut short (its line would claim it ended)."""
        self._name = None

    def _write(self, now: float, *, final: bool) -> None:
        elapsed = now - self._began
        unit, done, total = self._unit, self._done, self._total
        if total is None or (final and done >= total):
            count = f"{done:,} {unit}"
        else:
            count = f"{done:,}/{total:,} {unit}"
        line = f"{self.prog}: {self._name}: {count}, {elapsed:.1f} s"
        rate = done / elapsed if elapsed > 0 else None
        # the time left follows this stage's recent speed (items late in a stage, such as the
        # longest sentences, can cost more than the first), and says it is this stage's
        since, before = self._seen
        recent = (done - before) / (now - since) if now > since and done > before else rate
        self._seen = (now, done)
        if rate:
            line += f" ({rate:,.1f} {unit}/s"
            if not final and total is not None and total > done and recent:
                line += f", about {(total - done) / recent:,.0f} s left in this stage"
            line += ")"
        if self._note:
            line += f"; {self._note}"
        print(line, file=self.stream, flush=True)
