"""What switching heads off does to one sentence: a decoder's next token, an encoder's embedding.

Heads are zero-ablated through :class:`~headlab.models.capture.HeadCapture`'s ``ablate``: their
slices of the output projection's input become zeros, which is what physically pruning them
computes. A decoder is read at its last position (top-``k`` next tokens with their
probabilities, with and without the heads); an encoder through its mean-pooled sentence
embedding (sentence-transformers' pooling, :func:`headlab.pruning.metrics.embed`): the cosine
between the sentence's embedding with and without the heads, and, given a second sentence, the
two sentences' cosine with and without them (both sentences run with the same heads off).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headlab.errors import InputError
from headlab.models.capture import HeadCapture
from headlab.models.loading import LoadedModel
from headlab.models.runner import encode

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
) -> list[tuple[str, float]]:
    """The ``k`` likeliest tokens after ``text`` with their probabilities, ``ablate``'s heads off.

    Raises:
        InputError: the model is not causal, or was loaded without its language-model head.
    """
    from headlab.models.runner import last_logits

    if not lm.causal:
        raise InputError(f"{lm.name} is an encoder: it predicts no next token")
    ids = encode(lm, [text])["input_ids"]
    active = {layer: list(heads) for layer, heads in (ablate or {}).items() if list(heads)}
    with (
        torch.inference_mode(),
        HeadCapture(
            lm,
            ablate=active,
            ablation="zero" if means is None else "mean",
            means=means if active else None,
            record_queries_keys=False,
            record_head_outputs=False,
        ),
    ):
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
) -> AblationEffect:
    """``text`` with all heads and with ``ablate`` (``{layer: [heads]}``) switched off: their
    outputs zeros, or with ``means`` (:func:`reference_means`) their mean outputs over
    reference text (mean ablation: the head says what it says on average, not nothing).

    Raises:
        InputError: a layer or head out of range, ``k`` below 1, ``other`` given to a decoder.
    """
    from headlab.models.embeddings import embed

    if k < 1:
        raise InputError(f"k must be at least 1, got {k}")
    HeadCapture(lm, ablate=ablate)  # checks the layers and heads before any forward pass
    pairs = _pairs(ablate)
    if lm.causal:
        if other is not None:
            raise InputError("a second sentence goes with an encoder's similarity, not a decoder")
        return AblationEffect(
            kind="next-token",
            ablated=pairs,
            before=next_tokens(lm, text, k=k),
            after=next_tokens(lm, text, ablate=ablate, k=k, means=means),
        )
    texts = [text] if other is None else [text, other]
    full = embed(lm, texts)  # (N, E), L2-normalised
    off = embed(lm, texts, removed=ablate, means=means)
    return AblationEffect(
        kind="similarity",
        ablated=pairs,
        before=[],
        after=[],
        self_similarity=float(full[0] @ off[0]),
        other=other,
        other_before=None if other is None else float(full[0] @ full[1]),
        other_after=None if other is None else float(off[0] @ off[1]),
    )


#: sentences of the bundled UD EWT sample whose head outputs are averaged for mean ablation
MEAN_SENTENCES = 100


def reference_means(lm: LoadedModel, n: int = MEAN_SENTENCES) -> dict[int, torch.Tensor]:
    """Every head's mean output ``{layer: (H, D)}`` over the first ``n`` sentences of the
    bundled UD English EWT sample: what mean ablation puts in a switched-off head's place."""
    from headlab.datasets import read_treebank, sample_path
    from headlab.models.analysis import mean_head_outputs

    sentences = read_treebank(sample_path("treebank"), limit=n).sentences
    return mean_head_outputs(lm, [" ".join(s.words) for s in sentences])
