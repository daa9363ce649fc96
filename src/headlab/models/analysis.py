"""One sentence's word-level attention, the one encoding every page carries it in, and mean
head outputs for mean-ablation."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from headlab.attention.memory import available_bytes
from headlab.errors import TooLongError
from headlab.models.capture import HeadCapture
from headlab.models.loading import LoadedModel
from headlab.models.runner import Batch, encode, run_corpus
from headlab.models.seq2seq import seq2seq_inputs
from headlab.models.words import Alignment, align, word_pattern
from headlab.text import human_bytes


@dataclass(frozen=True, kw_only=True)
class WordAttention:
    """Word-level attention of one sentence.

    Attributes:
        alignment: the sentence's words and tokens.
        patterns: ``{layer: (H, W, W)}``; row ``i`` is where word ``i``'s attention goes
            (``(H, W_query, W_key)`` in a layer of ``sides``).
        sides: ``{layer: (query words, key words)}`` where they are not both ``alignment``:
            an encoder-decoder's decoder layers (target, target) and cross-attention layers
            (target, source).
        token_patterns: ``{layer: (H, T, T)}``, the token-level patterns the word-level ones
            came from, when asked for (``word_attention(..., tokens=True)``), else empty.
        sink: a causal model's attention sink (:func:`sink_index`): the word its heads park
            attention on, shown apart from the words a head looks at; ``None`` for an encoder.
        norm_patterns, norm_token_patterns: the word- and token-level patterns weighted by
            value norms (:meth:`~headlab.models.capture.HeadCapture.norm_weighted_pattern`),
            when asked for (``word_attention(..., norms=True)``), else empty.
    """

    alignment: Alignment
    patterns: dict[int, torch.Tensor]
    sides: dict[int, tuple[Alignment, Alignment]] = field(default_factory=dict)
    token_patterns: dict[int, torch.Tensor] = field(default_factory=dict)
    sink: int | None = None
    norm_patterns: dict[int, torch.Tensor] = field(default_factory=dict)
    norm_token_patterns: dict[int, torch.Tensor] = field(default_factory=dict)

    def words_of(self, layer: int) -> tuple[Alignment, Alignment]:
        """The (query, key) words of ``layer``."""
        return self.sides.get(layer, (self.alignment, self.alignment))

    def _sink_of(self, layer: int, query: int | None = None) -> int | None:
        """The sink set apart from ``query``'s row: none for the sink's own row (it sees only
        itself), nor in an encoder-decoder's layers."""
        sink = None if layer in self.sides else self.sink
        return None if sink == query else sink

    def top(
        self, layer: int, head: int, word: str, k: int = 3, *, include_special: bool = False
    ) -> list[tuple[str, float]]:
        """The ``k`` words ``word`` attends to most in ``layer``/``head``, with their weights;
        special tokens and the sink are shown apart (:meth:`special_mass`, :meth:`sink_mass`)
        unless ``include_special``."""
        queries, keys = self.words_of(layer)
        index = queries.word_index(word)
        row = self.patterns[layer][head, index]  # (W_key,)
        order = torch.argsort(row, descending=True).tolist()
        # a word the row cannot see (a causal row's later words) is not among its top words
        seen = [j for j in order if float(row[j]) > 0.0]
        sink = self._sink_of(layer, index)
        picked = [j for j in seen if include_special or not (keys.is_special[j] or j == sink)][:k]
        return [(keys.words[j], float(row[j])) for j in picked]

    def sink_mass(self, layer: int, head: int, word: str) -> float | None:
        """Share of ``word``'s attention that goes to the sink (``None`` without one)."""
        queries, _ = self.words_of(layer)
        index = queries.word_index(word)
        sink = self._sink_of(layer, index)
        if sink is None:
            return None
        return float(self.patterns[layer][head, index, sink])

    def special_mass(self, layer: int, head: int, word: str) -> float:
        """Share of ``word``'s attention that goes to special tokens."""
        queries, keys = self.words_of(layer)
        row = self.patterns[layer][head, queries.word_index(word)]
        mask = torch.tensor(keys.is_special, device=row.device)
        return float(row[mask].sum())


