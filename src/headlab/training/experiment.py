""" "Why one head is never enough": the same width and parameter count, 1 to 8 heads.

Heads split the model width (``head_dim = d_model / n_heads``), so every model in the grid has
exactly the same parameters; only how the width is cut into heads differs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headlab.progress import Progress
from headlab.training.model import ModelConfig, TinyTransformer
from headlab.training.tasks import (
    BindingModel,
    BindingTask,
    binding_eval,
    binding_loss,
    lm_loss,
    perplexity,
    prepare_text,
    shakespeare_text,
)
from headlab.training.trainer import TrainConfig, seed_everything, train


@dataclass(frozen=True, kw_only=True)
class GridConfig:
    """The experiment's settings (``quick`` runs a smaller grid)."""

    heads: tuple[int, ...] = (1, 2, 4, 8)
    seeds: tuple[int, ...] = (0, 1, 2)
    d_model: int = 64
    n_layers: int = 2
    binding_steps: int = 1000
    lm_steps: int = 800
    lm_window: int = 64
    batch_size: int = 64
    tasks: tuple[str, ...] = ("binding", "binding-mlp", "language-model")

    @classmethod
    def quick(cls) -> GridConfig:
        return cls(heads=(1, 4), seeds=(0,), binding_steps=400, tasks=("binding",))


def n_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def run_binding(
    cfg: GridConfig, n_heads: int, seed: int, progress: Progress | None, *, mlp: bool = False
) -> dict[str, Any]:
    """Task 1. ``mlp=False`` (the main variant): attention-only blocks, so that only attention
    can tie a token to the marker before it; ``mlp=True`` lets MLPs build such conjunctions."""
    task = BindingTask()
    gen = seed_everything(seed)
    model = BindingModel(
        ModelConfig(
            vocab_size=task.vocab_size,
            d_model=cfg.d_model,
            n_layers=cfg.n_layers,
            n_heads=n_heads,
            max_len=task.length,
            mlp=mlp,
        ),
        task,
    )
    train(
        model,
        binding_loss(task, cfg.batch_size),
        TrainConfig(steps=cfg.binding_steps, seed=seed, warmup=min(100, cfg.binding_steps // 10)),
        gen,
        progress=progress,
        label=f"binding{'-mlp' if mlp else ''} h={n_heads} seed={seed}",
    )
    result = binding_eval(model, task, 2000, seed)
    return {
        "task": "binding-mlp" if mlp else "binding",
        "n_heads": n_heads,
        "seed": seed,
        "metric": "accuracy",
        "value": result["accuracy"],
        "params": n_parameters(model),
        "diagnostic": result,
    }


def run_lm(
    cfg: GridConfig,
    n_heads: int,
    seed: int,
    data: Path,
    progress: Progress | None,
    cache: dict[str, Any],
) -> dict[str, Any]:
    if "ids" not in cache:
        text = cache.pop("text", None) or shakespeare_text(data)
        cache["tokenizer"], cache["ids"], cache["held_out"] = prepare_text(text)
    tok = cache["tokenizer"]
    gen = seed_everything(seed)
    model = TinyTransformer(
        ModelConfig(
            vocab_size=len(tok),
            d_model=cfg.d_model,
            n_layers=cfg.n_layers,
            n_heads=n_heads,
            max_len=cfg.lm_window,
        )
    )
    train(
        model,
        lm_loss(cache["ids"], cfg.lm_window, 32),
        TrainConfig(steps=cfg.lm_steps, seed=seed, warmup=min(100, cfg.lm_steps // 10)),
        gen,
        progress=progress,
        label=f"language model h={n_heads} seed={seed}",
    )
    return {
        "task": "language-model",
        "n_heads": n_heads,
        "seed": seed,
        "metric": "perplexity",
        "value": perplexity(model, cache["held_out"], cfg.lm_window),
        "params": n_parameters(model),
    }


def summarise(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard deviation per task and head count (``None`` for a single seed)."""
    cells: dict[tuple[str, int], list[float]] = {}
    metric: dict[str, str] = {}
    for r in runs:
        cells.setdefault((r["task"], r["n_heads"]), []).append(r["value"])
        metric[r["task"]] = r["metric"]
    return [
        {
            "task": task,
            "n_heads": heads,
            "metric": metric[task],
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else None,  # one seed: no spread
            "seeds": len(values),
        }
        for (task, heads), values in sorted(cells.items())
    ]


def one_vs_many(cfg: GridConfig, *, data: Path, progress: Progress | None = None) -> dict[str, Any]:
    """Run the grid; returns ``{"task", "runs": [...], "summary": [...], "config"}``. Each
    training run is one stage of ``progress``, in steps."""
    runs: list[dict[str, Any]] = []
    cache: dict[str, Any] = {}
    if "language-model" in cfg.tasks:  # a missing corpus is found before any training
        cache["text"] = shakespeare_text(data)
    for task in cfg.tasks:
        for n_heads in cfg.heads:
            for seed in cfg.seeds:
                if task in ("binding", "binding-mlp"):
                    runs.append(run_binding(cfg, n_heads, seed, progress, mlp=task != "binding"))
                else:
                    runs.append(run_lm(cfg, n_heads, seed, data, progress, cache))
    return {
        "task": "+".join(cfg.tasks),
        "runs": runs,
        "summary": summarise(runs),
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(cfg).items()},
    }
