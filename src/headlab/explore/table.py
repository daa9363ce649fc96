"""The heads table of one sentence: for every head, the words a chosen word attends to most.

This is what ``headlab heads --json`` prints and what the explorer's ``/api/heads`` answers, built
in one place so that the two cannot drift apart::

    {"model": "all-MiniLM-L6-v2", "text": "...", "word": "prepared",
     "heads": [{"layer": 0, "head": 0, "original_head": 0,
                "top": [{"word": "the", "weight": 0.31}, ...], "special": 0.12}, ...]}

Weights are word-level (Clark et al. 2019: summed over a key word's tokens, averaged over the
attending word's tokens) and rounded to 4 decimals; ``special`` is the share that goes to
special tokens such as [CLS]/[SEP]. This module imports no torch at import time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from headlab.datasets.lesson import LESSON_SENTENCE, LESSON_WORD
from headlab.errors import InputError

if TYPE_CHECKING:
    from headlab.models.analysis import WordAttention
    from headlab.models.loading import LoadedModel
    from headlab.models.words import Alignment


#: words too common to be what a sentence is about ("The cat sat on the mat." is about "cat",
#: not "The"); the default word is the longest of the others
FUNCTION_WORDS = frozenset(
    {"a", "an", "the", "this", "that", "these", "those", "and", "or", "but", "of", "to", "in",
     "on", "at", "by", "for", "with", "from", "as", "is", "are", "was", "were", "be", "been",
     "it", "its", "he", "she", "they", "we", "you", "i", "his", "her", "their", "our", "my",
     "your", "not", "no"}
)  # fmt: skip


def default_word(text: str, alignment: Alignment, *, last: bool = False) -> str:
    """The word a sentence's table is about when none is chosen.

    The lesson's word for the lesson's sentence; else the longest word that is neither
    punctuation nor a function word (:data:`FUNCTION_WORDS`), the first of equals; with ``last`` (a causal
    model), the last word that is not punctuation: where the model predicts what comes next, and
    the one word that sees the whole sentence (``word#N`` when it occurs earlier too).

    A sentence of punctuation alone ("=(") is about its marks, by the same rules.

    Raises:
        InputError: the sentence has only special tokens.
    """
    from headlab.roles.geometry import is_punctuation

    if text == LESSON_SENTENCE:
        return LESSON_WORD
    plain = [
        w for w, special in zip(alignment.words, alignment.is_special, strict=True) if not special
    ]
    words = [w for w in plain if not is_punctuation(w)] or plain  # "=(": its marks, then
    if not words:
        raise InputError(f"the sentence has no word to attend from: {text!r}")
    if last:
        n = words.count(words[-1])
        return words[-1] if n == 1 else f"{words[-1]}#{n}"
    content = [w for w in words if w.lower() not in FUNCTION_WORDS] or words
    return max(content, key=len)  # max keeps the first of equals


def check_heads(
    lm: LoadedModel, layers: Sequence[int], heads: Sequence[int] | None, *, what: str = "layers"
) -> None:
    """A one-line error for a layer outside ``0..n_layers-1`` or a head no chosen layer has."""
    for layer in layers:
        if not 0 <= layer < lm.n_layers:
            raise InputError(
                f"layer {layer} out of range: {lm.name} has {what} 0..{lm.n_layers - 1}"
            )
    counts = lm.layout.heads_per_layer  # fewer in some layers of a model pruned layer by layer
    most = max((counts[layer] for layer in layers), default=0)
    for head in heads or []:
        if not 0 <= head < most:
            raise InputError(f"head {head} out of range: {lm.name} has heads 0..{most - 1}")


def each_head(
    lm: LoadedModel, at: Mapping[int, int], heads: Sequence[int] | None = None
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """``(layer, head, row)`` for each of ``heads`` (default all) of the shown layers.

    ``at`` maps a shown layer to the model's layer (they differ in an encoder-decoder, whose
    decoder layers are shown from 0). ``row`` starts the head's output: the shown layer, the
    head and its unpruned id (a pruned folder's heads keep theirs); a head pruned away from a
    layer is skipped.
    """
    counts = lm.layout.heads_per_layer
    ids = lm.head_ids()
    for shown, layer in at.items():
        for head in heads or range(counts[layer]):
            if head >= counts[layer]:
                continue  # pruned away in this layer
            yield layer, head, {"layer": shown, "head": head, "original_head": ids[layer][head]}


def head_rows(
    lm: LoadedModel,
    wa: WordAttention,
    word: str,
    at: Mapping[int, int],
    *,
    heads: Sequence[int] | None = None,
    top: int = 3,
) -> list[dict[str, Any]]:
    """One row per head of the shown layers (``at``, as :func:`each_head`): ``word``'s ``top``
    words with their weights, and apart from them its share to special tokens and, in a causal
    model without a BOS, to its first word (``sink``: its word and weight,
    :func:`~headlab.models.analysis.sink_index`); ``sink_share``: the two together, the share
    of its attention on the attention sink as ``headlab roles`` measures it ([CLS], [SEP], BOS,
    EOS, the first position)."""
    if top < 1:
        raise InputError(f"top must be at least 1, got {top}")
    rows = []
    for layer, head, row in each_head(lm, at, heads):
        special = wa.special_mass(layer, head, word)
        sink = _sink(wa, layer, head, word)
        rows.append(
            {
                **row,
                "top": [
                    {"word": w, "weight": round(x, 4)} for w, x in wa.top(layer, head, word, top)
                ],
                "special": round(special, 4),
                **sink,
                "sink_share": round(special + (sink["sink"]["weight"] if sink else 0.0), 4),
            }
        )
    return rows


def _sink(wa: WordAttention, layer: int, head: int, word: str) -> dict[str, Any]:
    share = wa.sink_mass(layer, head, word)
    if share is None or wa.sink is None:
        return {}
    return {"sink": {"word": wa.alignment.words[wa.sink], "weight": round(share, 4)}}


def heads_table(
    lm: LoadedModel,
    text: str,
    *,
    word: str | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    top: int = 3,
) -> dict[str, Any]:
    """The table of ``headlab heads TEXT --json`` for a model with one stack of layers: one
    forward pass, then a row per head of ``layers`` (default all) and ``heads`` (default all).

    Raises:
        InputError: a layer or head out of range, ``top`` below 1, a ``word`` not in the
            sentence, a text too long for the model.

    Example:
        >>> from headlab.models import load
        >>> table = heads_table(load("tiny-shakespeare"), "To be or not to be", top=2)
        >>> table["word"], len(table["heads"])  # a decoder's last word; 4 layers x 4 heads
        ('be#2', 16)
    """
    from headlab.models.analysis import word_attention

    chosen = list(range(lm.n_layers)) if layers is None else list(layers)
    check_heads(lm, chosen, heads)
    if top < 1:  # before the forward pass
        raise InputError(f"top must be at least 1, got {top}")
    wa = word_attention(lm, text, layers=chosen)
    word = word or default_word(text, wa.alignment, last=lm.causal)
    wa.alignment.word_index(word)  # a clear error if the word is missing
    rows = head_rows(lm, wa, word, {layer: layer for layer in chosen}, heads=heads, top=top)
    return {"model": lm.name, "text": text, "word": word, "heads": rows}
