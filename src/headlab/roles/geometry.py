"""Where tokens and words sit in a padded batch: the masks and matrices every probe shares.

Shape vocabulary: ``B`` sentences, ``H`` heads, ``T`` token positions (padded), ``W`` words
(padded, special tokens included as words of their own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from headlab.models.words import Alignment

#: up to this many (words x tokens), word sums use a dense product instead of a scatter
DENSE_LIMIT = 1 << 16

_PUNCT = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~“”‘’–—…«»¿¡")


def is_punctuation(word: str) -> bool:
    """A word made only of punctuation characters."""
    return bool(word) and all(c in _PUNCT for c in word)


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """Token- and word-level masks of one padded batch.

    Attributes:
        query: ``(B, T)`` real, non-special tokens (the rows probes average over).
        cls: ``(B, T)`` 1.0 on the [CLS] token.
        sep: ``(B, T)`` 1.0 on other special tokens ([SEP], EOS, BOS).
        punct: ``(B, T)`` 1.0 on tokens of punctuation words.
        log_visible: ``(B, T)`` log of the number of keys each query can see (0 for pads).
        from_words: ``(B, W, T)`` mean over a word's tokens.
        to_words: ``(B, T, W)`` sum over a word's tokens.
        token_word: ``(B, T)`` each token's word (``W`` for padding).
        word_real: ``(B, W)`` the word exists (not padding).
        word_special: ``(B, W)`` the word is a special token.
    """

    query: torch.Tensor
    cls: torch.Tensor
    sep: torch.Tensor
    punct: torch.Tensor
    log_visible: torch.Tensor
    from_words: torch.Tensor
    to_words: torch.Tensor
    token_word: torch.Tensor
    word_real: torch.Tensor
    word_special: torch.Tensor

    @property
    def candidates(self) -> torch.Tensor:
        """``(B, W)`` words an argmax may land on: real and not special."""
        return self.word_real & ~self.word_special

    def word_sums(
        self, pattern: torch.Tensor, start: int = 0, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Unnormalised word pattern ``(B, H, W+1, W+1)`` of query rows ``start:start+t``.

        ``pattern`` is ``(B, H, t, T)``: sums over each attended word's tokens and over the
        attending word's tokens, as segment sums (``O(t T)`` per head, no dense matrices).
        Blocks of rows add up into ``out`` when given; :meth:`finish_words` turns the total
        into means.
        """
        n_batch, n_heads, n_rows, n_tok = pattern.shape
        n_words = self.to_words.shape[2]
        if n_words * n_tok <= DENSE_LIMIT:  # short inputs: a small matrix product is faster
            cols = torch.nn.functional.pad(pattern @ self.to_words[:, None, :n_tok], (0, 1))
        else:
            cols = pattern.new_zeros(n_batch, n_heads, n_rows, n_words + 1)
            index = self.token_word[:, None, None, :n_tok].expand(n_batch, n_heads, n_rows, n_tok)
            cols.scatter_add_(3, index, pattern)  # sum over attended tokens
        owner = self.token_word[:, None, start : start + n_rows, None]
        index = owner.expand(n_batch, n_heads, n_rows, n_words + 1)
        if out is None:
            out = pattern.new_zeros(n_batch, n_heads, n_words + 1, n_words + 1)
        return out.scatter_add_(2, index, cols)  # sum over attending tokens

    def finish_words(self, sums: torch.Tensor) -> torch.Tensor:
        """Summed word rows ``(B, H, W+1, W+1)`` -> word pattern ``(B, H, W, W)`` (means)."""
        n_words = self.to_words.shape[2]
        counts = self.to_words.sum(1).clamp_min(1.0)[:, None, :, None]  # (B, 1, W, 1)
        return sums[:, :, :n_words, :n_words] / counts

    def word_patterns(self, pattern: torch.Tensor) -> torch.Tensor:
        """Token patterns ``(B, H, T, T)`` to word patterns ``(B, H, W, W)``."""
        return self.finish_words(self.word_sums(pattern))

    def word_argmax(self, word_pattern: torch.Tensor) -> torch.Tensor:
        """``(B, H, W)``: the word each word attends to most, self and special words excluded."""
        n_words = word_pattern.shape[-1]
        blocked = ~self.candidates[:, None, None, :] | torch.eye(
            n_words, dtype=torch.bool, device=word_pattern.device
        )  # (B, 1, W, W)
        return word_pattern.masked_fill(blocked, -1.0).argmax(-1)


def build_geometry(
    alignments: list[Alignment], n_positions: int, tokenizer: Any, *, causal: bool
) -> Geometry:
    """Masks and word matrices for sentences padded (on the right) to ``n_positions`` tokens."""
    n_batch = len(alignments)
    n_words = max(len(a.words) for a in alignments)
    cls_token = getattr(tokenizer, "cls_token", None)
    query = torch.zeros(n_batch, n_positions, dtype=torch.bool)
    cls = torch.zeros(n_batch, n_positions)
    sep = torch.zeros(n_batch, n_positions)
    punct = torch.zeros(n_batch, n_positions)
    log_visible = torch.zeros(n_batch, n_positions)
    token_word = torch.full((n_batch, n_positions), n_words, dtype=torch.long)  # pad -> dummy
    word_real = torch.zeros(n_batch, n_words, dtype=torch.bool)
    word_special = torch.zeros(n_batch, n_words, dtype=torch.bool)
    for b, a in enumerate(alignments):
        n = a.n_tokens
        token_word[b, :n] = torch.tensor(a.token_to_word)
        word_real[b, : len(a.words)] = True
        word_special[b, : len(a.words)] = torch.tensor(a.is_special)
        for t, w in enumerate(a.token_to_word):
            if a.is_special[w]:
                if a.words[w] == cls_token:
                    cls[b, t] = 1.0
                else:
                    sep[b, t] = 1.0
            else:
                query[b, t] = True
                if is_punctuation(a.words[w]):
                    punct[b, t] = 1.0
        visible = torch.arange(1, n + 1) if causal else torch.full((n,), n)
        log_visible[b, :n] = torch.log(visible.double()).float()
    to_words = torch.nn.functional.one_hot(token_word, n_words + 1)[..., :n_words].float()
    counts = to_words.sum(1).clamp_min(1.0)  # (B, W) tokens per word
    from_words = (to_words / counts[:, None, :]).transpose(1, 2).contiguous()
    return Geometry(
        query=query,
        cls=cls,
        sep=sep,
        punct=punct,
        log_visible=log_visible,
        from_words=from_words,
        to_words=to_words,
        token_word=token_word,
        word_real=word_real,
        word_special=word_special,
    )


#: Clark et al. (2019) call a head broad above 3.8 nats on 128-token inputs: 3.8 / ln 128 of the
#: largest possible entropy. headlab compares each row's entropy with ln(visible keys) instead,
#: so that short sentences are judged on the same scale.
BROAD_RATIO = 3.8 / math.log(128)
