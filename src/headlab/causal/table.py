"""One layers x heads table of values (an effect, a direct logit attribution), ranked and
correlated with another: the shared reading of every causal result."""

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


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of two ``(L, H)`` effect tables over the heads both have."""
    x, y = a.flatten().double(), b.flatten().double()
    keep = ~(x.isnan() | y.isnan())
    x, y = x[keep] - x[keep].mean(), y[keep] - y[keep].mean()
    denominator = float(x.norm() * y.norm())
    return float((x * y).sum()) / denominator if denominator > 0 else float("nan")


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Average ranks (ties share the mean of their ranks), as Spearman's rho uses them."""
    order = torch.argsort(x, stable=True)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=x.dtype)
    for value in torch.unique(x):
        same = x == value
        if int(same.sum()) > 1:
            ranks[same] = ranks[same].mean()
    return ranks


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two ``(L, H)`` effect tables over the heads both have."""
    x, y = a.flatten().double(), b.flatten().double()
    keep = ~(x.isnan() | y.isnan())
    return pearson(_ranks(x[keep]), _ranks(y[keep]))


def correlations(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """``{"pearson", "spearman"}`` of two effect tables."""
    return {"pearson": pearson(a, b), "spearman": spearman(a, b)}
