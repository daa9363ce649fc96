"""How long-running library code reports its progress, without printing.

A run is a sequence of stages (the treebank pass, the GAP pass, each step of a pruning
search...). Library code says when a stage starts, how many of its items are done, and when it
ends, to a :class:`Progress` it is given; what the user sees is up to whoever gave it. Two
reporters a person reads are here, and the command line picks one (``headlab.cli._progress``):

- :class:`RichProgress`, for a terminal: a rich bar per stage, with items per second and the
  time left; each finished stage leaves its bar behind as one line.
- :class:`PlainProgress`, for a file or a pipe: one line per stage when it ends
  (``headlab roles: treebank: 500/500 sentences, 12.3 s (40.6 sentences/s)``), and one with
  the time left every :data:`PLAIN_INTERVAL` seconds of a long stage.

Library calls default to :data:`NO_PROGRESS`, which shows nothing; a notebook can pass
``PlainProgress("roles", sys.stderr)``.

Items are counted per batch, never per row, so a reporter costs nothing next to the work.

Example:
    >>> from headlab.progress import stage
    >>> class Lines:
    ...     def start(self, name, total=None, unit="items"): self.name, self.done = name, 0
    ...     def advance(self, n=1, *, note=None): self.done += n
    ...     def end(self): print(f"{self.name}: {self.done}")
    >>> with stage(Lines(), "pass", 3, "sentences") as p:
    ...     p.advance(2)
    ...     p.advance(1)
    pass: 3
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, Protocol, runtime_checkable

#: seconds between the plain lines of one long stage (its end always gets one)
PLAIN_INTERVAL = 30.0
#: seconds between redraws of the rich bar, drawn between batches (no drawing thread)
RICH_INTERVAL = 0.25


@runtime_checkable
class Progress(Protocol):
    """What a long run tells about itself; stages come one after another, never nested."""

    def start(self, name: str, total: int | None = None, unit: str = "items") -> None:
        """A stage begins: ``total`` items of ``unit`` (``None``: not known in advance)."""

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        """``n`` more items of the current stage are done; ``note``: a short status to show
        beside the count (a loss, a metric), replacing the previous one."""

    def end(self) -> None:
        """The current stage finished. Not called when the stage raised."""


class NoProgress:
    """A :class:`Progress` that shows nothing: the default of every library call."""

    def start(self, name: str, total: int | None = None, unit: str = "items") -> None:
        pass

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        pass

    def end(self) -> None:
        pass


NO_PROGRESS = NoProgress()


@contextmanager
def stage(
    progress: Progress | None, name: str, total: int | None = None, unit: str = "items"
) -> Iterator[Progress]:
    """Run one stage of ``progress`` (``None``: :data:`NO_PROGRESS`): ``start`` on entry,
    ``end`` on a normal exit; yields the reporter to ``advance``."""
    reporter = NO_PROGRESS if progress is None else progress
    reporter.start(name, total, unit)
    yield reporter
    reporter.end()


class Prefixed:
    """A :class:`Progress` that names each stage ``"<prefix>: <name>"`` on ``inner``: one
    workflow run several times (each method of a comparison, each part of a longer run)."""

    def __init__(self, inner: Progress | None, prefix: str) -> None:
        self.inner = NO_PROGRESS if inner is None else inner
        self.prefix = prefix

    def start(self, name: str, total: int | None = None, unit: str = "items") -> None:
        self.inner.start(f"{self.prefix}: {name}", total, unit)

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        self.inner.advance(n, note=note)

    def end(self) -> None:
        self.inner.end()


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
    """One rich bar per stage on ``console`` (a terminal); what a terminal shows.

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
        self.stream.write(line + "\n")
        self.stream.flush()
