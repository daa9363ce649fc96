"""Task metrics to prune against: STS-B Spearman, embedding fidelity, perplexity (and IOI's
logit difference, :mod:`headlab.pruning.tasks`).

Each metric evaluates a model with some heads removed (zero-ablated through the output
projection's input, which is exactly what physical pruning computes) and gives a differentiable
loss for gradient importance. ``loss`` of a pruning step is always "how much worse", in the
metric's own units: Spearman points (x100), fidelity points (mean cosine x100), perplexity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from headlab.datasets.stsb import StsPair
from headlab.errors import InputError
from headlab.models.capture import HeadCapture
from headlab.models.loading import LoadedModel
from headlab.models.runner import encode

Removed = Mapping[int, Sequence[int]]


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


def gate_hooks(lm: LoadedModel, gates: torch.Tensor | Callable[[], torch.Tensor]) -> list[Any]:
    """Multiply each head's output by ``gates[layer, head]`` (differentiable); returns handles.

    ``gates`` may be a function returning the ``(L, H)`` gates, read at every forward (the L0
    gates are drawn anew for each batch)."""
    current = gates if callable(gates) else (lambda: gates)
    handles = []
    for layer, h in enumerate(lm.layers):
        n = lm.layout.heads_per_layer[layer]

        def hook(module: Any, args: tuple[Any, ...], layer: int = layer, n: int = n) -> Any:
            x = args[0]  # (B, T, H*D)
            split = x.view(*x.shape[:-1], n, -1) * current()[layer, :n, None].to(x)  # on x's device
            return (split.reshape(x.shape), *args[1:])

        handles.append(h.out_proj.register_forward_pre_hook(hook))
    return handles


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of real tokens' states ``(B, E)``, L2-normalised (sentence-transformers' pooling)."""
    m = mask[..., None].to(hidden.dtype)
    pooled = (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
    return torch.nn.functional.normalize(pooled, dim=-1)


def embed(
    lm: LoadedModel, texts: Sequence[str], *, removed: Removed | None = None, batch: int = 64
) -> torch.Tensor:
    """Sentence embeddings ``(N, E)`` with ``removed`` heads zero-ablated."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    chunks = []
    with torch.inference_mode(), _ablated(lm, removed):
        for lo in range(0, len(order), batch):
            idx = order[lo : lo + batch]
            inputs = encode(lm, [texts[i] for i in idx])
            hidden = _hidden(lm, lm.model(**inputs))
            chunks.append((idx, mean_pool(hidden, inputs["attention_mask"]).float().cpu()))
    out = torch.empty(len(texts), chunks[0][1].shape[-1])
    for idx, emb in chunks:
        out[idx] = emb
    return out


def _hidden(lm: LoadedModel, output: Any) -> torch.Tensor:
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is None:
        hidden = output.hidden_states[-1]
    return hidden


class _ablated:
    """Zero-ablation of removed heads (no capture), or nothing."""

    def __init__(self, lm: LoadedModel, removed: Removed | None) -> None:
        active = {k: list(v) for k, v in (removed or {}).items() if list(v)}
        self.cap = (
            HeadCapture(lm, ablate=active, record_queries_keys=False, record_head_outputs=False)
            if active
            else None
        )

    def __enter__(self) -> None:
        if self.cap is not None:
            self.cap.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.cap is not None:
            self.cap.__exit__(*exc)


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
            ua = mean_pool(_hidden(lm, lm.model(**a)), a["attention_mask"])
            ub = mean_pool(_hidden(lm, lm.model(**b)), b["attention_mask"])
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
            emb = mean_pool(_hidden(lm, lm.model(**inputs)), inputs["attention_mask"])
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
        with torch.inference_mode(), _ablated(lm, removed):
            nll = [float(x) for x in self.loss_batches(lm)]
        return math.exp(sum(nll) / len(nll))
