"""Sentence embeddings of an encoder with some heads zero-ablated: mean pooling as
sentence-transformers pools, and the ablation context the pruning metrics and the explorer's
ablation share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

import torch

from headlab.models.capture import HeadCapture
from headlab.models.loading import LoadedModel
from headlab.models.runner import encode

#: heads removed per layer: ``{layer: [head, ...]}``
Removed = Mapping[int, Sequence[int]]


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of real tokens' states ``(B, E)``, L2-normalised (sentence-transformers' pooling)."""
    m = mask[..., None].to(hidden.dtype)
    pooled = (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
    return torch.nn.functional.normalize(pooled, dim=-1)


def embed(
    lm: LoadedModel,
    texts: Sequence[str],
    *,
    removed: Removed | None = None,
    batch: int = 64,
    means: Mapping[int, torch.Tensor] | None = None,
    resampled: Mapping[int, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Sentence embeddings ``(N, E)`` with ``removed`` heads ablated: zeros, or with ``means``
    their mean outputs, or with ``resampled`` another sentence's outputs."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    chunks = []
    with torch.inference_mode(), ablated(lm, removed, means, resampled):
        for lo in range(0, len(order), batch):
            idx = order[lo : lo + batch]
            inputs = encode(lm, [texts[i] for i in idx])
            hidden = last_hidden(lm, lm.model(**inputs))
            chunks.append((idx, mean_pool(hidden, inputs["attention_mask"]).float().cpu()))
    out = torch.empty(len(texts), chunks[0][1].shape[-1])
    for idx, emb in chunks:
        out[idx] = emb
    return out


def last_hidden(lm: LoadedModel, output: Any) -> torch.Tensor:
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is None:
        hidden = output.hidden_states[-1]
    return hidden


def ablated(
    lm: LoadedModel,
    removed: Removed | None,
    means: Mapping[int, torch.Tensor] | None = None,
    resampled: Mapping[int, torch.Tensor] | None = None,
) -> AbstractContextManager[Any]:
    """Ablation of removed heads (no capture), or nothing: zeros, or with ``means``
    (``{layer: (H, D)}``, :func:`headlab.models.analysis.mean_head_outputs`) each head's mean
    output, or with ``resampled`` (``{layer: (T, H, D)}``) another input's outputs."""
    active = {k: list(v) for k, v in (removed or {}).items() if list(v)}
    if not active:
        return nullcontext()
    mode: Literal["zero", "mean", "resample"] = (
        "resample" if resampled is not None else "zero" if means is None else "mean"
    )
    return HeadCapture(
        lm,
        ablate=active,
        ablation=mode,
        means=means,
        resampled=resampled,
        record_queries_keys=False,
        record_head_outputs=False,
    )
