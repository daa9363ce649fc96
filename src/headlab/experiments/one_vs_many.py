""" "Why one head is never enough": the same width and parameter count, 1 to 8 heads.

Heads split the model width (``head_dim = d_model / n_heads``), so every model in the grid has
exactly the same parameters; only how the width is cut into heads differs.

Two settings: ``small`` (width 64, 2 layers; the binding task and a BPE language model) and
``large`` (width 256, 4 layers, 1 to 16 heads, a character-level language model on
TinyShakespeare), a scale at which a difference between head counts has room to show. Both run
on any torch device; the batches are drawn on the CPU, so a seed gives the same batches there.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headlab.errors import ConfigError, InputError
from headlab.progress import Progress
from headlab.text import Part, table
from headlab.training.model import ModelConfig, TinyTransformer
from headlab.training.tasks import (
    BindingModel,
    BindingTask,
    binding_eval,
    binding_loss,
    lm_loss,
    perplexity,
    prepare_chars,
    prepare_text,
    shakespeare_text,
)
from headlab.training.trainer import TrainConfig, seed_everything, train


@dataclass(frozen=True, kw_only=True)
class GridConfig:
    """The experiment's settings (``quick`` runs a smaller grid)."""

    setting: str = "small"
    heads: tuple[int, ...] = (1, 2, 4, 8)
    seeds: tuple[int, ...] = (0, 1, 2)
    d_model: int = 64
    n_layers: int = 2
    d_ff: int = 256
    binding_steps: int = 1000
    lm_steps: int = 800
    lm_window: int = 64
    lm_batch: int = 32
    #: "bpe" (a 1,024-token byte-level BPE trained on the training part) or "char"
    tokenizer: str = "bpe"
    lr: float = 3e-3
    #: held-out windows of ``lm_window`` tokens for the perplexity
    eval_windows: int = 200
    batch_size: int = 64
    tasks: tuple[str, ...] = ("binding", "binding-mlp", "language-model")
    #: a torch device string; the models and each batch go there
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.tokenizer not in ("bpe", "char"):
            raise ConfigError(f"tokenizer must be 'bpe' or 'char', got {self.tokenizer!r}")
        unknown = set(self.tasks) - {"binding", "binding-mlp", "language-model"}
        if unknown:
            raise ConfigError(f"unknown task(s) {sorted(unknown)}")
        for h in self.heads:
            if h < 1 or self.d_model % h:
                raise ConfigError(f"{h} heads do not divide the width {self.d_model}")

    @classmethod
    def quick(cls, **kw: Any) -> GridConfig:
        return cls(heads=(1, 4), seeds=(0,), binding_steps=400, tasks=("binding",), **kw)

    @classmethod
    def large(cls, *, quick: bool = False, **kw: Any) -> GridConfig:
        """Width 256, 4 layers, 1/4/8/16 heads, characters of TinyShakespeare, 3 seeds of 3,000
        steps of 64 x 256 characters (for a GPU). ``quick``: 1 and 8 heads, 2 seeds, 200 steps
        of 16 x 128 characters, within 30 minutes on 2 shared CPU cores."""
        base: dict[str, Any] = dict(
            setting="large",
            d_model=256,
            n_layers=4,
            d_ff=1024,
            tokenizer="char",
            lr=2e-3,
            tasks=("language-model",),
        )
        if quick:
            base |= dict(
                heads=(1, 8),
                seeds=(0, 1),
                lm_steps=200,
                lm_window=128,
                lm_batch=16,
                eval_windows=100,
            )
        else:
            base |= dict(
                heads=(1, 4, 8, 16),
                seeds=(0, 1, 2),
                lm_steps=3000,
                lm_window=256,
                lm_batch=64,
                eval_windows=400,
            )
        return cls(**(base | kw))


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
    ).to(torch.device(cfg.device))
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
        prepare = prepare_chars if cfg.tokenizer == "char" else prepare_text
        cache["tokenizer"], cache["ids"], cache["held_out"] = prepare(text)
    gen = seed_everything(seed)
    model = TinyTransformer(
        ModelConfig(
            vocab_size=len(cache["tokenizer"]),
            d_model=cfg.d_model,
            n_layers=cfg.n_layers,
            n_heads=n_heads,
            d_ff=cfg.d_ff,
            max_len=cfg.lm_window,
        )
    ).to(torch.device(cfg.device))  # initialised on the CPU: the same weights on any device
    start = time.perf_counter()
    losses = train(
        model,
        lm_loss(cache["ids"], cfg.lm_window, cfg.lm_batch),
        TrainConfig(steps=cfg.lm_steps, lr=cfg.lr, seed=seed, warmup=min(100, cfg.lm_steps // 10)),
        gen,
        progress=progress,
        label=f"language model h={n_heads} seed={seed}",
    )
    ppl = perplexity(model, cache["held_out"], cfg.lm_window, cfg.eval_windows)
    return {
        "task": "language-model",
        "n_heads": n_heads,
        "seed": seed,
        "metric": "perplexity",
        "value": ppl,
        "bits_per_token": math.log2(ppl),
        "final_train_loss": losses[-1],
        "params": n_parameters(model),
        "train_s": time.perf_counter() - start,
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
    """Run the grid; returns ``{"task", "setting", "device", "runs": [...], "summary": [...],
    "config", "wall_s"}``. Each training run is one stage of ``progress``, in steps."""
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for, but torch sees no CUDA device here")
    start = time.perf_counter()
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
        "setting": cfg.setting,
        "device": str(device),
        "runs": runs,
        "summary": summarise(runs),
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(cfg).items()},
        "wall_s": time.perf_counter() - start,
    }


#: where the data lives next to a checkout of headlab: ``<checkout>/../shared/data``
DATA_BESIDE_CHECKOUT = Path("..") / "shared" / "data"


def default_data() -> Path:
    """``../shared/data`` next to the headlab checkout this code runs from (not next to the
    current folder), when there is one.

    Raises:
        InputError: no checkout, or no data folder beside it.
    """
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "headlab").is_dir():
            candidate = (parent / DATA_BESIDE_CHECKOUT).resolve()
            if candidate.is_dir():
                return candidate
            raise InputError(
                f"no data folder at {candidate} (beside the headlab checkout); pass --data "
                "FOLDER holding corpus/tinyshakespeare/input.txt"
            )
    raise InputError(
        "headlab is not running from a checkout, so there is no default data folder; pass "
        "--data FOLDER holding corpus/tinyshakespeare/input.txt"
    )