#: the share of the available memory one text's patterns may plan to fill
PATTERN_MEMORY_SHARE = 0.8


def pattern_bytes_planned(
    lm: LoadedModel, n_tokens: int, layers: Iterable[int], norms: bool
) -> int:
    """The bytes :func:`word_attention` keeps and computes for a text of ``n_tokens`` tokens:
    every chosen head's float32 ``T x T`` pattern (twice with ``norms``), and one layer's
    scores and weights while it is computed."""
    heads = [lm.layout.heads_per_layer[layer] for layer in layers if 0 <= layer < lm.n_layers]
    per_head = n_tokens * n_tokens * 4
    return (sum(heads) * (2 if norms else 1) + 2 * max(heads, default=0)) * per_head


def check_pattern_memory(
    lm: LoadedModel, n_tokens: int, layers: Iterable[int], *, norms: bool = False
) -> None:
    """Refuse, before the forward pass, a text whose patterns
    (:func:`pattern_bytes_planned`) would not fit :data:`PATTERN_MEMORY_SHARE` of the memory
    ``lm``'s device has available (no check where the system does not say).

    Raises:
        TooLongError: one line with the tokens, the planned bytes, the memory available and
            the most tokens that fit.
    """
    available = available_bytes(torch.device(lm.device))
    chosen = list(layers)
    planned = pattern_bytes_planned(lm, n_tokens, chosen, norms)
    if available is None or planned <= PATTERN_MEMORY_SHARE * available:
        return
    budget = PATTERN_MEMORY_SHARE * available
    fits = math.isqrt(int(budget // max(1, pattern_bytes_planned(lm, 1, chosen, norms))))
    raise TooLongError(
        f"the text is {n_tokens:,} tokens long: every head's attention pattern over it "
        f"({len(chosen)} layers, T x T float32 weights each) would take about "
        f"{human_bytes(planned)}, more than {PATTERN_MEMORY_SHARE:.0%} of the "
        f"{human_bytes(available)} available here; at most {fits:,} tokens fit (shorten it)"
    )


def word_attention(
    lm: LoadedModel,
    text: str | None = None,
    *,
    words: Sequence[str] | None = None,
    layers: Iterable[int] | None = None,
    tokens: bool = False,
    norms: bool = False,
) -> WordAttention:
    """Run one sentence once and return its word-level attention for ``layers`` (default all).

    Give raw ``text`` (split into words by :func:`~headlab.models.words.split_words`) or the
    sentence's ``words`` (a treebank's or a parser's tokens, joined with single spaces). With
    ``tokens`` the token-level patterns are kept too (``WordAttention.token_patterns``); with
    ``norms`` the patterns weighted by value norms too (Kobayashi et al. 2020), at word level and,
    with ``tokens``, at token level.
    """
    alignment = align(lm.tokenizer, text=text, words=words, max_tokens=lm.max_positions)
    inputs = encode(lm, [alignment.text])
    chosen = range(lm.n_layers) if layers is None else sorted(set(layers))
    check_pattern_memory(lm, int(inputs["input_ids"].shape[-1]), chosen, norms=norms)
    with torch.inference_mode(), HeadCapture(lm, layers=layers, record_head_outputs=False) as cap:
        lm.model(**inputs)
    token_patterns = {layer: cap.pattern(layer)[0] for layer in cap.records}  # (H, T, S)
    weighted = (
        {layer: cap.norm_weighted_pattern(layer)[0] for layer in cap.records} if norms else {}
    )  # (H, T, S) each
    patterns = {layer: word_pattern(p, alignment) for layer, p in token_patterns.items()}
    return WordAttention(
        alignment=alignment,
        patterns=patterns,
        token_patterns=token_patterns if tokens else {},
        sink=sink_index(alignment) if lm.causal else None,
        norm_patterns={layer: word_pattern(p, alignment) for layer, p in weighted.items()},
        norm_token_patterns=weighted if tokens else {},
    )


def sink_index(alignment: Alignment) -> int | None:
    """A causal model's attention sink: the first word that is not a special token.

    Decoders park the attention a head has no use for on the sequence's first token (an
    "attention sink", Xiao et al. 2023): a special BOS when the tokenizer adds one (shown apart
    as a special token already), else the first word. Its share says little about what the
    head does, so every view (``headlab heads``, the explorer, the notebook, the report) shows
    it apart and names the word a head attends to most among the others. ``None`` when the
    sentence is only special tokens, or a BOS leads it (the BOS is the sink)."""
    if alignment.is_special and alignment.is_special[0]:
        return None  # a BOS: the special tokens' share is the sink's
    for i, special in enumerate(alignment.is_special):
        if not special:
            return i
    return None


def seq2seq_attention(
    lm: LoadedModel,
    source: str | None,
    target: str,
    *,
    layers: Iterable[int] | None = None,
    sound: object = None,
) -> WordAttention:
    """An encoder-decoder run once on ``source`` (encoder) and ``target`` (read by the decoder
    after its start token): word-level attention of ``layers`` (default all). Encoder layers
    are source x source, decoder self-attention target x target, cross-attention target x
    source (where each target word's attention goes among the source words). A target word's
    row is the position where the decoder reads it, as for any word (translation-alignment
    studies often read the row before it, which predicts the word). Whisper hears ``sound``
    (:class:`~headlab.models.audio.Sound`): its source words are moments of time."""

    inputs, source_words, target_words = seq2seq_inputs(lm, source, target, sound=sound)
    with torch.inference_mode(), HeadCapture(lm, layers=layers, record_head_outputs=False) as cap:
        lm.model(**inputs)
    sides = {
        "encoder": (source_words, source_words),
        "decoder": (target_words, target_words),
        "cross": (target_words, source_words),
    }
    patterns, which = {}, {}
    for layer in cap.records:
        queries, keys = sides[lm.layers[layer].kind]
        patterns[layer] = words_between(cap.pattern(layer)[0], queries, keys)
        which[layer] = (queries, keys)
    return WordAttention(alignment=source_words, patterns=patterns, sides=which)


def words_between(pattern: torch.Tensor, queries: Alignment, keys: Alignment) -> torch.Tensor:
    """Token pattern ``(..., T, S)`` to words ``(..., W_query, W_key)``: mean over a query
    word's tokens, sum over a key word's."""
    pattern = pattern[..., : queries.n_tokens, : keys.n_tokens].float()
    from_words, to_words = queries.matrices()[0], keys.matrices()[1]
    return from_words.to(pattern.device) @ pattern @ to_words.to(pattern.device)


def mean_head_outputs(
    lm: LoadedModel, texts: Sequence[str], *, batch_tokens: int = 4096
) -> dict[int, torch.Tensor]:
    """Mean output ``(H, D)`` of every head over all real tokens of ``texts`` (for mean-ablation)."""
    sums: dict[int, torch.Tensor] = {}
    count = 0

    def consume(batch: Batch) -> None:
        nonlocal count
        real = batch.inputs["attention_mask"].bool()  # (B, T)
        count += int(real.sum())
        for layer in range(lm.n_layers):
            out = batch.capture.head_output(layer)  # (B, H, T, D)
            total = (out * real[:, None, :, None]).sum(dim=(0, 2)).double()  # (H, D)
            sums[layer] = sums.get(layer, 0) + total

    run_corpus(lm, list(texts), consume, batch_tokens=batch_tokens, record_head_outputs=True)
    return {layer: (s / count).float() for layer, s in sums.items()}


def pattern_bytes(pattern: torch.Tensor, n: int) -> str:
    """``(H, N, N)`` weights cut to ``n`` x ``n``, as base64 of ``round(255 * w)`` bytes, heads x
    rows x columns: how the report, the explorer and the notebook view carry a layer's patterns
    (a 1/255 step is finer than any colour or line width on a page)."""
    cut = pattern[:, :n, :n].float().clamp(0.0, 1.0)
    raw = (cut * 255.0).round().to(torch.uint8).cpu().contiguous().numpy().tobytes()
    return base64.b64encode(raw).decode("ascii")


def pattern_from_bytes(b64: str, head: int, n: int) -> torch.Tensor:
    """``(n, n)``: one head's weights back from :func:`pattern_bytes` (to 1/255)."""
    raw = torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.uint8)
    return raw[head * n * n : (head + 1) * n * n].view(n, n).float() / 255.0
