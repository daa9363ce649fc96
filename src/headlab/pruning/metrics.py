"""Task metrics to prune against: STS-B Spearman, embedding fidelity, perplexity (and IOI's
logit difference, :mod:`headlab.pruning.tasks`).

Each metric evaluates a model with some heads removed (zero-ablated through the output
projection's input, which is exactly what physical pruning computes) and gives a differentiable
loss for gradient importance. ``loss`` of a pruning step is always "how much worse", in the
metric's own units: Spearman points (x100), fidelity points (mean cosine x100), perplexity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from headlab.datasets.stsb import StsPair
from headlab.errors import InputError
from headlab.models.embeddings import Removed, ablated, embed, last_hidden, mean_pool
from headlab.models.hooks import HeadFn, Hooks
from headlab.models.loading import LoadedModel
from headlab.models.runner import encode


def spearman(x: Sequence[float] | torch.Tensor, y: Sequence[float] | torch.Tensor) -> float:
    """Spearman's rank correlation (Pearson on ranks; ties get their average rank)."""
    a, b = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    if a.shape != b.shape or a.numel() < 2:
        raise InputError("spearman needs two sequences of the same length, at least 2")
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum()) / den if den > 0 else float("nan")


def _ranks(v: torch.Tensor) -> torch.Tensor:
    order = torch.argsort(v, stable=True)
    ranks = torch.empty_like(v)
    ranks[order] = torch.arange(1, v.numel() + 1, dtype=v.dtype)
    values, inverse = torch.unique(v, return_inverse=True)
    sums = torch.zeros_like(values).index_add_(0, inverse, ranks)
    counts = torch.zeros_like(values).index_add_(0, inverse, torch.ones_like(ranks))
    return (sums / counts)[inverse]


class HeadGates(Hooks):
    """Context manager multiplying each head's output by ``gates[layer, head]`` (differentiable)
    in the head-output slot: each layer's call gets its own layer's gates, also where one
    projection serves several layers (ALBERT).

    ``gates`` may be a function returning the ``(L, H)`` gates, read at every forward (the L0
    gates are drawn anew for each batch)."""

    def __init__(self, lm: LoadedModel, gates: torch.Tensor | Callable[[], torch.Tensor]) -> None:
        super().__init__()
        self.lm = lm
        self.current = gates if callable(gates) else (lambda: gates)

    def _gate(self, layer: int) -> HeadFn:
        n = self.lm.layout.heads_per_layer[layer]

        def gate(z: torch.Tensor) -> torch.Tensor:  # (B, T, H, D)
            return z * self.current()[layer, :n, None].to(z)  # on z's device

        return gate

    def install(self) -> None:
        self.at_heads(self.lm, {layer: [self._gate(layer)] for layer in range(self.lm.n_layers)})


class Metric(Protocol):
    name: str
    unit: str
    higher_is_better: bool

    def evaluate(self, lm: LoadedModel, removed: Removed | None = None) -> float: ...

    def loss_batches(
        self, lm: LoadedModel, part: tuple[int, int] = (0, 1)
    ) -> Iterator[torch.Tensor]:
        """The loss of each batch; ``part`` ``(rank, world)``: only every ``world``-th batch,
        from ``rank`` on (the batches stay those of one process)."""
        ...


