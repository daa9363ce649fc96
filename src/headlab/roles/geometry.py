"""Where tokens and words sit in a padded batch: the masks and matrices every probe shares.

Shape vocabulary: ``B`` sentences, ``H`` heads, ``T`` token positions (padded), ``W`` words
(padded, special tokens included as words of their own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from headlab.attention.blocks import WordTable, cpu_kernels
from headlab.attention.blocks import word_argmax_rows as native_word_argmax_rows
from headlab.models.words import Alignment

#: up to this many (words x tokens), word sums use a dense product instead of a scatter
DENSE_LIMIT = 1 << 16

_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~“”‘’–—…«»¿¡"


def is_punctuation(word: str) -> bool:
    """A word made only of punctuation characters."""
    return bool(word) and not word.strip(_PUNCT)


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

    def to(self, device: torch.device) -> Geometry:
        """The same geometry on ``device`` (for a layer that runs there)."""
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def word_sums(
        self,
        pattern: torch.Tensor,
        start: int = 0,
        out: torch.Tensor | None = None,
        cols: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Unnormalised word pattern ``(B, H, W+1, W+1)`` of query rows ``start:start+t``.

        ``pattern`` is ``(B, H, t, T)``: sums over each attended word's tokens and over the
        attending word's tokens, as segment sums (``O(t T)`` per head, no dense matrices).
        Blocks of rows add up into ``out`` when given; :meth:`finish_words` turns the total
        into means. ``cols`` ``(B, H, t, W)``: the rows already summed over attended words
        (``pattern @ to_words``), when the caller has them.
        """
        n_batch, n_heads, n_rows, n_tok = pattern.shape
        n_words = self.to_words.shape[2]
        if out is None:
            out = pattern.new_zeros(n_batch, n_heads, n_words + 1, n_words + 1)
        if cols is not None or n_words * n_tok <= DENSE_LIMIT:
            # short inputs: small matrix products on both sides
            if cols is None:
                cols = pattern @ self.to_words[:, None, :n_tok]  # (B, H, t, W)
            owners = self.to_words[:, start : start + n_rows].transpose(1, 2)  # (B, W, t)
            out[:, :, :n_words, :n_words] += owners[:, None] @ cols
            return out
        cols = pattern.new_zeros(n_batch, n_heads, n_rows, n_words + 1)
        index = self.token_word[:, None, None, :n_tok].expand(n_batch, n_heads, n_rows, n_tok)
        cols.scatter_add_(3, index, pattern)  # sum over attended tokens
        owner = self.token_word[:, start : start + n_rows]  # (B, t)
        for b in range(n_batch):  # sum over attending tokens: whole rows at a time
            out[b].index_add_(1, owner[b], cols[b])
        return out

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

    def word_argmax_sums(self, sums: torch.Tensor) -> torch.Tensor:
        """:meth:`word_argmax` straight from word sums ``(B, H, W', W')`` (``W' >= W``, as
        :meth:`word_sums` returns them; extra words are ignored), which it overwrites:
        dividing a row by its word's token count does not move its argmax, and the excluded
        cells (self and special words) are filled in place, a few per row."""
        n_batch, n_words = self.word_real.shape
        n_heads = sums.shape[1]
        cells = sums[:, :, :n_words, :n_words]  # (B, H, W, W)
        specials = [self.word_special[b].nonzero().flatten() for b in range(n_batch)]
        fill = torch.arange(n_words, device=sums.device)[None, :, None]  # each row's own word
        fill = fill.repeat(n_batch, 1, 1 + max(len(s) for s in specials))  # (B, W, 1 + k)
        for b, special in enumerate(specials):
            fill[b, :, 1 : 1 + len(special)] = special
        cells.scatter_(3, fill[:, None].expand(-1, n_heads, -1, -1), -1.0)
        where = cells.max(-1).indices  # the first maximum, as argmax
        # padding words' columns hold exact zeros (no token of theirs, or no weight on padded
        # keys) after every real word's: one wins a row only when all real words are excluded
        # (-1), which gets index 0, as when every cell is -1
        n_real = self.word_real.sum(1)[:, None, None]  # (B, 1, 1)
        return torch.where(where < n_real, where, 0)


#: columns per chunk in :func:`first_argmax`, and the row length from which it pays
ARGMAX_CHUNK = 64
CHUNKED_FROM = 320  # measured: max() and the chunks break even near 260


