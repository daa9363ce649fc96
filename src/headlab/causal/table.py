"""One layers x heads table of values (an effect, a direct logit attribution), ranked: the
shared reading of every causal result."""

from __future__ import annotations

import torch

from headlab.errors import InputError


def cells(table: torch.Tensor) -> list[tuple[int, int, float]]:
    """``(layer, head, value)`` of every defined cell of ``table`` ``(L, H)`` (NaN: none)."""
    return [
        (layer, head, float(v))
        for layer, row in enumerate(table.tolist())
        for head, v in enumerate(row)
        if v == v  # not NaN
    ]


def ranked(table: torch.Tensor) -> list[tuple[int, int, float]]:
    """The defined cells by decreasing absolute value, signed."""
    return sorted(cells(table), key=lambda r: -abs(r[2]))


def top(table: torch.Tensor, k: int) -> list[tuple[int, int, float]]:
    """The ``k`` cells of largest absolute value."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InputError(f"top(k): k must be a whole number of at least 1, got {k!r}")
    return ranked(table)[:k]
