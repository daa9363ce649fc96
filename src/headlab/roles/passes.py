"""The streaming passes of role statistics: the treebank and GAP consumers that add up every
probe's sums block by block during the model's forward pass (the induction pass, over random
tokens, is :mod:`headlab.roles.repeated`).

Each layer's attention is computed by headlab in blocks of query rows during the model's own
forward pass (:mod:`headlab.models.streaming`); nothing is recomputed or kept between layers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from headlab.datasets.gap import GapData, GapExample
from headlab.datasets.treebank import TreebankSentence
from headlab.models.loading import LoadedModel
from headlab.models.runner import Batch, stream_corpus
from headlab.models.streaming import BlockConsumer
from headlab.models.words import Alignment
from headlab.progress import Progress
from headlab.roles import registry
from headlab.roles.bootstrap import Sums
from headlab.roles.geometry import WordArgmaxStream, build_geometry
from headlab.roles.options import RoleOptions
from headlab.roles.probes import (
    broad,
    coreference,
    delimiter,
    positional,
    rare,
    syntactic,
)

#: up to this many (words x tokens), the treebank pass takes word sums from the attention's own
#: product with one column per word; above it, :class:`WordArgmaxStream` (measured faster from
#: about 30 tokens on: the product's columns grow with the words, the stream's work does not)
DENSE_WORDS = 1 << 10


@dataclass(frozen=True)
class Cursor:
    """Which batches of a pass this process runs: every ``part[1]``-th from ``part[0]`` on
    (see :mod:`headlab.distributed`), less the first ``skip`` of them (done by the run that a
    checkpoint resumes); ``after_batch`` is called after each one that ran."""

    part: tuple[int, int] = (0, 1)
    skip: int = 0
    after_batch: Callable[[], None] | None = None


class _LayerSums:
    """Per-batch sums of one layer, added up over its query blocks, then into :class:`Sums`."""

    def __init__(self, sums: Sums, n_layers: int, indices: list[int], n_heads: int) -> None:
        self.sums = sums
        self.n_layers = n_layers
        self.indices = indices
        self.n_heads = n_heads  # the most heads of any layer
        self.parts: dict[str, torch.Tensor] = {}

    def add(self, name: str, value: torch.Tensor) -> None:
        part = self.parts.get(name)
        self.parts[name] = value if part is None else part + value

    def flush(self, layer: int) -> None:
        for name, value in self.parts.items():
            self.sums.add_layer(
                name, layer, self.n_layers, self.indices, value, n_heads=self.n_heads
            )
        self.parts.clear()


class _Follows:
    """A consumer whose per-batch tables (``_placed``) follow the device of the layer whose
    blocks come in: a model spread over devices runs each layer's statistics where that layer
    runs. Each table is copied once per batch to each device; one device costs nothing."""

    _placed: tuple[str, ...] = ()
    _here: torch.device

    def _follow(self, device: torch.device) -> None:
        if device == self._here:
            return
        copies: dict[torch.device, dict[str, Any]] = self.__dict__.setdefault("_copies", {})
        copies[self._here] = {name: getattr(self, name) for name in self._placed}
        values = copies.get(device)
        if values is None:
            values = {name: value.to(device) for name, value in copies[self._here].items()}
        for name, value in values.items():
            setattr(self, name, value)
        self._here = device
        self._on_device_change()

    def _on_device_change(self) -> None:
        """Drop scratch buffers that belong to the previous device."""


class TreebankBlocks(_Follows):
    """The treebank pass for one batch: every probe of every layer, fed block by block
    (:class:`~headlab.models.streaming.BlockConsumer`), into ``sums``.

    Benchmarks can feed it weights from elsewhere (eager maps) through the same three calls.
    """

    _placed = (
        "geo",
        "positional_geo",
        "_columns",
        "_owners",
        "gold_head",
        "relation",
        "rare_target",
        "rare_query",
    )

    def __init__(
        self,
        lm: LoadedModel,
        batch: Batch,
        sentences: Sequence[TreebankSentence],
        frequencies: Counter[str],
        relations: list[str],
        sums: Sums,
        offsets: torch.Tensor | None = None,
    ) -> None:
        """``offsets`` ``(Rel, 2)``: the baseline offsets chosen on the whole treebank
        (:func:`~headlab.roles.probes.syntactic.best_offsets`); with them the pass also counts
        the arcs where a head and its baseline are both right (``syntactic.both``)."""
        n_positions = batch.inputs["input_ids"].shape[1]
        device = batch.inputs["input_ids"].device
        self.geo = geo = build_geometry(
            batch.alignments, n_positions, lm.tokenizer, causal=lm.causal, device=device
        )
        n_words = geo.word_real.shape[1]
        n_batch = len(batch.indices)
        rel_id = {r: i for i, r in enumerate(relations)}
        n_rel = self.n_rel = len(relations)
        self.causal = causal = lm.causal
        gold_head = [[-1] * n_words for _ in range(n_batch)]
        relation = [[n_rel] * n_words for _ in range(n_batch)]
        rare_target = [[False] * n_words for _ in range(n_batch)]
        rare_query = [[False] * n_words for _ in range(n_batch)]
        rare_chance = torch.zeros(n_batch)
        counts = torch.zeros(n_batch, n_rel, 2)
        base = torch.zeros(n_batch, n_rel, 2, len(syntactic.OFFSETS))
        base_to_head = [[False] * n_words for _ in range(n_batch)]
        base_to_dep = torch.zeros(n_batch, n_words, n_rel + 1, dtype=torch.bool)
        for b, (i, a) in enumerate(zip(batch.indices, batch.alignments, strict=True)):
            s = sentences[i]
            plain = a.plain_words  # treebank word k is batch word plain[k]
            rels = [rel_id.get(r, -1) for r in s.relations]
            for k, (h, r) in enumerate(zip(s.heads, rels, strict=True)):
                if h >= 0 and r >= 0:
                    gold_head[b][plain[k]] = plain[h]
                    relation[b][plain[k]] = r
            counts[b], base[b] = syntactic.sentence_counts(s.heads, rels, n_rel, causal=causal)
            if offsets is not None:
                to_head, to_dep = syntactic.baseline_flags(s.heads, rels, offsets)
                for k in range(len(s.words)):
                    base_to_head[b][plain[k]] = to_head[k]
                    base_to_dep[b, plain[k], sorted(to_dep[k])] = True
            target = rare.targets(s.words, frequencies)
            queries, rare_chance[b] = rare.queries(target, causal=causal)
            for k, (t, q) in enumerate(zip(target, queries, strict=True)):
                rare_target[b][plain[k]] = t
                rare_query[b][plain[k]] = q

        def table(rows: list[list[Any]], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(rows, dtype=dtype, device=device).view(n_batch, n_words)

        self.gold_head = table(gold_head, torch.long)
        self.relation = table(relation, torch.long)
        self.rare_target = table(rare_target, torch.bool)
        self.rare_query = table(rare_query, torch.bool)
        self.base_to_head: torch.Tensor | None = None
        self.base_to_dep: torch.Tensor | None = None
        if offsets is not None:
            self.base_to_head = table(base_to_head, torch.bool)
            self.base_to_dep = base_to_dep.to(device)
        idx = batch.indices
        sums.add("queries", idx, geo.query.sum(1).float())
        sums.add("delimiter.queries", idx, delimiter.count(geo))
        # a causal row sees no later token: the positional offsets are -3..0, on the rows that
        # see all four (the first rows' argmax would be at 0 or -1 for want of other keys)
        self.positional_geo = geo
        if causal:
            early = torch.arange(n_positions, device=device)[None, :] < -positional.OFFSETS[0]
            self.positional_geo = replace(geo, query=geo.query & ~early)
            sums.add("positional.queries", idx, self.positional_geo.query.sum(1).float())
        sums.add("broad.rows", idx, (geo.query & (geo.log_visible > 0)).sum(1).float())
        sums.add("rare.queries", idx, self.rare_query.sum(1).float())
        sums.add("rare.chance", idx, rare_chance)
        sums.add("syntactic.count", idx, counts)
        sums.add("syntactic.baseline", idx, base)
        self.layer_sums = _LayerSums(sums, lm.n_layers, idx, lm.n_heads)
        #: the probes of registered roles fed by this pass beyond the built-in ones
        self.probes = registry.collectors("treebank")
        # the delimiter masses, and word sums of short inputs, come out of the attention's own
        # product with the values (see headlab.models.streaming)
        self.dense_words = n_words * n_positions <= DENSE_WORDS
        cols = [delimiter.columns(geo)]
        if self.dense_words:
            cols.append(geo.to_words)
        self._columns = torch.cat(cols, dim=-1)  # (B, T, 4 [+ W])
        self._words: WordArgmaxStream | None = None  # long inputs
        self._word_buffer: torch.Tensor | None = None  # its scratch, kept from layer to layer
        self._token_cols: torch.Tensor | None = None  # short inputs: (B, T, H, W)
        self._owners = geo.to_words.transpose(1, 2).contiguous()  # (B, W, T)
        self._here = torch.device(device)

    def _on_device_change(self) -> None:
        self._word_buffer = None
        self._token_cols = None

    def columns(self, layer: int) -> torch.Tensor:
        return self._columns

    def block(
        self,
        layer: int,
        start: int,
        weights: torch.Tensor,
        entropy: torch.Tensor,
        top: torch.Tensor,
        mixed: torch.Tensor | None,
    ) -> None:
        self._follow(weights.device)
        geo = self.geo
        if mixed is None:
            mixed = weights @ self._columns[:, None, : weights.shape[-1]]
        parts = (  # weights (B, H, t, s)
            positional.collect(weights, self.positional_geo, start, top=top),
            delimiter.collect(weights, geo, start, mass=mixed[..., : delimiter.N_COLUMNS]),
            broad.collect(weights, geo, start, entropy=entropy),
            *(collect(weights, geo, start) for collect in self.probes),
        )
        for part in parts:
            for name, value in part.items():
                self.layer_sums.add(name, value)
        if self.dense_words:  # each token row's sums over attended words, kept for the layer
            n_batch, n_heads, n_rows, _ = weights.shape
            if self._token_cols is None or self._token_cols.shape[2] != n_heads:
                n_tok, n_words = self._owners.shape[2], self._owners.shape[1]
                self._token_cols = weights.new_empty(n_batch, n_tok, n_heads, n_words)
            self._token_cols[:, start : start + n_rows] = mixed[
                ..., delimiter.N_COLUMNS :
            ].transpose(1, 2)
        else:
            if self._words is None:
                self._words = WordArgmaxStream(geo, weights.shape[1], buffer=self._word_buffer)
            self._words.add(weights, start)

    def layer_done(self, layer: int) -> None:
        self.layer_sums.flush(layer)
        if self.dense_words:
            if self._token_cols is None:
                return
            n_batch, n_tok, n_heads, n_words = self._token_cols.shape
            flat = self._token_cols.view(n_batch, n_tok, n_heads * n_words)
            words = torch.bmm(self._owners, flat).view(n_batch, n_words, n_heads, n_words)
            words = words.permute(0, 2, 1, 3)  # (B, H, W, W) sums over both words' tokens
            argmax = self.geo.word_argmax_sums(words)  # (B, H, W)
        elif self._words is not None:
            argmax, self._word_buffer = self._words.result(), self._words.buffer
            self._words = None
        else:
            return
        arcs = syntactic.collect(
            argmax,
            self.gold_head,
            self.relation,
            self.n_rel,
            self.base_to_head,
            self.base_to_dep,
            causal=self.causal,
        )
        if arcs.dim() == 5:  # hits, and the arcs where the baseline is right too
            self.layer_sums.add("syntactic.hits", arcs[..., 0])
            self.layer_sums.add("syntactic.both", arcs[..., 1])
        else:
            self.layer_sums.add("syntactic.hits", arcs)
        self.layer_sums.add("rare.hits", rare.collect(argmax, self.rare_target, self.rare_query))
        self.layer_sums.flush(layer)


def treebank_pass(
    lm: LoadedModel,
    sentences: Sequence[TreebankSentence],
    frequencies: Counter[str],
    relations: list[str],
    sums: Sums,
    options: RoleOptions,
    cursor: Cursor = Cursor(),
    offsets: torch.Tensor | None = None,
    progress: Progress | None = None,
) -> dict[str, int]:
    """Add the treebank's sums into ``sums``; returns the sentences left out, by reason."""

    def blocks(batch: Batch) -> TreebankBlocks:
        return TreebankBlocks(lm, batch, sentences, frequencies, relations, sums, offsets)

    skipped: Counter[str] = Counter()
    _stream(
        lm, [s.words for s in sentences], blocks, options, skipped, cursor, progress, "treebank"
    )
    return dict(skipped)


