"""Measure every head's roles on gold data, in one streaming pass per data set.

Each layer's attention is computed by headlab in blocks of query rows during the model's own
forward pass (:mod:`headlab.models.streaming`; never eager attention, never a recomputation),
each probe adds up per-sentence sums from every block as it goes by, and the bootstrap
replicates ride along in the same pass (:mod:`headlab.roles.bootstrap`).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from headlab.datasets.gap import GapData, GapExample
from headlab.datasets.treebank import TreebankSentence
from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.models.runner import Batch, stream_corpus
from headlab.models.streaming import BlockConsumer
from headlab.models.words import Alignment
from headlab.roles.bootstrap import Sums
from headlab.roles.classify import LETTERS, ROLES, RoleEvidence, Thresholds, role_name
from headlab.roles.geometry import WordArgmaxStream, build_geometry
from headlab.roles.probes import (
    broad,
    coreference,
    delimiter,
    induction,
    positional,
    rare,
    syntactic,
)

logger = logging.getLogger(__name__)

#: up to this many (words x tokens), the treebank pass takes word sums from the attention's own
#: product with one column per word; above it, :class:`WordArgmaxStream` (measured faster from
#: about 30 tokens on: the product's columns grow with the words, the stream's work does not)
DENSE_WORDS = 1 << 10


@dataclass(frozen=True, kw_only=True)
class RoleOptions:
    """How to measure.

    Attributes:
        replicates: bootstrap resamples for stability (0 turns stability off).
        seed: seed of the bootstrap weights and the induction sequences.
        batch_tokens: padded tokens per forward pass.
        induction_sequences: random repeated sequences for the induction probe (causal models).
        induction_length: length of each random half.
        thresholds: the bars of each role.
        progress: a progress bar on stderr.
        block_elements: attention is computed in blocks of query rows of about this many
            weights (``B x H x rows x S``), so no full ``T x S`` pattern of a long input exists.
        dtype: precision of ``q k^T`` (``torch.bfloat16`` is faster on CPUs with AMX; the
            softmax and the statistics stay in float32); ``None``: the model's.
    """

    replicates: int = 100
    seed: int = 0
    batch_tokens: int = 4096
    induction_sequences: int = 32
    induction_length: int = 48
    thresholds: Thresholds = field(default_factory=Thresholds)
    progress: bool = False
    block_elements: int = 1 << 20
    dtype: torch.dtype | None = None


@dataclass(frozen=True, kw_only=True)
class HeadRole:
    """One head's result. ``layer`` and ``head`` are 0-based."""

    layer: int
    head: int
    role: str
    roles: tuple[str, ...]
    score: float | None
    baseline: float | None
    margin: float | None
    detail: str
    stability: float | None
    scores: dict[str, float | None]


@dataclass(frozen=True, kw_only=True)
class RelationRow:
    """The best head for one relation and direction, against the best fixed offset."""

    relation: str
    direction: str
    layer: int
    head: int
    accuracy: float
    baseline: float
    baseline_offset: int
    count: int


