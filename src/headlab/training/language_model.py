"""``headlab train``: a small causal language model on a text file, saved as a model folder."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from headlab.attention.memory import available_bytes
from headlab.errors import InputError
from headlab.outputs import atomic_folder, check_output, write_error
from headlab.progress import Progress
from headlab.training import plan
from headlab.training.model import ModelConfig, TinyTransformer, save_checkpoint, to_gpt2
from headlab.training.tasks import lm_loss, perplexity, prepare_text
from headlab.training.trainer import TrainConfig, seed_everything, train

#: the kind of output recorded in the folder's ``.headlab-output`` marker
KIND = "trained-model"


@dataclass(frozen=True, kw_only=True)
class LMRecipe:
    """Everything needed to reproduce a trained language model."""

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 512
    context: int = 128
    vocab_size: int = 1024
    steps: int = 2000
    batch_size: int = 32
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self) -> None:

        bounds = {
            "d_model": (1, 4096),
            "n_layers": (1, 64),
            "n_heads": (1, 4096),
            "d_ff": (1, 16384),
            "context": (2, 4096),
            "vocab_size": (257, 65536),  # the 256 bytes and <|endoftext|>, at least
            "steps": (1, 10_000_000),
            "batch_size": (1, 4096),
            "seed": (0, 2**32 - 1),
        }
        for name, (low, high) in bounds.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InputError(f"{name} must be an integer in {low:,}..{high:,}, got {value!r}")
        if self.d_model % self.n_heads:
            raise InputError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise InputError(f"lr must be a positive finite number, got {self.lr!r}")

    def check_memory(self, available: int | None) -> None:
        """Refuse sizes whose training would not fit ``available`` bytes (``None``: not known)
        in one line naming the flag and the most that fits (:func:`plan.check_memory`)."""
        plan.check_memory(
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            context=self.context,
            vocab=self.vocab_size,
            batch=self.batch_size,
            available=available,
        )


def train_language_model(
    text: str,
    out: Path,
    recipe: LMRecipe,
    *,
    source: str,
    overwrite: bool,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train on the first 90% of ``text``, measure perplexity on the rest, write ``out``:
    a GPT-2 model folder (safetensors, config, tokenizer) that headlab and transformers load,
    headlab's own checkpoint in ``out/headlab/``, and ``RECIPE.json``."""
    if len(text) < 10_000:
        raise InputError(f"the training text has {len(text)} characters; give at least 10,000")
    check_output(out, overwrite=overwrite, kind=KIND)  # before the training, not after
    recipe.check_memory(available_bytes(torch.device("cpu")))  # before the tokenizer's training
    tok, ids, held = prepare_text(text, recipe.vocab_size)
    shortest = min(ids.numel(), held.numel())
    if shortest <= recipe.context + 1:
        raise InputError(
            f"context {recipe.context} needs more than {recipe.context + 1} tokens in both the "
            f"training and the held-out part; the text gives {ids.numel():,} and "
            f"{held.numel():,} (a longer text, or a shorter context)"
        )
    gen = seed_everything(recipe.seed)
    model = TinyTransformer(
        ModelConfig(
            vocab_size=len(tok),
            d_model=recipe.d_model,
            n_layers=recipe.n_layers,
            n_heads=recipe.n_heads,
            d_ff=recipe.d_ff,
            max_len=recipe.context,
        )
    )
    losses = train(
        model,
        lm_loss(ids, recipe.context, recipe.batch_size),
        TrainConfig(steps=recipe.steps, lr=recipe.lr, seed=recipe.seed),
        gen,
        progress=progress,
        label="train",
    )
    ppl = perplexity(model, held, recipe.context)
    info = {
        "recipe": asdict(recipe),
        "source": source,
        "train_tokens": int(ids.numel()),
        "held_out_tokens": int(held.numel()),
        "final_train_loss": losses[-1],
        "held_out_perplexity": ppl,
        "trained_by": "headlab train",
    }
    with atomic_folder(out, overwrite=overwrite, kind=KIND) as tmp:
        try:
            gpt2 = to_gpt2(model, special_id=tok.eos_token_id)
            gpt2.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
            save_checkpoint(model, tmp / "headlab", info)
            (tmp / "RECIPE.json").write_text(json.dumps(info, indent=2) + "\n")
        except SafetensorError as exc:
            raise write_error(out, exc) from None
    return info


def train_file(
    text: str | Path,
    out: str | Path,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
    **recipe: Any,
) -> dict[str, Any]:
    """:func:`train_language_model` on the UTF-8 file ``text`` (its name recorded as the
    source) into ``out``, with the :class:`LMRecipe` of ``recipe``; the folder is checked, then
    the file read, then the recipe, before any training.

    Raises:
        InputError: ``out`` is taken, the file cannot be read, or the recipe is out of range.
    """
    folder = check_output(out, overwrite=overwrite, kind=KIND)
    try:
        content = Path(text).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read --text {text}: {exc}") from None
    return train_language_model(
        content,
        folder,
        LMRecipe(**recipe),
        source=Path(text).name,
        overwrite=overwrite,
        progress=progress,
    )


def trained_text(out: str | Path, info: dict[str, Any]) -> list[str]:
    """What ``headlab train`` prints of a run (:func:`train_language_model`'s ``info``): the
    folder and its held-out perplexity."""
    return [
        f"trained {Path(out)}: held-out perplexity {info['held_out_perplexity']:.2f} "
        f"({info['held_out_tokens']:,} tokens); load it with headlab.models.load"
    ]