@dataclass
class StsbMetric:
    """Spearman correlation (x100) of cosine similarity with STS-B gold scores.

    Gradient loss: mean squared error between the cosine and score / 5 (the STS regression
    objective sentence-transformers models are fine-tuned with).
    """

    pairs: list[StsPair]
    batch: int = 32
    name: str = "stsb"
    unit: str = "Spearman x100"
    higher_is_better: bool = True

    def evaluate(self, lm: LoadedModel, removed: Removed | None = None) -> float:
        texts = [p.first for p in self.pairs] + [p.second for p in self.pairs]
        emb = embed(lm, texts, removed=removed)
        n = len(self.pairs)
        cos = (emb[:n] * emb[n:]).sum(-1)
        return 100.0 * spearman(cos, [p.score for p in self.pairs])

    def loss_batches(
        self, lm: LoadedModel, part: tuple[int, int] = (0, 1)
    ) -> Iterator[torch.Tensor]:
        for lo in range(0, len(self.pairs), self.batch)[part[0] :: part[1]]:
            chunk = self.pairs[lo : lo + self.batch]
            a = encode(lm, [p.first for p in chunk])
            b = encode(lm, [p.second for p in chunk])
            ua = mean_pool(last_hidden(lm, lm.model(**a)), a["attention_mask"])
            ub = mean_pool(last_hidden(lm, lm.model(**b)), b["attention_mask"])
            gold = torch.tensor([p.score / 5.0 for p in chunk], device=ua.device)
            yield ((ua * ub).sum(-1) - gold).pow(2).mean()


@dataclass
class FidelityMetric:
    """Mean cosine (x100) between each sentence's embedding and the unpruned model's."""

    texts: list[str]
    reference: torch.Tensor
    batch: int = 32
    name: str = "fidelity"
    unit: str = "mean cosine x100"
    higher_is_better: bool = True

    @classmethod
    def build(cls, lm: LoadedModel, texts: list[str]) -> FidelityMetric:
        return cls(texts=texts, reference=embed(lm, texts))

    def evaluate(self, lm: LoadedModel, removed: Removed | None = None) -> float:
        emb = embed(lm, self.texts, removed=removed)
        return 100.0 * float((emb * self.reference).sum(-1).mean())

    def loss_batches(
        self, lm: LoadedModel, part: tuple[int, int] = (0, 1)
    ) -> Iterator[torch.Tensor]:
        for lo in range(0, len(self.texts), self.batch)[part[0] :: part[1]]:
            inputs = encode(lm, self.texts[lo : lo + self.batch])
            emb = mean_pool(last_hidden(lm, lm.model(**inputs)), inputs["attention_mask"])
            ref = self.reference[lo : lo + self.batch].to(emb.device)
            yield (1.0 - (emb * ref).sum(-1)).mean()


@dataclass
class PerplexityMetric:
    """Perplexity of a causal language model on held-out text, in windows of ``window`` tokens."""

    windows: torch.Tensor  # (N, window) token ids
    batch: int = 8
    name: str = "perplexity"
    unit: str = "perplexity"
    higher_is_better: bool = False

    @classmethod
    def from_text(
        cls, lm: LoadedModel, text: str, *, window: int = 128, max_windows: int = 64
    ) -> PerplexityMetric:
        if not lm.causal:
            raise InputError(
                f"perplexity needs a causal language model; {lm.name} is an encoder "
                "(use --metric stsb or fidelity)"
            )
        ids = lm.tokenizer(text, return_tensors="pt", truncation=False, verbose=False)["input_ids"][
            0
        ]
        if lm.max_positions is not None:
            window = min(window, lm.max_positions)
        n = min(ids.numel() // window, max_windows)
        if n < 1:
            raise InputError(f"the held-out text has fewer than {window} tokens")
        return cls(windows=ids[: n * window].view(n, window))

    def loss_batches(
        self, lm: LoadedModel, part: tuple[int, int] = (0, 1)
    ) -> Iterator[torch.Tensor]:
        for lo in range(0, self.windows.shape[0], self.batch)[part[0] :: part[1]]:
            ids = self.windows[lo : lo + self.batch].to(lm.device)
            logits = lm.model(input_ids=ids).logits
            yield torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten()
            )

    def evaluate(self, lm: LoadedModel, removed: Removed | None = None) -> float:
        if lm.model.get_output_embeddings() is None:
            raise InputError("perplexity needs the model loaded with its language-model head")
        with torch.inference_mode(), ablated(lm, removed):
            nll = [float(x) for x in self.loss_batches(lm)]
        return math.exp(sum(nll) / len(nll))
