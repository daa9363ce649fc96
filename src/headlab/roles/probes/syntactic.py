"""Syntactic heads: attention that follows dependency arcs.

Clark et al. (2019, section 4.1, Table 1): for each relation, the share of gold arcs where a head's
word-level attention argmax (self and special tokens excluded) goes from the dependent to its head
word, and, in the other direction, from a head word to one of its dependents of that relation.
The baseline is the best fixed offset (always predict the word ``k`` places away), computed the
same way on the same arcs. Relations are full UD labels (``nmod:poss`` apart from ``nmod``).

The offset is chosen once per relation and direction, on all the gold sentences (it is a
property of the gold trees, not of the model), and every fold and resample scores the same
offset; the pass also counts, per head, the arcs where the head *and* that offset are right, so
the head and the baseline can be compared arc by arc (the exact McNemar test in
:mod:`headlab.roles.stats`).

Only relations of :data:`RELATION_SET`, fixed in advance, can make a head syntactic; the others are
measured and shown, marked as outside the set.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from headlab.roles.bootstrap import Sums, ratio

#: the relations that can make a head syntactic, fixed before any data is seen (docs/roles.md):
#: Clark et al. (2019)'s Table 1 relations and the core UD v2 relations, in UD v2 names
RELATION_SET = (
    "nsubj",
    "obj",
    "iobj",
    "csubj",
    "ccomp",
    "xcomp",
    "obl",
    "advmod",
    "aux",
    "aux:pass",
    "cop",
    "mark",
    "det",
    "amod",
    "nmod",
    "nmod:poss",
    "nummod",
    "case",
    "compound",
    "compound:prt",
    "conj",
    "cc",
    "acl",
    "advcl",
)
DIRECTIONS = ("dependent_to_head", "head_to_dependent")
MAX_OFFSET = 20
OFFSETS = tuple(k for k in range(-MAX_OFFSET, MAX_OFFSET + 1) if k != 0)


def sentence_counts(
    heads: Sequence[int], relations: Sequence[int], n_relations: int, *, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gold arc counts ``(R, 2)`` and fixed-offset baseline hits ``(R, 2, offsets)`` of a sentence.

    ``heads`` are 0-based word indices (-1 root), ``relations`` relation ids (-1: not counted).
    Dependent to head: one count per arc, a baseline hit at offset ``head - dependent``. Head to
    dependent: one count per (head word, relation) pair; its baseline offsets are those at which
    the head finds a dependent of that relation (``dependent - head``), one hit each.

    ``causal``: a word sees only the words before it, so only arcs whose target is to the left
    of the attending word count: dependent to head where the head comes first, head to
    dependent for the (head word, relation) pairs with a dependent before the head, and the
    baseline's offsets on those arcs only (all negative).
    """
    n_offsets = len(OFFSETS)
    head = np.asarray(heads, dtype=np.int64)
    rel = np.asarray(relations, dtype=np.int64)
    arc = (head >= 0) & (rel >= 0)
    dep = np.flatnonzero(arc)
    head, rel = head[arc], rel[arc]
    left_head = head < dep if causal else np.ones(len(dep), dtype=bool)
    left_dep = dep < head if causal else np.ones(len(dep), dtype=bool)
    # one per (head, relation)
    pairs = np.unique(head[left_dep] * n_relations + rel[left_dep]) % n_relations
    counts = np.bincount(rel[left_head] * 2, minlength=n_relations * 2)
    counts += np.bincount(pairs * 2 + 1, minlength=n_relations * 2)
    offset = head - dep  # dependent to head; head to dependent is -offset
    near = (offset != 0) & (np.abs(offset) <= MAX_OFFSET)
    # OFFSETS skips 0: index k + MAX_OFFSET below it, k + MAX_OFFSET - 1 above
    up, down = near & left_head, near & left_dep
    to_head = offset[up] + MAX_OFFSET - (offset[up] > 0)
    to_dep = -offset[down] + MAX_OFFSET - (offset[down] < 0)
    cells = np.concatenate(
        [(rel[up] * 2) * n_offsets + to_head, (rel[down] * 2 + 1) * n_offsets + to_dep]
    )
    base = np.bincount(cells, minlength=n_relations * 2 * n_offsets)
    return (
        torch.from_numpy(counts).float().view(n_relations, 2),
        torch.from_numpy(base).float().view(n_relations, 2, n_offsets),
    )


def offset_index(offset: int) -> int:
    """Index of ``offset`` in :data:`OFFSETS`, or -1 beyond :data:`MAX_OFFSET` (or 0)."""
    if offset == 0 or abs(offset) > MAX_OFFSET:
        return -1
    return offset + MAX_OFFSET - (offset > 0)


