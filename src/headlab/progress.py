"""How long-running library code reports its progress, without printing.

A run is a sequence of stages (the treebank pass, the GAP pass, each step of a pruning
search...). Library code says when a stage starts, how many of its items are done, and when it
ends, to a :class:`Progress` it is given; what the user sees is up to whoever gave it. The
command line gives a rich bar on a terminal and one plain line per stage elsewhere
(``headlab.cli._progress``); library callers get :data:`NO_PROGRESS`, which does nothing.

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

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable


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