def first_argmax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.max(-1)`` (values and the first maximum's index) for a last dimension that is a
    multiple of :data:`ARGMAX_CHUNK`, several times faster on CPU for long rows: chunk maxima
    come from the vectorized ``amax``, and the indexed maximum runs only over the first chunk
    that holds the row's maximum."""
    n_chunks = x.shape[-1] // ARGMAX_CHUNK
    chunks = x.unflatten(-1, (n_chunks, ARGMAX_CHUNK))  # (..., n, K)
    best, which = chunks.amax(-1).max(-1)  # (...,) the first chunk holding the maximum
    at = which[..., None, None].expand(*which.shape, 1, ARGMAX_CHUNK)
    inner = chunks.gather(-2, at).squeeze(-2)  # (..., K)
    return best, which * ARGMAX_CHUNK + inner.max(-1).indices


class WordArgmaxStream:
    """:meth:`Geometry.word_argmax` of long inputs, from blocks of token rows in order, without
    a ``W x W`` matrix: each word's row is finished as soon as its last token's row arrives
    (a word cut by a block boundary carries over to the next block). Every step works on the
    whole batch at once, in place (a word's later rows add into its first row), on the columns
    of the words the block's keys reach (a causal block sees only earlier words; the others
    hold exact zeros, looked at only when no seen word beats zero).

    With ``native`` (the default) and :mod:`headlab.native`'s kernels built, each head's rows
    are added up in token space and a word is finished by one pass over its token sums, in C
    (``word_argmax_rows``); the same argmaxes, ties included.

    Shape: blocks ``(B, H, t, s)`` -> :meth:`result` ``(B, H, W)``.
    """

    def __init__(
        self,
        geo: Geometry,
        n_heads: int,
        buffer: torch.Tensor | None = None,
        *,
        native: bool = True,
    ) -> None:
        self.geo = geo
        n_batch, n_words = geo.word_real.shape
        self.n_real = geo.word_real.sum(1)  # (B,)
        # padding tokens count as word n_real: a column (or row) of exact zeros (a padded key
        # gets no weight) that no argmax may keep
        self.key_word = torch.minimum(geo.token_word, self.n_real[:, None])  # (B, T)
        self.blocked = ~geo.word_real | geo.word_special  # (B, W)
        self.special = [geo.word_special[b].nonzero().flatten() for b in range(n_batch)]
        # finished words go to columns 0..W-1, other block rows to the spare column W
        self.device = device = geo.token_word.device
        self.argmax = torch.zeros(n_batch, n_heads, n_words + 1, dtype=torch.long, device=device)
        self.carry: torch.Tensor | None = None  # (B, H, c) sums of a word cut by a block end
        # -1: nothing carried
        self.carry_word = torch.full((n_batch,), -1, dtype=torch.long, device=device)
        #: scratch (reused, also by the next layer's stream: fresh large buffers cost page faults)
        self.buffer = buffer
        # the native kernel (headlab.native) sums each head's current word row by row
        self.native = native and geo.token_word.device.type == "cpu" and cpu_kernels()
        if self.native:
            self.table = _word_table(geo, self.key_word, self.n_real)
            self.acc = torch.zeros(n_batch, n_heads, geo.token_word.shape[1])
            self.current = torch.full((n_batch,), -1, dtype=torch.long)
            self.argmax = torch.zeros(n_batch, n_heads, n_words, dtype=torch.long)

    def add(self, pattern: torch.Tensor, start: int) -> None:
        """Token rows ``start:start+t`` of every head, ``(B, H, t, s)``."""
        if self.native:
            self.current = native_word_argmax_rows(
                pattern.float(), start, self.table, self.acc, self.current, self.argmax
            )
            return
        n_batch, n_heads, n_rows, n_keys = pattern.shape
        n_words = self.blocked.shape[1]
        stop = start + n_rows
        n_cols = int(self.key_word[:, n_keys - 1].max()) + 1  # words the keys reach
        width = n_cols + 1  # + a spare column for fills
        if width >= CHUNKED_FROM:  # room for first_argmax's chunks (zeros)
            width = -(-width // ARGMAX_CHUNK) * ARGMAX_CHUNK
        size = n_batch * n_rows * n_heads * width
        if self.buffer is None or self.buffer.numel() < size:
            self.buffer = pattern.new_empty(size)
        cols = self.buffer[:size].view(n_batch, n_rows, n_heads, width).zero_()
        index = self.key_word[:, None, None, :n_keys].expand(n_batch, n_heads, n_rows, n_keys)
        cols.transpose(1, 2).scatter_add_(3, index, pattern)  # sums over attended words
        # each word's rows add up in its first row of the block (B, t, H, c)
        owners = self.key_word[:, start:stop].contiguous()  # (B, t) non-decreasing
        last = owners[:, -1]
        device = self.device
        head = torch.searchsorted(owners, owners)  # (B, t) first row of each row's word
        lead = head == torch.arange(n_rows, device=device)  # (B, t) rows that begin a word here
        if not bool(lead.all()):
            flat = cols.view(n_batch * n_rows, n_heads, width)
            base = n_rows * torch.arange(n_batch, device=device)[:, None]
            more = (~lead).flatten().nonzero().flatten()
            flat.index_add_(0, (head + base).flatten()[more], flat[more])
        rows = cols  # a word's row is now its first row's
        if self.carry is not None:
            carried = self.carry.shape[-1]
            cont = (self.carry_word == owners[:, 0]).to(rows.dtype)[:, None, None]  # (B, 1, 1)
            rows[:, 0, :, :carried] += self.carry * cont
        # a word whose tokens go on after this block is carried over, not finished
        if stop < self.key_word.shape[1]:
            open_word = (self.key_word[:, stop] == last) & (last < self.n_real)  # (B,)
        else:
            open_word = torch.zeros(n_batch, dtype=torch.bool, device=device)
        if bool(open_word.any()):
            at = head[:, -1, None, None, None].expand(n_batch, 1, n_heads, width)
            self.carry = rows.gather(1, at)[:, 0, :, :n_cols].clone()  # (B, H, c)
            self.carry_word = torch.where(open_word, last, -1)
        else:
            self.carry, self.carry_word = None, torch.full_like(self.carry_word, -1)
        # -1 on each row's own word and on special words (cells past the c columns go to the
        # spare column c), then the first maximum over the c columns
        word = owners
        n_special = max(len(s) for s in self.special)
        fill = torch.full((n_batch, n_rows, 1 + n_special), n_cols, dtype=torch.long, device=device)
        fill[..., 0] = word.clamp_max(n_cols)
        for b, special in enumerate(self.special):
            fill[b, :, 1 : 1 + len(special)] = special.clamp_max(n_cols)
        fill = fill[:, :, None].expand(n_batch, n_rows, n_heads, 1 + n_special)
        rows.scatter_(3, fill, -1.0)
        # (the columns past c hold -1 or 0: they can only win a row whose best does not beat 0,
        # and those rows are done again below)
        best, where = first_argmax(rows) if width >= CHUNKED_FROM else rows[..., :n_cols].max(-1)
        done = torch.minimum(last + 1 - open_word.long(), self.n_real)  # (B,) words finished
        finished = lead & (word < done[:, None])  # (B, t) rows that finish a word
        redo = (best <= 0) & finished[:, :, None]
        if bool(redo.any()):
            where = self._zero_rows(rows[..., :n_cols], redo, where, word)
        target = torch.where(finished, word, n_words)  # (B, t)
        target = target[:, None, :].expand(n_batch, n_heads, n_rows)
        self.argmax.scatter_(2, target, where.transpose(1, 2))

    def _zero_rows(
        self, rows: torch.Tensor, redo: torch.Tensor, where: torch.Tensor, word: torch.Tensor
    ) -> torch.Tensor:
        """Argmaxes of the ``redo`` rows (no seen word beats zero) over all ``W`` columns
        (the unseen ones hold zeros), with every excluded word at -1."""
        b, j, h = redo.nonzero(as_tuple=True)
        full = rows.new_zeros(len(b), self.blocked.shape[1])  # (k, W)
        n_cols = min(rows.shape[-1], full.shape[1])
        full[:, :n_cols] = rows[b, j, h, :n_cols]
        column = torch.arange(full.shape[1], device=full.device)
        full.masked_fill_(self.blocked[b] | (column[None, :] == word[b, j][:, None]), -1.0)
        where = where.clone()
        where[b, j, h] = full.max(-1).indices
        return where

    def result(self) -> torch.Tensor:
        """``(B, H, W)``: each word's most attended word, as :meth:`Geometry.word_argmax`."""
        if self.native:
            if bool((self.current >= 0).any()):  # words still open: the rows ended
                empty = self.acc.new_empty(*self.acc.shape[:2], 0, 0)
                self.current = native_word_argmax_rows(
                    empty, 0, self.table, self.acc, self.current, self.argmax, finish=True
                )
            return self.argmax
        return self.argmax[..., :-1]


def _word_table(geo: Geometry, key_word: torch.Tensor, n_real: torch.Tensor) -> WordTable:
    """The batch's words as the native word argmax takes them."""
    n_batch, n_words = geo.word_real.shape
    sizes = geo.to_words.sum(1).long()  # (B, W) tokens per word
    first = torch.cumsum(sizes, 1) - sizes  # (B, W) words are consecutive tokens, in order
    candidate = geo.candidates  # (B, W)
    single = candidate & (sizes == 1)
    word = key_word.clamp_max(n_words - 1)
    allowed = single.gather(1, word) & (key_word < n_real[:, None])  # (B, T)
    multi = [(candidate[b] & (sizes[b] > 1)).nonzero().flatten() for b in range(n_batch)]
    spans = torch.zeros(n_batch, 3, max(1, max(len(m) for m in multi)), dtype=torch.int32)
    for b, m in enumerate(multi):
        spans[b, 0, : len(m)] = m.int()
        spans[b, 1, : len(m)] = first[b, m].int()
        spans[b, 2, : len(m)] = sizes[b, m].int()
    return WordTable(
        key_word=key_word.contiguous(),
        n_real=n_real.contiguous(),
        allowed=allowed.to(torch.uint8).contiguous(),
        first_token=first.contiguous(),
        spans=spans,
        n_spans=torch.tensor([len(m) for m in multi], dtype=torch.long),
    )


def build_geometry(
    alignments: list[Alignment],
    n_positions: int,
    tokenizer: Any,
    *,
    causal: bool,
    device: torch.device | str = "cpu",
) -> Geometry:
    """Masks and word matrices for sentences padded (on the right) to ``n_positions`` tokens,
    on ``device`` (where the model's attention is: the probes work there)."""
    n_batch = len(alignments)
    n_words = max(len(a.words) for a in alignments)
    cls_token = getattr(tokenizer, "cls_token", None)
    # each token's kind: 0 word, 1 punctuation word, 2 [CLS], 3 other special, -1 padding
    kinds: list[list[int]] = []
    token_words: list[list[int]] = []
    specials: list[list[bool]] = []
    for a in alignments:
        word_kind = [
            (2 if word == cls_token else 3) if special else int(is_punctuation(word))
            for word, special in zip(a.words, a.is_special, strict=True)
        ]
        pad = n_positions - a.n_tokens
        kinds.append([word_kind[w] for w in a.token_to_word] + [-1] * pad)
        token_words.append(list(a.token_to_word) + [n_words] * pad)  # pad -> dummy word
        specials.append(list(a.is_special) + [False] * (n_words - len(a.words)))
    kind = torch.tensor(kinds, dtype=torch.long, device=device).view(n_batch, n_positions)
    token_word = torch.tensor(token_words, dtype=torch.long, device=device)
    token_word = token_word.view(n_batch, n_positions)
    word_special = torch.tensor(specials, dtype=torch.bool, device=device).view(n_batch, n_words)
    n_real = torch.tensor([len(a.words) for a in alignments], device=device)
    word_real = torch.arange(n_words, device=device)[None, :] < n_real[:, None]
    query = (kind == 0) | (kind == 1)
    cls = (kind == 2).float()
    sep = (kind == 3).float()
    punct = (kind == 1).float()
    lengths = torch.tensor([a.n_tokens for a in alignments], device=device)
    pos = torch.arange(n_positions, device=device)[None, :]
    visible = (pos + 1) if causal else lengths[:, None].expand(n_batch, n_positions)
    wide = torch.float32 if torch.device(device).type == "mps" else torch.float64  # mps: no f64
    zero = torch.zeros((), dtype=wide, device=device)
    log_visible = torch.where(pos < lengths[:, None], visible.to(wide).log(), zero).float()
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
