"""From subword tokens to words.

Attention *to* a word is the sum of the attention to its tokens; attention *from* a word is the
mean over its tokens (Clark et al. 2019, section 2). Special tokens ([CLS], [SEP], <s>...) stay
words of their own. Words come from raw text (split on whitespace and punctuation) or are given
(treebank tokens); tokens are matched to words by character offsets, so any fast tokenizer works.
In raw text, where one token spans several of those pieces (a byte-level BPE token "..." or
'."', a URL's ".com"), the pieces it spans become one word, named by its text; given words
are kept as given (a token across two of them is an error).
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
        """Index of the non-special word equal to ``word``: its first occurrence, or its N-th
        for ``word#N`` ("the#2": the second "the"); the word as written first, else in another
        case where one spelling fits (:func:`find_word`)."""
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
    """:meth:`Alignment.word_index` over plain lists of words and special flags.

    The word as written is matched first ("the" is the lowercase one, not "The"); only a word
    the sentence has in no case as written is matched ignoring case, and then only when one
    spelling fits ("chef" finds "Chef"; "THE" between "The" and "the" is refused, naming both).
    """
    name, occurrence = word, 1
    head, sep, tail = word.rpartition("#")
    if sep and head and tail.isdigit():
        name, occurrence = head, int(tail)
        if occurrence < 1:
            raise InputError(f"{word!r}: occurrences count from 1 ({head}#1 is the first)")
    pairs = enumerate(zip(words, is_special, strict=True))
    plain = [(i, w) for i, (w, special) in pairs if not special]
    found = [i for i, w in plain if w == name]
    if not found:
        found = [i for i, w in plain if w.casefold() == name.casefold()]
        spellings = list(dict.fromkeys(words[i] for i in found))
        if len(spellings) > 1:
            raise InputError(
                f"word {name!r} is in the sentence only in another case, as "
                f"{' and '.join(map(repr, spellings))}: give one as written"
            )
    if not found:
        raise InputError(
            f"word {name!r} is not in the sentence (words: {' '.join(w for _, w in plain)})"
        )
    if occurrence > len(found):
        others = sorted({w for _, w in plain if w.casefold() == name.casefold()} - {name})
        also = f" (as written; {', '.join(others)} not counted)" if others else ""
        raise InputError(
            f"word {name!r} occurs {len(found)} time(s) in the sentence{also}, not {occurrence}"
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
    # each plain token's first and last piece (a piece: a word or a punctuation mark)
    spans_of: dict[int, tuple[int, int]] = {}
    for tok, ((a, b), is_sp) in enumerate(
        zip(enc["offset_mapping"], enc["special_tokens_mask"], strict=True)
    ):
        if is_sp or a == b:
            continue
        while a < len(text) and text[a].isspace():  # byte-level BPE offsets include the
            a += 1  # space; a token of spaces alone goes with the word after it
        first = bisect.bisect_right(starts, a) - 1  # starts are increasing
        last = bisect.bisect_right(starts, max(a, b - 1)) - 1
        if first < 0 or a >= pieces[first][2] or b > pieces[last][2]:
            raise AlignmentError(
                f"token {tokenizer.convert_ids_to_tokens(ids[tok])!r} at characters {a}-{b} "
                "does not fall inside the text's words"
            )
        if last != first and words is not None:  # given words are kept as given
            raise AlignmentError(
                f"token {tokenizer.convert_ids_to_tokens(ids[tok])!r} at characters {a}-{b} "
                "does not fall inside one word"
            )
        spans_of[tok] = (first, last)
    # raw text: pieces one token spans become one word ("..." for a BPE token of three dots,
    # "x.com" where ".com" is one token), starting where the first of them starts
    group = list(range(len(pieces)))
    for first, last in spans_of.values():
        for j in range(first + 1, last + 1):
            group[j] = group[first]
    for j in range(len(group)):  # point every piece at its group's first piece
        group[j] = group[group[j]]
    ends: dict[int, int] = {}
    for j, g in enumerate(group):
        ends[g] = max(ends.get(g, 0), pieces[j][2])
    out_words: list[str] = []
    special: list[bool] = []
    spans: list[tuple[int, int]] = []
    token_to_word: list[int] = []
    word_of_group: dict[int, int] = {}
    for tok in range(len(ids)):
        if tok not in spans_of:
            out_words.append(tokenizer.convert_ids_to_tokens(ids[tok]))
            special.append(True)
            spans.append((-1, -1))
            token_to_word.append(len(out_words) - 1)
            continue
        g = group[spans_of[tok][0]]
        if g not in word_of_group:
            start, end = pieces[g][1], ends[g]
            out_words.append(text[start:end])
            special.append(False)
            spans.append((start, end))
            word_of_group[g] = len(out_words) - 1
        token_to_word.append(word_of_group[g])
    if len(word_of_group) != len(set(group)):
        lost = [pieces[g][0] for g in sorted(set(group)) if g not in word_of_group]
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
