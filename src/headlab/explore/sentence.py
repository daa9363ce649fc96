"""One sentence through every head, in one forward pass: :func:`capture` and its result.

In a notebook ``headlab.capture("minilm", "The cat sat on the mat.")`` shows the layer x head
grid and the chosen head's pattern (``_repr_html_``: one self-contained block of HTML that loads
nothing from the network); the numbers stay at hand as attributes::

    >>> import headlab
    >>> heads = headlab.capture("tiny-shakespeare", "To be or not to be")
    >>> heads.pattern(0, 1).shape          # (W, W) word-level, special tokens included
    torch.Size([6, 6])
    >>> heads.top(0, 1, "be#2", k=1)       # doctest: +SKIP
    [('to', 0.41)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from headlab.errors import InputError
from headlab.explore.shelf import notebook_shelf
from headlab.explore.table import default_word, head_rows
from headlab.models.analysis import WordAttention, word_attention
from headlab.models.loading import LoadedModel
from headlab.models.runner import encode
from headlab.models.sentence_view import sentence_json
from headlab.page.explorer import notebook_html

#: what a view's weights are: the attention weights, or weighted by value norms
WEIGHTINGS = ("attention", "norm")


@dataclass(frozen=True, kw_only=True, eq=False)
class SentenceHeads:
    """Every head's attention on one sentence, at word and at token level.

    Attributes:
        model: the model's name.
        text: the sentence.
        causal: whether the model is a decoder (its queries see only earlier tokens).
        word: the word the view opens on (:func:`~headlab.explore.table.default_word`).
        tokens: each token as text (special tokens as the tokenizer spells them).
        attention: the word-level patterns ``{layer: (H, W, W)}`` and token-level ones
            ``{layer: (H, T, T)}`` (:class:`~headlab.models.analysis.WordAttention`).
        lm: the model itself.
    """

    model: str
    text: str
    causal: bool
    word: str
    tokens: tuple[str, ...]
    attention: WordAttention
    lm: LoadedModel = field(repr=False)

    @property
    def words(self) -> tuple[str, ...]:
        """Every word, special tokens included, in order."""
        return self.attention.alignment.words

    @property
    def heads_in_layer(self) -> tuple[int, ...]:
        return tuple(self.lm.layout.heads_per_layer)

    def pattern(
        self, layer: int, head: int, *, tokens: bool = False, weighting: str = "attention"
    ) -> torch.Tensor:
        """Where each word's (or with ``tokens``, each token's) attention goes in one head:
        the raw weights, or with ``weighting="norm"`` the weights scaled by the norm of what
        each token contributes through the head (Kobayashi et al. 2020; rows rescaled to 1).

        Shape:
            ``(W, W)`` words, or ``(T, T)`` tokens; row ``i`` sums to 1 (0 for a padded row).
        """
        if weighting not in WEIGHTINGS:
            raise InputError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
        if not 0 <= layer < self.lm.n_layers:
            raise InputError(
                f"layer {layer} out of range: {self.model} has layers 0..{self.lm.n_layers - 1}"
            )
        n = self.heads_in_layer[layer]
        if not 0 <= head < n:
            raise InputError(f"head {head} out of range: layer {layer} has heads 0..{n - 1}")
        wa = self.attention
        if weighting == "norm":
            source = wa.norm_token_patterns if tokens else wa.norm_patterns
        else:
            source = wa.token_patterns if tokens else wa.patterns
        return source[layer][head]

    def top(
        self, layer: int, head: int, word: str | None = None, k: int = 3
    ) -> list[tuple[str, float]]:
        """The ``k`` words ``word`` (default :attr:`word`) attends to most in one head, special
        tokens and the sink set apart (:meth:`sink_share`)."""
        self.pattern(layer, head)  # the range checks
        return self.attention.top(layer, head, word or self.word, k)

    @property
    def sink(self) -> str | None:
        """A decoder's attention sink, its first word (``None`` for an encoder, or after a BOS)."""
        index = self.attention.sink
        return None if index is None else self.attention.alignment.words[index]

    def sink_share(self, layer: int, head: int, word: str | None = None) -> float | None:
        """The share of ``word``'s attention that one head parks on the sink."""
        self.pattern(layer, head)  # the range checks
        return self.attention.sink_mass(layer, head, word or self.word)

    def table(self, word: str | None = None, top: int = 3) -> dict[str, Any]:
        """The heads table of ``headlab heads TEXT --word WORD --top TOP --json``."""
        word = word or self.word
        self.attention.alignment.word_index(word)  # a clear error if the word is missing
        at = {layer: layer for layer in range(self.lm.n_layers)}
        rows = head_rows(self.lm, self.attention, word, at, top=top)
        return {"model": self.model, "text": self.text, "word": word, "heads": rows}

    def to_json(self) -> dict[str, Any]:
        """What the explorer's page draws (schema ``headlab.sentence/1``): the one sentence
        JSON of every page (:func:`~headlab.models.sentence_view.sentence_json`), with the
        token-level patterns and those weighted by value norms."""
        return sentence_json(self.lm, self.text, self.attention, tokens=self.tokens, word=self.word)

    def _repr_html_(self) -> str:
        """The grid and the pattern view as one self-contained block (Jupyter shows it)."""

        return notebook_html(self.to_json())


def token_texts(lm: LoadedModel, ids: list[int]) -> tuple[str, ...]:
    """Each token as the text it stands for (GPT-2's ``Ġbe`` shows as ``" be"``), special
    tokens as the tokenizer spells them (``[CLS]``)."""
    tokenizer = lm.tokenizer
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return tuple(
        tokenizer.convert_ids_to_tokens(i) if i in special else tokenizer.decode([i]) for i in ids
    )


def capture_sentence(lm: LoadedModel, text: str, *, word: str | None = None) -> SentenceHeads:
    """Run ``text`` through ``lm`` once and keep every head's word- and token-level pattern.

    Raises:
        InputError: an empty text, a ``word`` not in it, a text too long for the model.
    """
    if not text or not text.strip():
        raise InputError("the text is empty: give a sentence")
    wa = word_attention(lm, text, tokens=True, norms=True)
    ids = encode(lm, [wa.alignment.text])["input_ids"][0].tolist()
    chosen = word or default_word(text, wa.alignment, last=lm.causal)
    wa.alignment.word_index(chosen)  # a clear error if the word is missing
    return SentenceHeads(
        model=lm.name,
        text=text,
        causal=lm.causal,
        word=chosen,
        tokens=token_texts(lm, ids),
        attention=wa,
        lm=lm,
    )


def capture(
    model: LoadedModel | str | None, text: str, *, word: str | None = None
) -> SentenceHeads:
    """Every head of ``model`` on ``text``; shown as a grid and a pattern view in a notebook.

    Args:
        model: a loaded model, or a name: ``"minilm"`` (or ``None``: all-MiniLM-L6-v2),
            ``"tiny-shakespeare"``, ``"smollm2"``, a folder, a ``.gguf`` file, a cached model
            name. A name loads once per process and is kept for the next call.
        text: the sentence.
        word: the word the view opens on (default: the lesson's, a decoder's last word, else
            the longest).
    """
    if isinstance(model, LoadedModel):
        lm = model
    else:
        shelf = notebook_shelf()
        lm = shelf.get(None if model is None else shelf.add(model))
    return capture_sentence(lm, text, word=word)