def grid_config(setting: str, *, quick: bool = False, device: str = "cpu") -> GridConfig:
    """The grid of ``setting`` (``small`` or ``large``), its quick form with ``quick``."""
    if setting == "large":
        return GridConfig.large(quick=quick, device=device)
    return GridConfig.quick(device=device) if quick else GridConfig(device=device)


def data_folder(cfg: GridConfig, given: str | Path | None = None) -> Path:
    """The data folder of a run of ``cfg``: ``given``, else :func:`default_data` where a task
    reads TinyShakespeare (the binding task alone reads nothing).

    Raises:
        InputError: no folder given, none beside the checkout, and the grid needs one.
    """
    if given:
        return Path(given)
    return default_data() if "language-model" in cfg.tasks else Path(".")


def one_vs_many_text(result: dict[str, Any]) -> list[Part]:
    """What ``headlab experiment one-vs-many`` prints of its result (:func:`one_vs_many`): the
    mean and spread over seeds of each task and head count, then where each head of the
    binding models of the first seed looks from the query token."""
    rows = [
        (
            *(r["task"], r["n_heads"], r["metric"], f"{r['mean']:.3f}"),
            "\u2013" if r["std"] is None else f"{r['std']:.3f}",
            r["seeds"],
        )
        for r in result["summary"]
    ]
    out: list[Part] = [
        table(
            ("task", "heads", "metric", "mean", "spread (sd)", "seeds"),
            rows,
            title=f"one head vs many, same width and parameters ({result['setting']} setting, "
            f"{result['device']}, {result['wall_s']:.0f} s)",
            right=range(6),
        )
    ]
    first = result["config"]["seeds"][0]
    for run in result["runs"]:
        if run["task"] == "binding" and run["seed"] == first:
            focus = "; ".join(
                f"head {h['head']}: subject {h['mass_on_subject']:.2f}, object "
                f"{h['mass_on_object']:.2f}, entropy {h['entropy']:.2f}"
                for h in run["diagnostic"]["heads"]
            )
            out.append(f"{run['n_heads']} head(s), last layer, from the query token: {focus}")
    return out
