"""Argument types of the CLI: values checked while parsing, before any work.

Each type refuses what would otherwise be silently replaced (an empty ``--word`` taken for the
default) or fail deep inside a run (a seed that overflows, a count that exhausts memory); argparse
then prints the usage and one ``error:`` line naming the option, what it expects and what came.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from headlab.errors import InputError

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


def chosen_layers(
    args: argparse.Namespace,
    lm: Any,
    layers: list[int],
    what: str = "layers",
    flat: list[int] | None = None,
) -> list[int]:
    """``--layer`` (default all of ``layers``), checked, and ``--head`` checked."""

    chosen = args.layer or layers
    for layer in chosen:
        if layer not in layers:
            raise InputError(
                f"--layer {layer} out of range: {lm.name} has {what} 0..{len(layers) - 1}"
            )
    counts = lm.layout.heads_per_layer  # fewer in some layers of a model pruned layer by layer
    most = max(counts[flat[layer] if flat else layer] for layer in chosen)
    for head in args.head or []:
        if not 0 <= head < most:
            raise InputError(f"--head {head} out of range: {lm.name} has heads 0..{most - 1}")
    return chosen
