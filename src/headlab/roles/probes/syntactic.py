"""Syntactic heads: attention that follows dependency arcs.

Clark et al. (2019, section 4.1, Table 1): for each relation, the share of gold arcs where a head's
word-level attention argmax (self and special tokens excluded) goes from the dependent to its head
word, and, in the other direction, from a head word to one of its dependents of that relation.
The baseline is the best fixed offset (always predict the word ``k`` places away), computed the
same way on the same arcs. Relations are full UD labels (``nmod:poss`` apart from ``nmod``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headlab.roles.bootstrap import Sums, ratio

#: the relations the report always shows (when the treebank has them)
CORE_RELATIONS = (
    "nsubj",
    "obj",
    "iobj",
    "amod",
    "det",
    "case",
    "advmod",
    "aux",
    "mark",
    "compound",
    "nmod",
    "obl",
    "conj",
    "cc",
    "ccomp",
    "xcomp",
    "acl",
    "nummod",
    "cop",
    "nmod:poss",
)
DIRECTIONS = ("dependent_to_head", "head_to_dependent")
MAX_OFFSET = 20
OFFSETS = tuple(k for k in range(-MAX_OFFSET, MAX_OFFSET + 1) if k != 0)
_OFFSET_INDEX = {k: i for i, k in enumerate(OFFSETS)}


def sentence_counts(
    heads: Sequence[int], relations: Sequence[int], n_relations: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gold arc counts ``(R, 2)`` and fixed-offset baseline hits ``(R, 2, offsets)`` of a sentence.

    ``heads`` are 0-based word indices (-1 root), ``relations`` relation ids (-1: not counted).
    """
    n = len(heads)
    n_offsets = len(OFFSETS)
    # flat cell indices, one entry per count: a bincount builds each tensor at once (a nested
    # list of R x 80 zeros per sentence cost more than everything else here)
    count_cells: list[int] = []  # r * 2 + direction
    base_cells: list[int] = []  # (r * 2 + direction) * offsets + offset
    dependents: dict[tuple[int, int], set[int]] = {}
    for d, (h, r) in enumerate(zip(heads, relations, strict=True)):
        if h < 0 or r < 0:
            continue
        count_cells.append(r * 2)
        if 0 < abs(h - d) <= MAX_OFFSET:
            base_cells.append(r * 2 * n_offsets + _OFFSET_INDEX[h - d])
        dependents.setdefault((h, r), set()).add(d)
    for (h, r), deps in dependents.items():
        count_cells.append(r * 2 + 1)
        for d in deps:  # the offsets at which h finds a dependent of this relation
            k = d - h
            if 0 < abs(k) <= MAX_OFFSET and 0 <= d < n:
                base_cells.append((r * 2 + 1) * n_offsets + _OFFSET_INDEX[k])
    counts = torch.bincount(torch.tensor(count_cells, dtype=torch.long), minlength=n_relations * 2)
    base = torch.bincount(
        torch.tensor(base_cells, dtype=torch.long), minlength=n_relations * 2 * n_offsets
    )
    return (
        counts.float().view(n_relations, 2),
        base.float().view(n_relations, 2, n_offsets),
    )


def collect(
    word_argmax: torch.Tensor, gold_head: torch.Tensor, relation: torch.Tensor, n_relations: int
) -> torch.Tensor:
    """Arc hits ``(B, H, R, 2)`` from word_argmax ``(B, H, W)``.

    ``gold_head`` ``(B, W)``: each word's gold head word (batch word index, -1 none);
    ``relation`` ``(B, W)``: its relation id (``n_relations`` when not counted).
    """
    n_batch, n_heads, n_words = word_argmax.shape
    to_head = (word_argmax == gold_head[:, None, :]).float()  # (B, H, W)
    flat = word_argmax.reshape(n_batch, -1)
    head_of_target = gold_head.gather(1, flat).view(n_batch, n_heads, n_words)
    to_dependent = (head_of_target == torch.arange(n_words)).float()  # target's head is me
    target_relation = relation.gather(1, flat).view(n_batch, n_heads, n_words)
    shape = (n_batch, n_heads, n_relations + 1)  # the last slot collects "no relation"
    dep_hits = to_head.new_zeros(shape).scatter_add_(
        2, relation[:, None, :].expand(-1, n_heads, -1), to_head
    )[..., :n_relations]
    head_hits = to_head.new_zeros(shape).scatter_add_(2, target_relation, to_dependent)[
        ..., :n_relations
    ]
    return torch.stack([dep_hits, head_hits], dim=-1)


def scores(sums: Sums) -> dict[str, torch.Tensor]:
    """Per relation and direction: ``accuracy (R+1, L, H, Rel, 2)``, ``baseline (R+1, Rel, 2)``,
    ``baseline_offset (R+1, Rel, 2)`` and ``count (R+1, Rel, 2)``."""
    counts = sums.get("syntactic.count")  # (R+1, Rel, 2)
    accuracy = ratio(sums.get("syntactic.hits"), counts[:, None, None])
    base = ratio(sums.get("syntactic.baseline"), counts[..., None])  # (R+1, Rel, 2, K)
    best, where = base.nan_to_num(-1.0).max(-1)
    return {
        "accuracy": accuracy,
        "baseline": torch.where(counts > 0, best, torch.nan),
        "baseline_offset": torch.tensor(OFFSETS)[where],
        "count": counts,
    }
