"""A model whose answer is known: a two-layer attention-only transformer trained on repeated
random sequences, which grows a previous-token head and induction heads (Olsson et al. 2022,
"In-context Learning and Induction Heads").

Each training sequence is random tokens in which a random block of ``period`` tokens (a period
drawn from ``min_period..max_period`` for each sequence, at a random place) is followed by
itself; the loss is the next-token loss on the copy, from its second token on, where only the
first occurrence says what comes next. A fixed period would let one head copy from a fixed
distance; a random one needs the two-step mechanism: a layer-0 head moves each token's
predecessor into it, and a layer-1 head whose keys read that (K-composition) finds the token
after the earlier occurrence of the current one and copies it.

The model is a Hugging Face ``LlamaForCausalLM`` (rotary positions: a previous-token head is
one rotation away; with GPT-2's learned positions the same training grows heads that look a
few tokens back instead) whose MLPs are zero and frozen, so nothing but attention moves
information. It loads into every headlab tool with :func:`headlab.models.wrap`.

Example:
    >>> from headlab.experiments.induction import InductionConfig, train_induction, induction_task
    >>> model = train_induction(InductionConfig(steps=400))
    >>> task = induction_task(16)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headlab.causal.tasks import Batch, Prompt, Task
from headlab.errors import ConfigError
from headlab.progress import NO_PROGRESS, Progress


@dataclass(frozen=True, kw_only=True)
class InductionConfig:
    """The toy model and its training.

    Attributes:
        vocab: token ids ``1..vocab-1`` are random tokens, ``0`` starts every sequence.
        length: tokens a sequence.
        width, heads: the model width and its heads a layer (two layers).
        min_period, max_period: the repeated block's length, drawn for each sequence.
        steps, batch, lr, seed: the training (AdamW; the same seed, the same model on a CPU).
    """

    vocab: int = 64
    length: int = 40
    width: int = 64
    heads: int = 2
    min_period: int = 2
    max_period: int = 18
    steps: int = 400
    batch: int = 64
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab < 8 or self.width % self.heads or self.heads < 1:
            raise ConfigError("vocab must be at least 8 and width a multiple of heads")
        if not 2 <= self.min_period <= self.max_period or 2 * self.max_period + 1 > self.length:
            raise ConfigError(
                f"periods {self.min_period}..{self.max_period} must fit twice in {self.length} "
                "tokens after the first"
            )
        if self.steps < 1 or self.batch < 1 or self.lr <= 0:
            raise ConfigError("steps, batch and lr must be positive")


def repeated_batch(cfg: InductionConfig, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids (B, T), copied (B, T))``: random sequences with a repeated block, and where the
    copy's tokens stand (its first token left out: nothing predicts it).

    Shape vocabulary: ``B`` = ``cfg.batch``, ``T`` = ``cfg.length``.
    """
    ids = torch.randint(1, cfg.vocab, (cfg.batch, cfg.length), generator=gen)
    copied = torch.zeros(cfg.batch, cfg.length, dtype=torch.bool)
    periods = torch.randint(cfg.min_period, cfg.max_period + 1, (cfg.batch,), generator=gen)
    for row, period in enumerate(periods.tolist()):
        start = int(torch.randint(1, cfg.length - 2 * period + 1, (1,), generator=gen))
        ids[row, start + period : start + 2 * period] = ids[row, start : start + period]
        copied[row, start + period + 1 : start + 2 * period] = True
    ids[:, 0] = 0
    return ids, copied


def build_model(cfg: InductionConfig) -> Any:
    """A fresh two-layer attention-only ``LlamaForCausalLM`` (MLPs zero and frozen)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=cfg.vocab,
        hidden_size=cfg.width,
        intermediate_size=cfg.width,
        num_hidden_layers=2,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.heads,
        max_position_embeddings=cfg.length,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config)
    for layer in model.model.layers:  # attention only: the MLPs write nothing, ever
        for p in layer.mlp.parameters():
            torch.nn.init.zeros_(p)
            p.requires_grad_(False)
    return model


def train_induction(cfg: InductionConfig, *, progress: Progress | None = None) -> Any:
    """Train :func:`build_model` on :func:`repeated_batch` es; returns it in eval mode.
    ``progress`` hears of each step (the note: the loss on the copies)."""
    progress = progress or NO_PROGRESS
    model = build_model(cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    model.train()
    progress.start("induction toy", cfg.steps, "steps")
    for _ in range(cfg.steps):
        ids, copied = repeated_batch(cfg, gen)
        logits = model(input_ids=ids).logits[:, :-1]  # (B, T-1, V)
        loss = torch.nn.functional.cross_entropy(logits[copied[:, 1:]], ids[:, 1:][copied[:, 1:]])
        opt.zero_grad()
        loss.backward()
        opt.step()
        progress.advance(1, note=f"loss {loss.item():.3f}")
    progress.end()
    model.eval()
    return model


def induction_task(n: int, cfg: InductionConfig | None = None, *, seed: int = 1) -> Task:
    """``n`` induction prompts as token ids, the shape of :func:`headlab.causal.generators.induction`:
    clean ``0, w1..wL, w1..wk``; corrupt ``0, u1..uL, w1..wk`` (the first block drawn afresh:
    nothing repeats); answer ``w(k+1)``, distractor a later ``wj`` (``j`` in ``k+2..L``). ``L``
    is ``cfg.max_period`` (all words distinct), ``k`` random in ``2..L-2``; all prompts of one
    ``k`` share a batch."""
    cfg = cfg or InductionConfig()
    gen = torch.Generator().manual_seed(seed)
    span = cfg.max_period
    rows: dict[int, list[tuple[list[int], list[int], int, int]]] = {}
    for _ in range(n):
        words = (torch.randperm(cfg.vocab - 1, generator=gen)[: 2 * span] + 1).tolist()
        first, fresh = words[:span], words[span:]
        k = int(torch.randint(2, span - 1, (1,), generator=gen))
        j = int(torch.randint(k + 1, span, (1,), generator=gen))
        clean = [0, *first, *first[:k]]
        corrupt = [0, *fresh, *first[:k]]
        rows.setdefault(k, []).append((clean, corrupt, first[k], first[j]))
    prompts: list[Prompt] = []
    batches = []
    for k in sorted(rows):
        index = []
        for clean, corrupt, answer, distractor in rows[k]:
            index.append(len(prompts))
            prompts.append(
                Prompt(
                    clean=" ".join(map(str, clean)),
                    corrupt=" ".join(map(str, corrupt)),
                    answer=str(answer),
                    distractor=str(distractor),
                    meta={"k": k},
                )
            )
        batches.append(
            Batch(
                clean=torch.tensor([r[0] for r in rows[k]]),
                corrupt=torch.tensor([r[1] for r in rows[k]]),
                answer=torch.tensor([r[2] for r in rows[k]]),
                distractor=torch.tensor([r[3] for r in rows[k]]),
                index=tuple(index),
            )
        )
    return Task(name="induction (toy)", prompts=tuple(prompts), batches=tuple(batches))
