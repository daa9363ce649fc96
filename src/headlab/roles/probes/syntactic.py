"""Syntactic heads: attention that follows dependency arcs.

Clark et al. (2019, section 4.1, Table 1): for each relation, the share of gold arcs where a head's
word-level attention argmax (self and special tokens excluded) goes from the dependent to its head
word, and, in the other direction, from a head word to one of its dependents of that relation.
The baseline is the best fixed offset (always predict the word ``k`` places away), computed the
same way on the same arcs. Relations are full UD labels (``nmod:poss`` apart from ``nmod``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
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


def sentence_counts(
    heads: Sequence[int], relations: Sequence[int], n_relations: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gold arc counts ``(R, 2)`` and fixed-offset baseline hits ``(R, 2, offsets)`` of a sentence.

    ``heads`` are 0-based word indices (-1 root), ``relations`` relation ids (-1: not counted).
    Dependent to head: one count per arc, a baseline hit at offset ``head - dependent``. Head to
    dependent: one count per (head word, relation) pair; its baseline offsets are those at which
    the head finds a dependent of that relation (``dependent - head``), one hit each.
    """
    n_offsets = len(OFFSETS)
    head = np.asarray(heads, dtype=np.int64)
    rel = np.asarray(relations, dtype=np.int64)
    arc = (head >= 0) & (rel >= 0)
    dep = np.flatnonzero(arc)
    head, rel = head[arc], rel[arc]
    pairs = np.unique(head * n_relations + rel) % n_relations  # one per (head, relation)
    counts = np.bincount(rel * 2, minlength=n_relations * 2)
    counts += np.bincount(pairs * 2 + 1, minlength=n_relations * 2)
    offset = head - dep  # dependent to head; head to dependent is -offset
    near = (offset != 0) & (np.abs(offset) <= MAX_OFFSET)
    offset, rel = offset[near], rel[near]
    # OFFSETS skips 0: index k + MAX_OFFSET below it, k + MAX_OFFSET - 1 above
    to_head = offset + MAX_OFFSET - (offset > 0)
    to_dep = -offset + MAX_OFFSET - (offset < 0)
    cells = np.concatenate([(rel * 2) * n_offsets + to_head, (rel * 2 + 1) * n_offsets + to_dep])
    base = np.bincount(cells, minlength=n_relations * 2 * n_offsets)
    return (
        torch.from_numpy(counts).float().view(n_relations, 2),
        torch.from_numpy(base).float().view(n_relations, 2, n_offsets),
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
    me = torch.arange(n_words, device=word_argmax.device)
    to_dependent = (head_of_target == me).float()  # the target's head is me
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
        "baseline_offset": torch.tensor(OFFSETS, device=where.device)[where],
        "count": counts,
    }
