"""A plain, deterministic trainer: AdamW, linear warm-up then cosine decay, gradient clipping.

Seeds fix the initial weights and the batches; ``torch.use_deterministic_algorithms`` makes the
CPU kernels repeat exactly, so the same seed gives the same model on the same machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from headlab.errors import ConfigError
from headlab.progress import Progress, stage


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation settings."""

    steps: int = 1000
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.lr <= 0 or self.warmup < 0:
            raise ConfigError("steps must be >= 1, lr > 0 and warmup >= 0")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warm-up, then cosine down to 10% of ``lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def seed_everything(seed: int) -> torch.Generator:
    """Seed torch and return a generator for the batches."""
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    return torch.Generator().manual_seed(seed + 1)


def train(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, torch.Generator], torch.Tensor],
    cfg: TrainConfig,
    generator: torch.Generator,
    *,
    progress: Progress | None = None,
    label: str = "train",
) -> list[float]:
    """Train ``model`` for ``cfg.steps`` steps; ``loss_fn(model, generator)`` draws a batch and
    returns its loss. Returns the loss of every step. The run is one stage ``label`` of
    ``progress``, in steps, with the latest loss beside the count."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )
    model.train()
    losses = []
    with stage(progress, label, cfg.steps, "steps") as report:
        for step in range(cfg.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            loss = loss_fn(model, generator)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            losses.append(float(loss.detach()))
            report.advance(note=f"loss {losses[-1]:.3f}")
    model.eval()
    return losses
