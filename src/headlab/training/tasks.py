"""The experiment's two tasks.

**Task 1, "the prepared sentence in miniature"**: a sequence of random content tokens holds a
subject marker ``S`` followed by the subject ``x`` and an object marker ``O`` followed by the
object ``y``, at random distances, among distractors drawn from the same tokens. At the final
query token the model must name both ``x`` and ``y`` (two outputs at one position). One
attention head has one set of weights summing to 1: to fetch both it must split them, and what
arrives is an average of the two tokens in which "which was the subject" is blurred. Several
heads can each fetch one.

**Task 2, real text**: next-token prediction on TinyShakespeare with a byte-level BPE tokenizer
trained by headlab on the training part (first 90% of characters), or one token per character
(the ``large`` setting); perplexity on the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from headlab.errors import InputError
from headlab.training.model import ModelConfig, TinyTransformer


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@dataclass(frozen=True, kw_only=True)
class BindingTask:
    """Task 1's generator. Token ids: content ``0..n_content-1``, then S, O, Q."""

    n_content: int = 16
    length: int = 24

    @property
    def vocab_size(self) -> int:
        return self.n_content + 3

    @property
    def markers(self) -> tuple[int, int, int]:
        return self.n_content, self.n_content + 1, self.n_content + 2

    def batch(
        self, n: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(ids (n, T), targets (n, 2), where (n, 2))``: where are x's and y's positions."""
        s_tok, o_tok, q_tok = self.markers
        ids = torch.randint(0, self.n_content, (n, self.length), generator=generator)
        targets = torch.randint(0, self.n_content, (n, 2), generator=generator)
        slots = self.length - 2  # marker positions 0..length-3; the last token is Q
        ps = torch.randint(0, slots, (n,), generator=generator)
        po = torch.randint(0, slots, (n,), generator=generator)
        clash = (ps - po).abs() < 2
        while bool(clash.any()):  # redraw the object marker where the two would overlap
            po[clash] = torch.randint(0, slots, (int(clash.sum()),), generator=generator)
            clash = (ps - po).abs() < 2
        rows = torch.arange(n)
        ids[rows, ps], ids[rows, ps + 1] = s_tok, targets[:, 0]
        ids[rows, po], ids[rows, po + 1] = o_tok, targets[:, 1]
        where = torch.stack([ps + 1, po + 1], dim=1)
        ids[:, -1] = q_tok
        return ids, targets, where


class BindingModel(nn.Module):
    """A :class:`TinyTransformer` with two answer heads read at the final (query) position."""

    def __init__(self, cfg: ModelConfig, task: BindingTask) -> None:
        super().__init__()
        self.backbone = TinyTransformer(cfg)
        self.answer = nn.Linear(cfg.d_model, 2 * task.n_content)
        self.n_content = task.n_content

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, 2, n_content)
        h = self.backbone.hidden(ids)[:, -1]
        return self.answer(h).view(-1, 2, self.n_content)


def binding_loss(task: BindingTask, batch_size: int) -> Any:
    def loss(model: nn.Module, gen: torch.Generator) -> torch.Tensor:
        ids, targets, _ = task.batch(batch_size, gen)
        device = _device_of(model)
        logits = model(ids.to(device))
        targets = targets.to(device)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return loss


@torch.no_grad()
def binding_eval(model: BindingModel, task: BindingTask, n: int, seed: int) -> dict[str, Any]:
    """Accuracy (both answers right) and the last layer's attention from the query token."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    ids, targets, where = task.batch(n, gen)
    device = _device_of(model)
    ids, targets, where = ids.to(device), targets.to(device), where.to(device)
    pred = model(ids).argmax(-1)
    both = (pred == targets).all(-1).float().mean()
    x = model.backbone.wte(ids) + model.backbone.wpe(torch.arange(ids.shape[1], device=device))
    blocks = model.backbone.layers
    for block in blocks[:-1]:
        x = block(x)
    last = blocks[-1]
    weights = last.attn.inspect(last.ln_1(x), is_causal=True, need_weights=True).weights
    if weights is None:  # pragma: no cover - need_weights=True always returns them
        raise RuntimeError("attention weights were not returned")
    row = weights[:, :, -1, :]  # (B, H, T): where the query token looks, per head
    idx = torch.arange(n, device=device)
    mass_x, mass_y = row[idx, :, where[:, 0]], row[idx, :, where[:, 1]]  # (B, H)
    entropy = -(row.clamp_min(1e-12).log() * row).sum(-1)  # (B, H)
    return {
        "accuracy": float(both),
        "per_answer_accuracy": [float(a) for a in (pred == targets).float().mean(0)],
        "heads": [
            {
                "head": h,
                "mass_on_subject": float(mass_x[:, h].mean()),
                "mass_on_object": float(mass_y[:, h].mean()),
                "entropy": float(entropy[:, h].mean()),
            }
            for h in range(row.shape[1])
        ],
    }


def shakespeare_text(data: Path) -> str:
    path = data / "corpus" / "tinyshakespeare" / "input.txt"
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read TinyShakespeare at {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"TinyShakespeare at {path} is not UTF-8 text ({exc.reason})") from None


def train_tokenizer(text: str, vocab_size: int = 1024) -> Any:
    """A byte-level BPE tokenizer trained on ``text`` (deterministic), as a fast HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=1024,
    )


def split_text(text: str) -> tuple[str, str]:
    """First 90% of characters for training, the rest held out."""
    cut = int(0.9 * len(text))
    return text[:cut], text[cut:]


def prepare_text(text: str, vocab_size: int = 1024) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """``(tokenizer, training ids, held-out ids)``: a BPE tokenizer trained on the first 90% of
    ``text``, and both parts tokenized with it."""
    train_text, held_out = split_text(text)
    tok = train_tokenizer(train_text, vocab_size)
    ids = torch.tensor(tok(train_text, verbose=False)["input_ids"])
    held = torch.tensor(tok(held_out, verbose=False)["input_ids"])
    return tok, ids, held


def prepare_chars(text: str) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """``(vocabulary, training ids, held-out ids)`` with one token per character: the characters
    of the training part (first 90%), sorted, then one id for any held-out character the
    training part never showed."""
    train_text, held_out = split_text(text)
    chars = sorted(set(train_text))
    index = {c: i for i, c in enumerate(chars)}
    unknown = len(chars)
    ids = torch.tensor([index[c] for c in train_text])
    held = torch.tensor([index.get(c, unknown) for c in held_out])
    return [*chars, "<unk>"], ids, held


def lm_loss(ids: torch.Tensor, window: int, batch_size: int) -> Any:
    """Next-token loss on ``batch_size`` random windows of ``ids`` (drawn on the CPU with the
    trainer's generator, so the batches do not depend on the model's device)."""

    def loss(model: nn.Module, gen: torch.Generator) -> torch.Tensor:
        starts = torch.randint(0, ids.numel() - window - 1, (batch_size,), generator=gen)
        x = torch.stack([ids[s : s + window + 1] for s in starts.tolist()])  # (B, window + 1)
        x = x.to(_device_of(model))
        logits = model(x[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())

    return loss


@torch.no_grad()
def perplexity(model: nn.Module, ids: torch.Tensor, window: int, max_windows: int = 200) -> float:
    """exp(mean next-token loss) over consecutive held-out windows."""
    n = min(max_windows, (ids.numel() - 1) // window)
    total, count = 0.0, 0
    for i in range(0, n, 32):
        rows = [ids[j * window : j * window + window + 1] for j in range(i, min(n, i + 32))]
        x = torch.stack(rows).to(_device_of(model))  # (b, window + 1)
        logits = model(x[:, :-1])
        total += float(F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="sum"))
        count += x[:, 1:].numel()
    return float(torch.tensor(total / count).exp())