@dataclass(frozen=True, kw_only=True)
class CoreferenceResult:
    """The best coreference head on GAP, and the baselines' accuracies."""

    layer: int
    head: int
    accuracy: float
    count: int
    baselines: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class RoleReport:
    """Everything ``headlab roles`` measured (see :meth:`to_json` for the schema)."""

    model: str
    n_layers: int
    n_heads: int
    heads: list[HeadRole]
    #: heads of each layer, when not ``n_heads`` everywhere (a model pruned layer by layer)
    heads_in_layer: tuple[int, ...] | None = None
    relations: list[RelationRow]
    coreference: CoreferenceResult | None
    data: dict[str, Any]
    thresholds: Thresholds
    replicates: int

    @property
    def layer_heads(self) -> tuple[int, ...]:
        """Heads of each layer."""
        return self.heads_in_layer or (self.n_heads,) * self.n_layers

    def head(self, layer: int, head: int) -> HeadRole:
        counts = self.layer_heads
        if not 0 <= head < counts[layer]:
            raise IndexError(f"layer {layer} has heads 0..{counts[layer] - 1}, not {head}")
        return self.heads[sum(counts[:layer]) + head]

    def role_counts(self) -> dict[str, int]:
        """How many heads have each dominant role (unclassified included)."""
        counts = Counter(h.role for h in self.heads)
        return {role: counts.get(role, 0) for role in (*ROLES, "unclassified")}

    def grid(self) -> list[list[str]]:
        """Role letters, ``layers x heads`` (``-`` where a pruned layer has no such head)."""
        return [
            [LETTERS[self.head(layer, h).role] if h < count else "-" for h in range(self.n_heads)]
            for layer, count in enumerate(self.layer_heads)
        ]

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (schema ``headlab.roles/1``; 0-based layer and head)."""
        return {
            "schema": "headlab.roles/1",
            "model": self.model,
            "layers": self.n_layers,
            "heads_per_layer": self.n_heads,
            "heads_in_layer": list(self.layer_heads),
            "replicates": self.replicates,
            "thresholds": vars(self.thresholds),
            "data": self.data,
            "role_counts": self.role_counts(),
            "heads": [_rounded(vars(h)) for h in self.heads],
            "relations": [_rounded(vars(r)) for r in self.relations],
            "coreference": None if self.coreference is None else _rounded(vars(self.coreference)),
        }


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return None if math.isnan(obj) else round(obj, 4)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v) for v in obj]
    return obj


# ---------------------------------------------------------------------------------- passes


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


class TreebankBlocks:
    """The treebank pass for one batch: every probe of every layer, fed block by block
    (:class:`~headlab.models.streaming.BlockConsumer`), into ``sums``.

    Benchmarks can feed it weights from elsewhere (eager maps) through the same three calls.
    """

    def __init__(
        self,
        lm: LoadedModel,
        batch: Batch,
        sentences: Sequence[TreebankSentence],
        frequencies: Counter[str],
        relations: list[str],
        sums: Sums,
    ) -> None:
        n_positions = batch.inputs["input_ids"].shape[1]
        self.geo = geo = build_geometry(
            batch.alignments, n_positions, lm.tokenizer, causal=lm.causal
        )
        n_words = geo.word_real.shape[1]
        n_batch = len(batch.indices)
        rel_id = {r: i for i, r in enumerate(relations)}
        n_rel = self.n_rel = len(relations)
        gold_head = [[-1] * n_words for _ in range(n_batch)]
        relation = [[n_rel] * n_words for _ in range(n_batch)]
        rare_target = [[False] * n_words for _ in range(n_batch)]
        rare_query = [[False] * n_words for _ in range(n_batch)]
        rare_chance = torch.zeros(n_batch)
        counts = torch.zeros(n_batch, n_rel, 2)
        base = torch.zeros(n_batch, n_rel, 2, len(syntactic.OFFSETS))
        for b, (i, a) in enumerate(zip(batch.indices, batch.alignments, strict=True)):
            s = sentences[i]
            plain = a.plain_words  # treebank word k is batch word plain[k]
            rels = [rel_id.get(r, -1) for r in s.relations]
            for k, (h, r) in enumerate(zip(s.heads, rels, strict=True)):
                if h >= 0 and r >= 0:
                    gold_head[b][plain[k]] = plain[h]
                    relation[b][plain[k]] = r
            counts[b], base[b] = syntactic.sentence_counts(s.heads, rels, n_rel)
            target = rare.targets(s.words, frequencies)
            n_target = sum(target)
            if n_target and len(s.words) > n_target:
                for k, t in enumerate(target):
                    rare_target[b][plain[k]] = t
                    rare_query[b][plain[k]] = not t
                rare_chance[b] = (len(s.words) - n_target) * n_target / (len(s.words) - 1)
        self.gold_head = torch.tensor(gold_head, dtype=torch.long).view(n_batch, n_words)
        self.relation = torch.tensor(relation, dtype=torch.long).view(n_batch, n_words)
        self.rare_target = torch.tensor(rare_target, dtype=torch.bool).view(n_batch, n_words)
        self.rare_query = torch.tensor(rare_query, dtype=torch.bool).view(n_batch, n_words)
        idx = batch.indices
        sums.add("queries", idx, geo.query.sum(1).float())
        sums.add("broad.rows", idx, (geo.query & (geo.log_visible > 0)).sum(1).float())
        sums.add("rare.queries", idx, self.rare_query.sum(1).float())
        sums.add("rare.chance", idx, rare_chance)
        sums.add("syntactic.count", idx, counts)
        sums.add("syntactic.baseline", idx, base)
        self.layer_sums = _LayerSums(sums, lm.n_layers, idx, lm.n_heads)
        # the delimiter masses, and word sums of short inputs, come out of the attention's own
        # product with the values (see headlab.models.streaming)
        self.dense_words = n_words * n_positions <= DENSE_WORDS
        cols = [delimiter.columns(geo)]
        if self.dense_words:
            cols.append(geo.to_words)
        self._columns = torch.cat(cols, dim=-1)  # (B, T, 3 [+ W])
        self._words: WordArgmaxStream | None = None  # long inputs
        self._word_buffer: torch.Tensor | None = None  # its scratch, kept from layer to layer
        self._token_cols: torch.Tensor | None = None  # short inputs: (B, T, H, W)
        self._owners = geo.to_words.transpose(1, 2).contiguous()  # (B, W, T)

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
        geo = self.geo
        if mixed is None:
            mixed = weights @ self._columns[:, None, : weights.shape[-1]]
        parts = (  # weights (B, H, t, s)
            positional.collect(weights, geo, start, top=top),
            delimiter.collect(weights, geo, start, mass=mixed[..., :3]),
            broad.collect(weights, geo, start, entropy=entropy),
        )
        for part in parts:
            for name, value in part.items():
                self.layer_sums.add(name, value)
        if self.dense_words:  # each token row's sums over attended words, kept for the layer
            n_batch, n_heads, n_rows, _ = weights.shape
            if self._token_cols is None or self._token_cols.shape[2] != n_heads:
                n_tok, n_words = self._owners.shape[2], self._owners.shape[1]
                self._token_cols = weights.new_empty(n_batch, n_tok, n_heads, n_words)
            self._token_cols[:, start : start + n_rows] = mixed[..., 3:].transpose(1, 2)
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
        self.layer_sums.add(
            "syntactic.hits", syntactic.collect(argmax, self.gold_head, self.relation, self.n_rel)
        )
        self.layer_sums.add("rare.hits", rare.collect(argmax, self.rare_target, self.rare_query))
        self.layer_sums.flush(layer)


def _treebank_pass(
    lm: LoadedModel,
    sentences: Sequence[TreebankSentence],
    frequencies: Counter[str],
    relations: list[str],
    sums: Sums,
    options: RoleOptions,
) -> dict[str, int]:
    def blocks(batch: Batch) -> TreebankBlocks:
        return TreebankBlocks(lm, batch, sentences, frequencies, relations, sums)

    skipped: Counter[str] = Counter()
    _stream(lm, [s.words for s in sentences], blocks, options, skipped)
    return dict(skipped)


def _stream(
    lm: LoadedModel,
    texts: Sequence[Sequence[str] | str],
    blocks: Callable[[Batch], BlockConsumer],
    options: RoleOptions,
    skipped: Counter[str],
) -> None:
    """Run ``texts`` through the model, each batch's attention blocks into ``blocks(batch)``;
    count the sentences left out, by reason."""
    for s in stream_corpus(
        lm,
        texts,
        blocks,
        batch_tokens=options.batch_tokens,
        block_elements=options.block_elements,
        dtype=options.dtype,
        progress=options.progress,
    ):
        skipped[_reason(s.reason)] += 1


def _reason(message: str) -> str:
    if "tokens long" in message:
        return "longer than the model accepts"
    if "does not fall inside one word" in message or "no token for" in message:
        return "words could not be aligned to tokens"
    return message


def _gap_words(a: Alignment, span: tuple[int, int]) -> list[int]:
    start, end = span
    return [
        w for w, (s, e) in enumerate(a.word_spans) if not a.is_special[w] and s < end and e > start
    ]


class GapBlocks:
    """The GAP pass for one batch: each head's word-level attention from the pronoun, fed block
    by block, into ``sums``."""

    def __init__(
        self,
        lm: LoadedModel,
        batch: Batch,
        examples: Sequence[GapExample],
        sums: Sums,
        skipped: Counter[str],
    ) -> None:
        n_positions = batch.inputs["input_ids"].shape[1]
        self.geo = geo = build_geometry(
            batch.alignments, n_positions, lm.tokenizer, causal=lm.causal
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
        self.from_pronoun = geo.from_words[torch.arange(n_batch), pronoun]  # (B, T)
        self.layer_sums = _LayerSums(sums, lm.n_layers, idx, lm.n_heads)
        self._seen: torch.Tensor | None = None  # (B, H, T): the pronoun's rows, as a word

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
        hits = coreference.collect(row, self.candidates, self.answer)
        self.layer_sums.add("coref.hits", hits * self.valid[:, None])
        self.layer_sums.flush(layer)


def _gap_pass(lm: LoadedModel, gap: GapData, sums: Sums, options: RoleOptions) -> dict[str, int]:
    skipped: Counter[str] = Counter({k: v for k, v in gap.skipped.items() if v})

    def blocks(batch: Batch) -> GapBlocks:
        return GapBlocks(lm, batch, gap.examples, sums, skipped)

    _stream(lm, [e.text for e in gap.examples], blocks, options, skipped)
    return dict(skipped)


def _distance(a: tuple[int, int], b: tuple[int, int]) -> int:
    return max(b[0] - a[1], a[0] - b[1], 0)


def _induction_pass(lm: LoadedModel, sums: Sums, options: RoleOptions) -> None:
    from headlab.models.capture import HeadCapture

    ids, start = induction.sequences(
        lm.tokenizer, options.induction_sequences, options.induction_length, options.seed
    )
    limit = lm.max_positions
    if limit is not None and ids.shape[1] > limit:
        raise InputError(
            f"induction sequences of {ids.shape[1]} tokens exceed the model's {limit} positions"
        )
    per_batch = max(1, options.batch_tokens // ids.shape[1])
    for lo in range(0, ids.shape[0], per_batch):
        chunk = ids[lo : lo + per_batch].to(lm.device)
        items = list(range(lo, lo + chunk.shape[0]))
        with torch.inference_mode(), HeadCapture(lm, record_head_outputs=False) as cap:
            lm.model(input_ids=chunk, attention_mask=torch.ones_like(chunk))
        sums.add("induction.n", items, torch.ones(len(items)))
        for layer in range(lm.n_layers):
            value = induction.collect(cap.pattern(layer).cpu(), options.induction_length, start)
            sums.add_layer("induction.sum", layer, lm.n_layers, items, value, n_heads=lm.n_heads)


# ---------------------------------------------------------------------------------- scoring


def _evidence(
    tb: Sums, gap: Sums | None, ind: Sums | None, thresholds: Thresholds
) -> tuple[RoleEvidence, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    scores: dict[str, torch.Tensor] = {}
    scores.update(positional.scores(tb))
    scores.update(delimiter.scores(tb))
    scores.update(broad.scores(tb))
    scores.update(rare.scores(tb))
    syn = syntactic.scores(tb)
    shape = scores["positional"].shape  # (R+1, L, H)
    eligible = syn["count"][0] >= thresholds.min_relation_count  # (Rel, 2)
    margin = (syn["accuracy"] - syn["baseline"][:, None, None]).nan_to_num(-2.0)
    margin = margin.masked_fill(~eligible, -2.0).flatten(-2)  # (R+1, L, H, Rel*2)
    best = margin.argmax(-1)  # (R+1, L, H)
    acc = syn["accuracy"].flatten(-2).gather(-1, best[..., None]).squeeze(-1)
    base = (
        syn["baseline"].flatten(-2)[:, None, None, :].expand(*shape, -1).gather(-1, best[..., None])
    ).squeeze(-1)
    if not bool(eligible.any()):
        acc = torch.full(shape, torch.nan, dtype=acc.dtype)
    scores["syntactic"] = acc
    scores["syntactic_relation"] = best
    score: dict[str, torch.Tensor] = {}
    baseline: dict[str, torch.Tensor] = {}
    bar: dict[str, torch.Tensor] = {}

    def fixed(role: str, key: str, value: float) -> None:
        score[role] = scores[key]
        baseline[role] = torch.full(shape, value, dtype=torch.float64)
        bar[role] = baseline[role]

    fixed("positional", "positional", thresholds.positional)
    fixed("delimiter", "delimiter", thresholds.delimiter)
    fixed("rare-token", "rare-token", thresholds.rare_token)
    fixed("broad", "broad", thresholds.broad)
    baseline["rare-token"] = scores["rare_chance"]
    score["syntactic"] = acc
    baseline["syntactic"] = base
    bar["syntactic"] = base + thresholds.syntactic_margin
    if gap is not None and "coref.examples" in gap:
        coref = coreference.scores(gap)
        scores.update(coref)
        best_base = torch.maximum(coref["coref_nearest"], coref["coref_first"])[:, None, None]
        score["coreference"] = coref["coreference"]
        baseline["coreference"] = best_base.expand(shape)
        bar["coreference"] = baseline["coreference"] + thresholds.coreference_margin
    if ind is not None and "induction.n" in ind:
        scores.update(induction.scores(ind))
        fixed("induction", "induction", thresholds.induction)
    return RoleEvidence(score=score, baseline=baseline, bar=bar), scores, syn


def measure_roles(
    lm: LoadedModel,
    treebank: Sequence[TreebankSentence],
    *,
    gap: GapData | None = None,
    frequencies: Counter[str] | None = None,
    options: RoleOptions | None = None,
) -> RoleReport:
    """Score every head of ``lm`` for every role, classify it, and bootstrap the stability.

    Args:
        lm: the model.
        treebank: gold sentences (positional, delimiter, broad, rare-token, syntactic probes).
        gap: GAP examples (coreference probe); ``None`` skips it.
        frequencies: word counts for the rare-token probe (default: the treebank's own).
        options: replicates, seed, batch size, thresholds.
    """
    from headlab.datasets.treebank import word_frequencies

    options = options or RoleOptions()
    if lm.device.type != "cpu":  # the word geometry and the sums live on the CPU
        raise InputError(
            f"role statistics run on the CPU for now, but the model is on {lm.device}: "
            "load it on the CPU (headlab.models.load does by default)"
        )
    if options.replicates < 0:
        raise InputError(f"replicates must be 0 or more, got {options.replicates}")
    if not treebank:
        raise InputError("the treebank has no sentences")
    freq = frequencies if frequencies is not None else word_frequencies(treebank)
    relations = sorted({r for s in treebank for r in s.relations} - {"root"})
    tb = Sums(len(treebank), options.replicates, options.seed)
    tb_skipped = _treebank_pass(lm, treebank, freq, relations, tb, options)
    if "queries" not in tb:
        raise InputError("no treebank sentence could be aligned to the model's tokens")
    gap_sums = None
    gap_skipped: dict[str, int] = {}
    if gap is not None:
        gap_sums = Sums(len(gap.examples), options.replicates, options.seed + 1)
        gap_skipped = _gap_pass(lm, gap, gap_sums, options)
    ind = None
    if lm.causal:
        ind = Sums(options.induction_sequences, options.replicates, options.seed + 2)
        _induction_pass(lm, ind, options)
    evidence, scores, syn = _evidence(tb, gap_sums, ind, options.thresholds)
    dominant = evidence.dominant()  # (R+1, L, H)
    excess = evidence.excess()[:, 0]  # (roles, L, H)
    counts = tuple(lm.layout.heads_per_layer)  # a model pruned layer by layer has fewer in some
    present = torch.arange(lm.n_heads)[None, :] < torch.tensor(counts)[:, None]  # (L, H)
    heads = []
    for layer in range(lm.n_layers):
        for h in range(counts[layer]):
            heads.append(
                _head_role(
                    layer, h, dominant, excess, evidence, scores, relations, options.replicates
                )
            )
    used = len(treebank) - sum(tb_skipped.values())
    data: dict[str, Any] = {
        "treebank": {"sentences": len(treebank), "used": used, "skipped": tb_skipped},
    }
    coref_result = None
    if gap is not None and gap_sums is not None:
        n_used = int(gap_sums.get("coref.examples")[0]) if "coref.examples" in gap_sums else 0
        data["gap"] = {
            "rows": len(gap.examples) + sum(gap.skipped.values()),
            "used": n_used,
            "skipped": gap_skipped,
        }
        if n_used:
            acc = scores["coreference"][0].masked_fill(~present, torch.nan)  # (L, H)
            flat = int(acc.nan_to_num(-1).argmax())
            layer, h = divmod(flat, lm.n_heads)
            coref_result = CoreferenceResult(
                layer=layer,
                head=h,
                accuracy=float(acc[layer, h]),
                count=n_used,
                baselines={
                    name: float(scores[f"coref_{name}"][0]) for name in coreference.BASELINES
                },
            )
    return RoleReport(
        model=lm.name,
        n_layers=lm.n_layers,
        n_heads=lm.n_heads,
        heads_in_layer=counts,
        heads=heads,
        relations=_relation_rows(syn, relations, present),
        coreference=coref_result,
        data=data,
        thresholds=options.thresholds,
        replicates=options.replicates,
    )


def _head_role(
    layer: int,
    h: int,
    dominant: torch.Tensor,
    excess: torch.Tensor,
    evidence: RoleEvidence,
    scores: dict[str, torch.Tensor],
    relations: list[str],
    replicates: int,
) -> HeadRole:
    role = role_name(int(dominant[0, layer, h]))
    cleared = [(float(excess[i, layer, h]), r) for i, r in enumerate(ROLES)]
    passing = tuple(r for margin, r in sorted(cleared, reverse=True) if math.isfinite(margin))
    stability = None
    if replicates:
        same = dominant[1:, layer, h] == dominant[0, layer, h]
        stability = float(same.double().mean())

    def value(key: str) -> float | None:
        if key not in scores:
            return None
        v = float(scores[key][0, layer, h])
        return None if math.isnan(v) else v

    score = baseline = margin = None
    if role in evidence.score:
        score = float(evidence.score[role][0, layer, h])
        baseline = float(evidence.baseline[role][0, layer, h])
        margin = score - baseline
    detail = ""
    if role == "positional":
        detail = f"offset {int(scores['positional_offset'][0, layer, h]):+d}"
    elif role == "syntactic":
        k = int(scores["syntactic_relation"][0, layer, h])
        detail = f"{relations[k // 2]} {syntactic.DIRECTIONS[k % 2].replace('_', ' ')}"
    elif role == "delimiter":
        parts = {p: value(p) or 0.0 for p in ("cls", "sep", "punct")}
        detail = {"cls": "[CLS]", "sep": "[SEP]/EOS", "punct": "punctuation"}[
            max(parts, key=lambda p: parts[p])
        ]
    elif role == "broad":
        detail = f"{value('entropy') or 0.0:.2f} nats"
    names = (
        "positional",
        "previous",
        "next",
        "delimiter",
        "cls",
        "sep",
        "punct",
        "rare-token",
        "syntactic",
        "coreference",
        "broad",
        "entropy",
        "induction",
    )
    return HeadRole(
        layer=layer,
        head=h,
        role=role,
        roles=passing,
        score=score,
        baseline=baseline,
        margin=margin,
        detail=detail,
        stability=stability,
        scores={name: value(name) for name in names if name in scores},
    )


def _relation_rows(
    syn: dict[str, torch.Tensor], relations: list[str], present: torch.Tensor
) -> list[RelationRow]:
    """The best existing head (``present`` ``(L, H)``) of each relation and direction."""
    rows = []
    n_heads = present.shape[1]
    acc = syn["accuracy"][0].masked_fill(~present[..., None, None], torch.nan)  # (L, H, Rel, 2)
    for r, name in enumerate(relations):
        for d, direction in enumerate(syntactic.DIRECTIONS):
            count = int(syn["count"][0, r, d])
            if count == 0:
                continue
            per_head = acc[..., r, d].nan_to_num(-1.0)
            flat = int(per_head.argmax())
            layer, h = divmod(flat, n_heads)
            rows.append(
                RelationRow(
                    relation=name,
                    direction=direction,
                    layer=layer,
                    head=h,
                    accuracy=float(per_head[layer, h]),
                    baseline=float(syn["baseline"][0, r, d]),
                    baseline_offset=int(syn["baseline_offset"][0, r, d]),
                    count=count,
                )
            )
    return rows
