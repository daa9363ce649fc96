"""What switching heads off does to one sentence: a decoder's next token, an encoder's embedding.

Heads are ablated through :class:`~headlab.models.capture.HeadCapture`'s ``ablate``: their
slices of the output projection's input become zeros (what physically pruning them computes),
their mean outputs over reference text (:func:`reference_means`), or their outputs on another
sentence position by position (:func:`resample_source`, resample ablation). A decoder is read
at its last position (top-``k`` next tokens with their probabilities, with and without the
heads); an encoder through its mean-pooled sentence embedding (sentence-transformers' pooling,
:func:`headlab.models.embeddings.embed`): the cosine
between the sentence's embedding with and without the heads, and, given a second sentence, the
two sentences' cosine with and without them (both sentences run with the same heads off).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headlab.datasets import read_treebank, sample_path
from headlab.errors import InputError
from headlab.models.analysis import mean_head_outputs
from headlab.models.capture import HeadCapture
from headlab.models.embeddings import ablated, embed
from headlab.models.loading import LoadedModel
from headlab.models.runner import encode, last_logits

Ablated = Mapping[int, Sequence[int]]


@dataclass(frozen=True, kw_only=True)
class AblationEffect:
    """One sentence with and without the ablated heads.

    Attributes:
        kind: ``"next-token"`` (a decoder) or ``"similarity"`` (an encoder).
        ablated: ``[[layer, head], ...]`` switched off, in order.
        before, after: a decoder's top next tokens ``[(token, probability)]`` with all heads
            and with the ablated ones off (empty for an encoder).
        self_similarity: an encoder's cosine between the sentence's embedding with all heads
            and with the ablated ones off (``None`` for a decoder).
        other: the second sentence, if one was given.
        other_before, other_after: the two sentences' cosine with all heads and with the
            ablated ones off.
    """

    kind: str
    ablated: list[list[int]]
    before: list[tuple[str, float]]
    after: list[tuple[str, float]]
    self_similarity: float | None = None
    other: str | None = None
    other_before: float | None = None
    other_after: float | None = None
    resampled_from: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Probabilities and cosines rounded to 4 decimals."""

        def tokens(items: list[tuple[str, float]]) -> list[dict[str, Any]]:
            return [{"token": t, "probability": round(p, 4)} for t, p in items]

        def rounded(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {
            "kind": self.kind,
            "ablated": self.ablated,
            "before": tokens(self.before),
            "after": tokens(self.after),
            "self_similarity": rounded(self.self_similarity),
            "other": self.other,
            "other_before": rounded(self.other_before),
            "other_after": rounded(self.other_after),
            "resampled_from": self.resampled_from,
        }


def _pairs(ablate: Ablated) -> list[list[int]]:
    return [[int(layer), int(head)] for layer in sorted(ablate) for head in sorted(ablate[layer])]


def next_tokens(
    lm: LoadedModel,
    text: str,
    *,
    ablate: Ablated | None = None,
    k: int = 5,
    means: Mapping[int, torch.Tensor] | None = None,
    resampled: Mapping[int, torch.Tensor] | None = None,
) -> list[tuple[str, float]]:
    """The ``k`` likeliest tokens after ``text`` with their probabilities, ``ablate``'s heads off.

    Raises:
        InputError: the model is not causal, or was loaded without its language-model head.
    """

    if not lm.causal:
        raise InputError(f"{lm.name} is an encoder: it predicts no next token")
    ids = encode(lm, [text])["input_ids"]
    active = {layer: list(heads) for layer, heads in (ablate or {}).items() if list(heads)}
    with torch.inference_mode(), ablated(lm, active, means, resampled):
        logits = last_logits(lm, ids)[0].float()  # (V,)
    probs = torch.softmax(logits, dim=-1)
    values, indices = probs.topk(min(k, probs.numel()))
    tokens = [lm.tokenizer.decode([int(i)]) for i in indices]
    return [(t, float(p)) for t, p in zip(tokens, values.tolist(), strict=True)]


def ablation_effect(
    lm: LoadedModel,
    text: str,
    ablate: Ablated,
    *,
    other: str | None = None,
    k: int = 5,
    means: Mapping[int, torch.Tensor] | None = None,
    resample: Resampled | None = None,
) -> AblationEffect:
    """``text`` with all heads and with ``ablate`` (``{layer: [heads]}``) switched off: their
    outputs zeros, or with ``means`` (:func:`reference_means`) their mean outputs over
    reference text (mean ablation: the head says what it says on average, not nothing), or
    with ``resample`` (:func:`resample_source`) their outputs on another sentence (resample
    ablation: the head says what it said there).

    Raises:
        InputError: a layer or head out of range, ``k`` below 1, ``other`` given to a decoder.
    """
    if k < 1:
        raise InputError(f"k must be at least 1, got {k}")
    HeadCapture(lm, ablate=ablate)  # checks the layers and heads before any forward pass
    pairs = _pairs(ablate)
    outputs = None if resample is None else resample.outputs
    source = None if resample is None else resample.text
    if lm.causal:
        if other is not None:
            raise InputError("a second sentence goes with an encoder's similarity, not a decoder")
        return AblationEffect(
            kind="next-token",
            ablated=pairs,
            before=next_tokens(lm, text, k=k),
            after=next_tokens(lm, text, ablate=ablate, k=k, means=means, resampled=outputs),
            resampled_from=source,
        )
    texts = [text] if other is None else [text, other]
    full = embed(lm, texts)  # (N, E), L2-normalised
    off = embed(lm, texts, removed=ablate, means=means, resampled=outputs)
    return AblationEffect(
        kind="similarity",
        ablated=pairs,
        before=[],
        after=[],
        self_similarity=float(full[0] @ off[0]),
        other=other,
        other_before=None if other is None else float(full[0] @ full[1]),
        other_after=None if other is None else float(off[0] @ off[1]),
        resampled_from=source,
    )


#: sentences of the bundled UD EWT sample whose head outputs are averaged for mean ablation
MEAN_SENTENCES = 100


def reference_means(lm: LoadedModel, n: int = MEAN_SENTENCES) -> dict[int, torch.Tensor]:
    """Every head's mean output ``{layer: (H, D)}`` over the first ``n`` sentences of the
    bundled UD English EWT sample: what mean ablation puts in a switched-off head's place."""

    sentences = read_treebank(sample_path("treebank"), limit=n).sentences
    return mean_head_outputs(lm, [" ".join(s.words) for s in sentences])


def token_count(lm: LoadedModel, *texts: str) -> int:
    """The most tokens any of ``texts`` takes, special tokens included: how long a sentence
    resample ablation needs (:func:`resample_source`)."""
    return max(int(encode(lm, [t])["input_ids"].shape[-1]) for t in texts)


@dataclass(frozen=True)
class Resampled:
    """Another sentence's head outputs, for resample ablation.

    Attributes:
        text: the sentence.
        outputs: each head's output there, position by position ``{layer: (T_ref, H, D)}``.
    """

    text: str
    outputs: dict[int, torch.Tensor]


def resample_source(
    lm: LoadedModel, tokens: int, *, seed: int = 0, n: int = MEAN_SENTENCES
) -> Resampled:
    """A sentence of at least ``tokens`` tokens drawn (by ``seed``) from the first ``n`` of the
    bundled UD EWT sample, and every head's output on it: what resample ablation puts in a
    switched-off head's place, position by position (Chan et al. 2022 resample from the task's
    own inputs; for free text, a real sentence at the same positions).

    Raises:
        InputError: no sentence in the sample is that long.
    """

    texts = [" ".join(s.words) for s in read_treebank(sample_path("treebank"), limit=n).sentences]
    limit = lm.max_positions or 10**9
    counts = [len(lm.tokenizer(t)["input_ids"]) for t in texts]
    long_enough = [t for t, c in zip(texts, counts, strict=True) if tokens <= c <= limit]
    if not long_enough:
        raise InputError(
            f"resample ablation needs a reference sentence of at least {tokens} tokens; the "
            f"longest of the {len(texts)} reference sentences is shorter: use zero or mean"
        )
    text = random.Random(seed).choice(long_enough)
    with torch.inference_mode(), HeadCapture(lm, record_queries_keys=False) as cap:
        lm.model(**encode(lm, [text]))
    outputs = {layer: cap.head_output(layer)[0].permute(1, 0, 2) for layer in cap.records}
    return Resampled(text=text, outputs=outputs)
