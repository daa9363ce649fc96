"""Which heads may go, and how a projection loses its rows or columns.

Shared by :meth:`MultiHeadAttention.prune_heads` and the per-family adapters that prune real
models. Rule: under MHA any heads may go; under GQA/MQA the key/value heads must stay shared by
equal groups, so either whole groups go (the key/value head with its query heads) or the same
number of query heads goes from every remaining group. A layer always keeps at least one head.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from headlab.errors import PruningError


def plan_removal(
    n_heads: int, n_kv_heads: int, remove: Iterable[int], *, where: str = "the layer"
) -> tuple[list[int], list[int]]:
    """``(kept query heads, kept KV heads)`` after removing ``remove``, or a PruningError."""
    gone = sorted({int(h) for h in remove})
    bad = [h for h in gone if not 0 <= h < n_heads]
    if bad:
        raise PruningError(f"{where}: head indices must be in [0, {n_heads}), got {bad}")
    if len(gone) == n_heads:
        raise PruningError(
            f"{where}: removing all {n_heads} heads would leave no attention; a layer keeps at "
            "least one head (headlab does not remove layers)"
        )
    keep = [h for h in range(n_heads) if h not in set(gone)]
    group = n_heads // n_kv_heads
    per_group = [sum(1 for h in keep if h // group == g) for g in range(n_kv_heads)]
    if len({n for n in per_group if n > 0}) != 1:
        raise PruningError(
            f"{where}: removing heads {gone} leaves KV groups with unequal query heads "
            f"{per_group}; remove whole groups of {group} or the same number from each group"
        )
    keep_kv = [g for g in range(n_kv_heads) if per_group[g] > 0]
    return keep, keep_kv


def head_rows(
    heads: Iterable[int], head_dim: int, *, offset: int = 0, stride: int = 0
) -> torch.Tensor:
    """Row indices of ``heads`` in a projection laid out head after head.

    ``stride`` is each head's block size when it differs from ``head_dim`` (GPT-NeoX interleaves
    ``[q | k | v]`` per head, blocks of ``3 * head_dim``).
    """
    block = stride or head_dim
    idx = [torch.arange(offset + h * block, offset + h * block + block) for h in heads]
    return torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long)


@torch.no_grad()
def linear_rows(linear: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    """A new ``nn.Linear`` with only the given output rows (and their bias)."""
    rows = rows.to(linear.weight.device)
    new = nn.Linear(
        linear.in_features,
        rows.numel(),
        linear.bias is not None,
        device=linear.weight.device,
        dtype=linear.weight.dtype,
    )
    new.weight.copy_(linear.weight[rows])
    if linear.bias is not None and new.bias is not None:
        new.bias.copy_(linear.bias[rows])
    return new


@torch.no_grad()
def linear_columns(linear: nn.Linear, cols: torch.Tensor) -> nn.Linear:
    """A new ``nn.Linear`` reading only the given input columns (bias kept whole)."""
    cols = cols.to(linear.weight.device)
    new = nn.Linear(
        cols.numel(),
        linear.out_features,
        linear.bias is not None,
        device=linear.weight.device,
        dtype=linear.weight.dtype,
    )
    new.weight.copy_(linear.weight[:, cols])
    if linear.bias is not None and new.bias is not None:
        new.bias.copy_(linear.bias)
    return new