def best_offsets(
    heads: Sequence[Sequence[int]],
    relations: Sequence[Sequence[int]],
    n_relations: int,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """The best fixed offset ``(R, 2)`` (an index into :data:`OFFSETS`) of each relation and
    direction over the sentences' gold trees (relation ids and ``causal`` as
    :func:`sentence_counts`)."""
    base = torch.zeros(n_relations, 2, len(OFFSETS), dtype=torch.float64)
    for h, r in zip(heads, relations, strict=True):
        base += sentence_counts(h, r, n_relations, causal=causal)[1].double()
    return base.argmax(-1)


def baseline_flags(
    heads: Sequence[int], relations: Sequence[int], offsets: torch.Tensor
) -> tuple[list[bool], list[set[int]]]:
    """Where the chosen offsets are right in one sentence.

    Returns, per word, whether the dependent-to-head offset of its arc is right, and the set of
    relations for which the word, as a head, has a dependent at the head-to-dependent offset.
    """
    to_head = [False] * len(heads)
    to_dep: list[set[int]] = [set() for _ in heads]
    for dep, (head, rel) in enumerate(zip(heads, relations, strict=True)):
        if head < 0 or rel < 0:
            continue
        if offset_index(head - dep) == int(offsets[rel, 0]):
            to_head[dep] = True
        if offset_index(dep - head) == int(offsets[rel, 1]):
            to_dep[head].add(rel)
    return to_head, to_dep


def collect(
    word_argmax: torch.Tensor,
    gold_head: torch.Tensor,
    relation: torch.Tensor,
    n_relations: int,
    base_to_head: torch.Tensor | None = None,
    base_to_dep: torch.Tensor | None = None,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """Arc hits ``(B, H, R, 2)`` from word_argmax ``(B, H, W)``, or ``(B, H, R, 2, 2)`` with
    the baseline's flags: ``[..., 0]`` the head's hits, ``[..., 1]`` the arcs where the head and
    the baseline are both right.

    ``gold_head`` ``(B, W)``: each word's gold head word (batch word index, -1 none);
    ``relation`` ``(B, W)``: its relation id (``n_relations`` when not counted);
    ``base_to_head`` ``(B, W)`` bool: the baseline offset finds the word's head;
    ``base_to_dep`` ``(B, W, R + 1)`` bool: the baseline offset finds a dependent of the word
    with that relation (see :func:`baseline_flags`).

    ``causal``: only an argmax on an earlier word counts (a row that sees no candidate word,
    the first word's, has its argmax on a word it cannot see, by tie-breaking among zeros).
    """
    n_batch, n_heads, n_words = word_argmax.shape
    me = torch.arange(n_words, device=word_argmax.device)
    to_head = (word_argmax == gold_head[:, None, :]).float()  # (B, H, W)
    flat = word_argmax.reshape(n_batch, -1)
    head_of_target = gold_head.gather(1, flat).view(n_batch, n_heads, n_words)
    to_dependent = (head_of_target == me).float()  # the target's head is me
    if causal:
        seen = (word_argmax < me).float()
        to_head, to_dependent = to_head * seen, to_dependent * seen
    target_relation = relation.gather(1, flat).view(n_batch, n_heads, n_words)
    shape = (n_batch, n_heads, n_relations + 1)  # the last slot collects "no relation"
    dep_hits = to_head.new_zeros(shape).scatter_add_(
        2, relation[:, None, :].expand(-1, n_heads, -1), to_head
    )[..., :n_relations]
    head_hits = to_head.new_zeros(shape).scatter_add_(2, target_relation, to_dependent)[
        ..., :n_relations
    ]
    hits = torch.stack([dep_hits, head_hits], dim=-1)
    if base_to_head is None or base_to_dep is None:
        return hits
    both_head = to_head * base_to_head[:, None, :].to(to_head.dtype)
    slots = base_to_dep.shape[-1]  # R + 1
    where = me[None, None, :] * slots + target_relation  # (B, H, W): my row, the target's slot
    base_dep = base_to_dep.reshape(n_batch, -1).gather(1, where.reshape(n_batch, -1))
    both_dep = to_dependent * base_dep.view(n_batch, n_heads, n_words).to(to_head.dtype)
    both = torch.stack(
        [
            to_head.new_zeros(shape).scatter_add_(
                2, relation[:, None, :].expand(-1, n_heads, -1), both_head
            )[..., :n_relations],
            to_head.new_zeros(shape).scatter_add_(2, target_relation, both_dep)[..., :n_relations],
        ],
        dim=-1,
    )
    return torch.stack([hits, both], dim=-1)


def scores(sums: Sums, offsets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per relation and direction, with the chosen ``offsets`` ``(Rel, 2)``:
    ``accuracy``, ``hits`` and ``both`` (head and baseline right) ``(R+1, L, H, Rel, 2)``;
    ``baseline``, ``baseline_hits``, ``baseline_offset`` and ``count`` ``(R+1, Rel, 2)``."""
    counts = sums.get("syntactic.count")  # (R+1, Rel, 2)
    hits = sums.get("syntactic.hits")
    base_all = sums.get("syntactic.baseline")  # (R+1, Rel, 2, K)
    index = offsets.to(base_all.device)[None, ..., None].expand(base_all.shape[0], -1, -1, 1)
    base_hits = base_all.gather(-1, index).squeeze(-1)
    return {
        "accuracy": ratio(hits, counts[:, None, None]),
        "hits": hits,
        "both": sums.get("syntactic.both"),
        "baseline": ratio(base_hits, counts),
        "baseline_hits": base_hits,
        "baseline_offset": torch.tensor(OFFSETS)[offsets.cpu()].expand_as(counts),
        "count": counts,
    }
