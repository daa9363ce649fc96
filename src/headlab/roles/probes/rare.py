"""Rare-token heads.

The share of query words whose attention argmax (word level, self and special tokens excluded)
lands on the sentence's least frequent word; frequencies come from a corpus (by default UD English
EWT train). Voita et al. (2019, section 4.3) found a head in their encoder that does this for 66%
of tokens. Ties for the least frequent word all count as targets; punctuation never does, and the
targets themselves are not queries. The chance level (a uniform argmax) is reported beside it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from headlab.roles.bootstrap import Sums, ratio
from headlab.roles.geometry import is_punctuation


def targets(words: Sequence[str], frequencies: Counter[str]) -> list[bool]:
    """For each word, whether it is (one of) the sentence's least frequent non-punctuation words."""
    counts = [None if is_punctuation(w) else frequencies.get(w.lower(), 0) for w in words]
    real = [c for c in counts if c is not None]
    if not real:
        return [False] * len(words)
    lowest = min(real)
    return [c == lowest for c in counts]


def queries(target: Sequence[bool], *, causal: bool = False) -> tuple[list[bool], float]:
    """Which words are queries, and the expected hits of a uniform argmax over them.

    The targets are not queries, and a sentence of targets only has none. A word's argmax
    chooses among the other words (``n - 1``), of which the targets are ``n_target``. On a
    ``causal`` model a word sees only the words before it: it is a query only when a target is
    among them, and its chance is the targets' share of the words before it."""
    n, n_target = len(target), sum(target)
    if not n_target or n == n_target:
        return [False] * n, 0.0
    if not causal:
        return [not t for t in target], (n - n_target) * n_target / (n - 1)
    flags, chance, before = [], 0.0, 0
    for k, t in enumerate(target):
        flags.append(not t and before > 0)
        if flags[-1]:
            chance += before / k
        before += int(t)
    return flags, chance


def collect(word_argmax: torch.Tensor, rare: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """word_argmax ``(B, H, W)``, rare and queries ``(B, W)`` bool -> hits ``(B, H)``."""
    n_batch, n_heads, n_words = word_argmax.shape
    landed = rare.gather(1, word_argmax.reshape(n_batch, -1)).view(n_batch, n_heads, n_words)
    return (landed & queries[:, None, :]).sum(-1).float()


def scores(sums: Sums) -> dict[str, torch.Tensor]:
    """``rare-token`` share and its chance level ``rare_chance``."""
    queries = sums.get("rare.queries")[:, None, None]
    hits = sums.get("rare.hits")
    return {
        "rare-token": ratio(hits, queries),
        "rare_chance": ratio(sums.get("rare.chance"), sums.get("rare.queries"))[:, None, None]
        .expand_as(hits)
        .clone(),
    }