def _stream(
    lm: LoadedModel,
    texts: Sequence[Sequence[str] | str],
    blocks: Callable[[Batch], BlockConsumer],
    options: RoleOptions,
    skipped: Counter[str],
    cursor: Cursor,
    progress: Progress | None,
    name: str,
    unit: str = "sentences",
) -> None:
    """Run ``texts`` (the batches ``cursor`` names) through the model, each batch's attention
    blocks into ``blocks(batch)``; count the sentences of the whole corpus that cannot be
    batched, by reason. One stage ``name`` of ``progress``."""
    for s in stream_corpus(
        lm,
        texts,
        blocks,
        batch_tokens=options.batch_tokens,
        block_elements=options.block_elements,
        dtype=options.dtype,
        progress=progress,
        stage=name,
        part=cursor.part,
        skip=cursor.skip,
        after_batch=cursor.after_batch,
        unit=unit,
    ):
        skipped[s.kind or s.reason] += 1


def _gap_words(a: Alignment, span: tuple[int, int]) -> list[int]:
    start, end = span
    return [
        w for w, (s, e) in enumerate(a.word_spans) if not a.is_special[w] and s < end and e > start
    ]


class GapBlocks(_Follows):
    """The GAP pass for one batch: each head's word-level attention from the pronoun, fed block
    by block, into ``sums``."""

    _placed = ("geo", "from_pronoun", "candidates", "answer", "valid")

    def __init__(
        self,
        lm: LoadedModel,
        batch: Batch,
        examples: Sequence[GapExample],
        sums: Sums,
        skipped: Counter[str],
    ) -> None:
        n_positions = batch.inputs["input_ids"].shape[1]
        device = batch.inputs["input_ids"].device
        self.geo = geo = build_geometry(
            batch.alignments, n_positions, lm.tokenizer, causal=lm.causal, device=device
        )
        n_batch, n_words = geo.word_real.shape
        pronoun = torch.zeros(n_batch, dtype=torch.long)
        self.candidates = torch.zeros(n_batch, 2, n_words, dtype=torch.bool)
        self.answer = torch.zeros(n_batch, dtype=torch.long)
        self.valid = torch.zeros(n_batch)
        nearest = torch.zeros(n_batch)
        first = torch.zeros(n_batch)
        for b, (i, a) in enumerate(zip(batch.indices, batch.alignments, strict=True)):
            ex = examples[i]
            p_words = _gap_words(a, ex.pronoun)
            c_words = [_gap_words(a, c) for c in ex.candidates]
            if len(p_words) != 1 or not all(c_words) or set(c_words[0]) & set(c_words[1]):
                skipped["pronoun or names not matched to words"] += 1
                continue
            if lm.causal and max(max(c) for c in c_words) > p_words[0]:
                # the pronoun cannot see a name after it: the head would choose by default
                skipped["a name after the pronoun (causal model)"] += 1
                continue
            self.valid[b] = 1.0
            pronoun[b] = p_words[0]
            for c, ws in enumerate(c_words):
                self.candidates[b, c, ws] = True
            self.answer[b] = ex.answer
            distance = [_distance(ex.pronoun, c) for c in ex.candidates]
            nearest[b] = float(int(distance[1] < distance[0]) == ex.answer)
            first[b] = float(int(ex.candidates[1][0] < ex.candidates[0][0]) == ex.answer)
        idx = batch.indices
        sums.add("coref.examples", idx, self.valid)
        sums.add("coref.nearest", idx, nearest)
        sums.add("coref.first", idx, first)
        # (B, 2): which baselines are right, to count the pronouns where a head is right too
        self.baseline_right = torch.stack([nearest, first], 1).to(device)
        self.candidates = self.candidates.to(device)
        self.answer = self.answer.to(device)
        self.valid = self.valid.to(device)
        pronoun = pronoun.to(device)
        self.from_pronoun = geo.from_words[torch.arange(n_batch, device=device), pronoun]  # (B, T)
        self.layer_sums = _LayerSums(sums, lm.n_layers, idx, lm.n_heads)
        #: the probes of registered roles fed by this pass beyond the built-in ones
        self.probes = registry.collectors("treebank")
        self._seen: torch.Tensor | None = None  # (B, H, T): the pronoun's rows, as a word
        self._here = torch.device(device)

    def columns(self, layer: int) -> None:
        return None

    def block(
        self,
        layer: int,
        start: int,
        weights: torch.Tensor,
        entropy: torch.Tensor,
        top: torch.Tensor,
        mixed: torch.Tensor | None,
    ) -> None:
        n_batch, n_heads, n_rows, n_keys = weights.shape
        self._follow(weights.device)
        if self._seen is None:
            self._seen = weights.new_zeros(n_batch, n_heads, self.from_pronoun.shape[1])
        share = self.from_pronoun[:, start : start + n_rows]  # (B, t)
        where = share.nonzero()  # (n, 2): (row of the batch, query row) of pronoun tokens
        if where.numel():
            rows = weights[where[:, 0], :, where[:, 1]]  # (n, H, s)
            rows = rows * share[where[:, 0], where[:, 1]][:, None, None]
            self._seen[..., :n_keys].index_add_(0, where[:, 0], rows)

    def layer_done(self, layer: int) -> None:
        seen, self._seen = self._seen, None
        if seen is None:
            return
        row = coreference.to_word_row(seen, self.geo)
        hits = coreference.collect(row, self.candidates, self.answer) * self.valid[:, None]
        self.layer_sums.add("coref.hits", hits)
        both = hits[..., None] * self.baseline_right[:, None, :]  # (B, H, 2)
        self.layer_sums.add("coref.both", both)
        self.layer_sums.flush(layer)


def gap_pass(
    lm: LoadedModel,
    gap: GapData,
    sums: Sums,
    options: RoleOptions,
    cursor: Cursor = Cursor(),
    counts: Counter[str] | None = None,
    progress: Progress | None = None,
) -> dict[str, int]:
    """Add the GAP examples' sums into ``sums``; returns the rows left out, by reason: those
    of the whole data set (the reader's, and those that cannot be batched), plus those of the
    batches that ran when no ``counts`` is given; else these go into ``counts``."""
    skipped: Counter[str] = Counter({k: v for k, v in gap.skipped.items() if v})
    in_batches = skipped if counts is None else counts

    def blocks(batch: Batch) -> GapBlocks:
        return GapBlocks(lm, batch, gap.examples, sums, in_batches)

    texts = [e.text for e in gap.examples]
    _stream(lm, texts, blocks, options, skipped, cursor, progress, "GAP", "passages")
    return dict(skipped)


def _distance(a: tuple[int, int], b: tuple[int, int]) -> int:
    return max(b[0] - a[1], a[0] - b[1], 0)
