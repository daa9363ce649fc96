"""Argument types of the CLI: values checked while parsing, before any work.

Each type refuses what would otherwise be silently replaced (an empty ``--word`` taken for the
default) or fail deep inside a run (a seed that overflows, a count that exhausts memory); argparse
then prints the usage and one ``error:`` line naming the option, what it expects and what came.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TypeVar

#: bootstrap resamples ``roles`` and ``report`` take: headlab.roles.workflow.MAX_REPLICATES,
#: repeated so that parsing never imports torch (a test keeps the two equal)
MAX_REPLICATES = 100_000

#: seeds go to torch and to NumPy-style generators: both take every value below 2^32
MAX_SEED = 2**32 - 1


def text(what: str = "a value") -> Callable[[str], str]:
    """A string that is not empty or only spaces."""

    def parse(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"expected {what}, got an empty string")
        return value

    return parse


def integer(low: int, high: int) -> Callable[[str], int]:
    """An integer in ``[low, high]``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer in {low:,}..{high:,}, got {value!r}"
            ) from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(
                f"expected an integer in {low:,}..{high:,}, got {number:,}"
            )
        return number

    return parse


def number(low: float | None = None, high: float | None = None) -> Callable[[str], float]:
    """A finite float (not nan or inf) in ``[low, high]`` where given."""

    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
        if not math.isfinite(x):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
        if (low is not None and x < low) or (high is not None and x > high):
            span = f"{'-inf' if low is None else low}..{'inf' if high is None else high}"
            raise argparse.ArgumentTypeError(f"expected a number in {span}, got {x}")
        return x

    return parse


seed = integer(0, MAX_SEED)

T = TypeVar("T")


def share(*, one: bool) -> Callable[[str], float]:
    """A share in (0, 1] (``one``) or (0, 1)."""
    span = "(0, 1]" if one else "(0, 1)"

    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a share in {span}, got {value!r}") from None
        if not (0.0 < x <= 1.0 if one else 0.0 < x < 1.0):
            raise argparse.ArgumentTypeError(f"expected a share in {span}, got {value!r}")
        return x

    return parse


def listed(
    one: Callable[[str], T], what: str, example: str, count: int | None = None
) -> Callable[[str], tuple[T, ...]]:
    """Values separated by commas or spaces (``count`` of them where given), each checked by
    ``one``; ``what`` and ``example`` say what is expected (``"edge counts separated by
    commas"``, ``"10,100,1000"``)."""

    def parse(value: str) -> tuple[T, ...]:
        parts = re.split(r"\s*,\s*|\s+", value.strip())
        expected = f"expected {what}, like {example}"
        if "" in parts or (count is not None and len(parts) != count):
            raise argparse.ArgumentTypeError(f"{expected}, got {value!r}")
        try:
            return tuple(one(p) for p in parts)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{expected}; {exc}") from None

    return parse
