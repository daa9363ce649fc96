"""What pruning saves: parameters, bytes on disk, FLOPs and measured forward time."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from headlab.models.loading import LoadedModel


def count_parameters(model: Any) -> int:
    """Number of parameters (tied weights counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def folder_bytes(path: Path) -> int:
    """Bytes of the safetensors weights in a model folder."""
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))


def forward_flops(lm: LoadedModel, n_tokens: int) -> float:
    """Approximate FLOPs of one forward over a sequence of ``n_tokens``: 2 x parameters in the
    layers x tokens (projections and MLPs) plus each head's ``QK^T`` and ``PV`` products."""
    embed_params = 0
    emb = lm.model.get_input_embeddings() if hasattr(lm.model, "get_input_embeddings") else None
    if emb is not None:
        embed_params = emb.weight.numel()
    dense = count_parameters(lm.model) - embed_params
    attn = sum(4.0 * n_tokens * n_tokens * h * lm.head_dim for h in lm.layout.heads_per_layer)
    return 2.0 * dense * n_tokens + attn


@torch.inference_mode()
def forward_ms(lm: LoadedModel, inputs: dict[str, torch.Tensor], *, repeats: int = 10) -> float:
    """Median milliseconds of ``lm.model(**inputs)`` after two warm-up runs."""
    for _ in range(2):
        lm.model(**inputs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        lm.model(**inputs)
        times.append(time.perf_counter() - start)
    return 1000.0 * statistics.median(times)
