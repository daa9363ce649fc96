"""From subword tokens to words.

Attention *to* a word is the sum of the attention to its tokens; attention *from* a word is the
mean over its tokens (Clark et al. 2019, section 2). Special tokens ([CLS], [SEP], <s>...) stay
words of their own. Words come from raw text (split on whitespace and punctuation) or are given
(treebank tokens); tokens are matched to words by character offsets, so any fast tokenizer works.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headlab.errors import AlignmentError, InputError, TooLongError

_WORD = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")


@dataclass(frozen=True, kw_only=True)
class Alignment:
    """Tokens of one sentence matched to its words.

    Attributes:
        words: every word, special tokens included, in token order.
        is_special: for each word, whether it is a special token.
        token_to_word: for each token position, its word index.
        word_spans: character ``(start, end)`` of each word in the text (``(-1, -1)`` for
            special tokens).
        text: the text that was tokenized.
    """

    words: tuple[str, ...]
    is_special: tuple[bool, ...]
    token_to_word: tuple[int, ...]
    word_spans: tuple[tuple[int, int], ...]
    text: str

    @property
    def plain_words(self) -> list[int]:
        """Indices of the non-special words, in order (treebank word ``i`` is ``plain_words[i]``)."""
        return [i for i, special in enumerate(self.is_special) if not special]

    @property
    def n_tokens(self) -> int:
        return len(self.token_to_word)

    def word_index(self, word: str) -> int:
        """Index of the non-special word equal to ``word`` (case-insensitive): its first
        occurrence, or its N-th for ``word#N`` ("the#2": the second "the")."""
        return find_word(self.words, self.is_special, word)

    def matrices(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """``(from_words (W, T), to_words (T, W))``: mean over a word's tokens, sum over them.

        ``from_words @ pattern @ to_words`` turns a token pattern ``(T, T)`` into a word pattern
        ``(W, W)`` whose rows still sum to 1.
        """
        n_words, n_tokens = len(self.words), self.n_tokens
        to_words = torch.zeros(n_tokens, n_words, dtype=dtype)
        to_words[torch.arange(n_tokens), torch.tensor(self.token_to_word)] = 1.0
        counts = to_words.sum(0)  # tokens per word
        from_words = (to_words / counts).t().contiguous()  # (W, T)
        return from_words, to_words


def find_word(words: Sequence[str], is_special: Sequence[bool], word: str) -> int:
    """:meth:`Alignment.word_index` over plain lists of words and special flags."""
    name, occurrence = word, 1
    head, sep, tail = word.rpartition("#")
    if sep and head and tail.isdigit():
        name, occurrence = head, int(tail)
        if occurrence < 1:
            raise InputError(f"{word!r}: occurrences count from 1 ({head}#1 is the first)")
    found = [
        i
        for i, (w, special) in enumerate(zip(words, is_special, strict=True))
        if not special and w.lower() == name.lower()
    ]
    if not found:
        plain = [w for w, s in zip(words, is_special, strict=True) if not s]
        raise InputError(f"word {name!r} is not in the sentence (words: {' '.join(plain)})")
    if occurrence > len(found):
        raise InputError(
            f"word {name!r} occurs {len(found)} time(s) in the sentence, not {occurrence}"
        )
    return found[occurrence - 1]


def split_words(text: str) -> list[tuple[str, int, int]]:
    """Words of raw text with character offsets: runs of word characters, single punctuation."""
    return [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]


def align(
    tokenizer: Any,
    *,
    text: str | None = None,
    words: Sequence[str] | None = None,
    max_tokens: int | None = None,
    as_target: bool = False,
) -> Alignment:
    """Tokenize one sentence and match its tokens to words.

    Give either raw ``text`` or pre-split ``words`` (joined with single spaces);
    ``as_target``: tokenize as the decoder's target text (``text_target``: a translation
    model's target-language vocabulary).

    Raises:
        InputError: empty input.
        TooLongError: a text longer than ``max_tokens``.
        AlignmentError: a token straddles two words, or a word gets no token.
    """
    if (text is None) == (words is None):
        raise InputError("give either text or words")
    if words is not None:
        if not words or any(not w or any(c.isspace() for c in w) for w in words):
            raise InputError("words must be a non-empty list of non-empty words without spaces")
        pieces, pos = [], 0
        for w in words:
            pieces.append((w, pos, pos + len(w)))
            pos += len(w) + 1
        sentence = " ".join(words)
    else:
        sentence = text or ""
        if not sentence.strip():
            raise InputError("the text is empty")
        pieces = split_words(sentence)
    text = sentence
    options = {"return_offsets_mapping": True, "return_special_tokens_mask": True}
    if as_target:
        enc = tokenizer(text_target=text, truncation=False, **options)
    else:
        enc = tokenizer(text, truncation=False, **options)
    ids = enc["input_ids"]
    if max_tokens is not None and len(ids) > max_tokens:
        raise TooLongError(
            f"the text is {len(ids)} tokens long; this model takes at most {max_tokens} "
            "(shorten it: headlab does not truncate silently)"
        )
    starts = [s for _, s, _ in pieces]
    out_words: list[str] = []
    special: list[bool] = []
    spans: list[tuple[int, int]] = []
    token_to_word: list[int] = []
    word_of_piece: dict[int, int] = {}
    for tok, ((a, b), is_sp) in enumerate(
        zip(enc["offset_mapping"], enc["special_tokens_mask"], strict=True)
    ):
        if is_sp or a == b:
            out_words.append(tokenizer.convert_ids_to_tokens(ids[tok]))
            special.append(True)
            spans.append((-1, -1))
            token_to_word.append(len(out_words) - 1)
            continue
        while a < len(text) and text[a].isspace():  # byte-level BPE offsets include the space
            a += 1
        # the piece containing this token's first character
        j = bisect.bisect_right(starts, a) - 1  # starts are increasing
        if j < 0 or a >= pieces[j][2] or b > pieces[j][2]:
            raise AlignmentError(
                f"token {tokenizer.convert_ids_to_tokens(ids[tok])!r} at characters {a}-{b} does not fall inside one word"
            )
        if j not in word_of_piece:
            out_words.append(pieces[j][0])
            special.append(False)
            spans.append((pieces[j][1], pieces[j][2]))
            word_of_piece[j] = len(out_words) - 1
        token_to_word.append(word_of_piece[j])
    if len(word_of_piece) != len(pieces):
        lost = [pieces[j][0] for j in range(len(pieces)) if j not in word_of_piece]
        raise AlignmentError(f"the tokenizer produced no token for the words {lost}")
    return Alignment(
        words=tuple(out_words),
        is_special=tuple(special),
        token_to_word=tuple(token_to_word),
        word_spans=tuple(spans),
        text=text,
    )


def word_pattern(pattern: torch.Tensor, alignment: Alignment) -> torch.Tensor:
    """Token pattern ``(..., T, T)`` of one sentence to a word pattern ``(..., W, W)``."""
    t = alignment.n_tokens
    pattern = pattern[..., :t, :t].float()
    from_words, to_words = alignment.matrices()
    return from_words.to(pattern.device) @ pattern @ to_words.to(pattern.device)
