"""What each KV head needs of the context, measured in one pass of the model's own attention.

Two scores per query head, each read from the weights :class:`StreamingAttention` hands out
block by block (no layer's whole pattern is ever kept), then per KV head as the maximum over the
query heads that share it (GQA, MQA): a KV head can keep a short cache only if none of its
queries needs more.

- ``outside``: the share of attention that falls outside the first ``sink`` tokens and the last
  ``window`` (the query's own included) on long natural text, averaged over the queries that
  have such keys. What a streaming head with that sink and window would lose; DuoAttention's
  criterion (Xiao et al. 2024) measured without training a gate.
- ``retrieval``: the copy-paste score of Wu et al. 2024 on passkey prompts: at each digit of
  the answer (the answer fed in, teacher-forced), whether the head's largest weight falls on a
  token of the needle equal to the digit being predicted; the share of answer tokens so copied.

Shape vocabulary: ``L`` layers, ``H`` query heads, ``Hkv`` KV heads, ``G = H // Hkv``, ``B``
batch, ``t`` rows in a block, ``s`` keys a block sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headlab.datasets.passkey import FILLER, INTRO, QUESTION, Passkey
from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.models.streaming import StreamingAttention
from headlab.progress import NO_PROGRESS, Progress

#: the scores, by name
SCORES = ("outside", "retrieval")


def kv_max(lm: LoadedModel, per_query_head: torch.Tensor) -> torch.Tensor:
    """A score per query head ``(L, H)`` as one per KV head ``(L, Hkv)``: the largest of the
    query heads that read it."""
    n_layers, n_heads = per_query_head.shape
    n_kv = lm.layout.n_kv_heads
    if set(lm.layout.heads_per_layer) != {n_heads} or set(lm.layout.kv_heads_per_layer) != {n_kv}:
        raise InputError("headlab kv needs the same heads in every layer (a pruned model?)")
    return per_query_head.reshape(n_layers, n_kv, n_heads // n_kv).amax(-1)  # (L, Hkv)


class _Outside:
    """Sums, per query head, the attention outside the sink and the window, and the rows that
    have keys there."""

    def __init__(self, lm: LoadedModel, sink: int, window: int) -> None:
        self.sink, self.window = sink, window
        self.mass = torch.zeros(lm.n_layers, lm.n_heads, dtype=torch.float64)  # (L, H)
        self.rows = torch.zeros(lm.n_layers, dtype=torch.float64)  # (L,)

    def columns(self, layer: int) -> None:
        return None

    def block(self, layer: int, start: int, weights: torch.Tensor, *_: object) -> None:
        batch, _heads, n_rows, n_keys = weights.shape  # (B, H, t, s)
        rows = torch.arange(start, start + n_rows, device=weights.device)
        keys = torch.arange(n_keys, device=weights.device)
        far = (keys[None] >= self.sink) & (rows[:, None] - keys[None] >= self.window)  # (t, s)
        counted = far.any(-1)  # (t,) rows that have keys outside
        if not bool(counted.any()):
            return
        outside = (weights * far).sum(-1)[..., counted]  # (B, H, t')
        self.mass[layer] += outside.sum((0, 2)).double().cpu()
        self.rows[layer] += batch * int(counted.sum())

    def layer_done(self, layer: int) -> None:
        pass


def outside_scores(
    lm: LoadedModel,
    chunks: Sequence[torch.Tensor],
    *,
    sink: int,
    window: int,
    progress: Progress = NO_PROGRESS,
) -> torch.Tensor:
    """The ``outside`` score of every KV head ``(L, Hkv)`` over ``chunks`` of text ids
    ``(1, T)`` each, with ``T`` above ``sink + window``."""
    consumer = _Outside(lm, sink, window)
    progress.start("attention outside the sink and window", total=len(chunks), unit="texts")
    with torch.no_grad():
        for ids in chunks:
            with StreamingAttention(lm, consumer, stop_after_last=True):
                lm.model(input_ids=ids.to(lm.device))
            progress.advance()
    progress.end()
    if not bool((consumer.rows > 0).all()):
        raise InputError(f"--context must exceed --sink + --window ({sink + window}) tokens")
    return kv_max(lm, consumer.mass / consumer.rows[:, None])


@dataclass(frozen=True)
class PasskeyIds:
    """A passkey prompt tokenized: ``ids`` ``(1, T)`` with the answer at the end, the needle's
    token span ``[needle_start, needle_end)``, and the answer's ``n_answer`` tokens."""

    prompt: Passkey
    ids: torch.Tensor
    needle_start: int
    needle_end: int
    n_answer: int

    @property
    def question(self) -> torch.Tensor:
        """The prompt without its answer ``(1, T - n_answer)``."""
        return self.ids[:, : self.ids.shape[1] - self.n_answer]

    @property
    def answer(self) -> list[int]:
        return [int(i) for i in self.ids[0, self.ids.shape[1] - self.n_answer :]]


def _tokens(lm: LoadedModel, text: str, *, special: bool = False) -> list[int]:
    return list(lm.tokenizer(text, add_special_tokens=special)["input_ids"])


def encode_passkey(lm: LoadedModel, prompt: Passkey) -> PasskeyIds:
    """``prompt`` tokenized part by part (so the needle's span is known exactly)."""
    head = _tokens(lm, INTRO + FILLER * prompt.before, special=True)
    needle = _tokens(lm, prompt.needle)
    tail = _tokens(lm, FILLER * prompt.after + QUESTION)
    answer = _tokens(lm, prompt.answer)
    ids = torch.tensor([head + needle + tail + answer])
    return PasskeyIds(prompt, ids, len(head), len(head) + len(needle), len(answer))


def fillers_for(lm: LoadedModel, context: int) -> int:
    """How many filler sentences make a passkey prompt (answer included) about ``context``
    tokens long."""
    each = len(_tokens(lm, FILLER * 20)) / 20
    fixed = len(_tokens(lm, INTRO, special=True)) + len(
        _tokens(lm, Passkey("12345", 0, 0).needle + QUESTION + " 12345")
    )
    fillers = int((context - fixed) // each)
    if fillers < 1:
        raise InputError(f"--context {context} is too short for a passkey prompt ({fixed} tokens)")
    return fillers


class _Copies:
    """Counts, per query head, the answer tokens whose row's largest weight is on a needle token
    equal to the one being predicted."""

    def __init__(self, lm: LoadedModel, prompt: PasskeyIds) -> None:
        total = prompt.ids.shape[1]
        self.rows = torch.arange(total - prompt.n_answer - 1, total - 1)  # rows predicting answers
        self.ids = prompt.ids[0]
        self.targets = self.ids[self.rows + 1]
        self.span = (prompt.needle_start, prompt.needle_end)
        self.copies = torch.zeros(lm.n_layers, lm.n_heads, dtype=torch.float64)  # (L, H)

    def columns(self, layer: int) -> None:
        return None

    def block(self, layer: int, start: int, weights: torch.Tensor, *_: object) -> None:
        inside = (self.rows >= start) & (self.rows < start + weights.shape[2])
        if not bool(inside.any()):
            return
        picked = weights[0][:, (self.rows[inside] - start).to(weights.device)]  # (H, r, s)
        top = picked.argmax(-1).cpu()  # (H, r)
        in_needle = (top >= self.span[0]) & (top < self.span[1])
        same = self.ids[top] == self.targets[inside][None]
        self.copies[layer] += (in_needle & same).sum(-1).double()

    def layer_done(self, layer: int) -> None:
        pass


def retrieval_scores(
    lm: LoadedModel, prompts: Sequence[PasskeyIds], *, progress: Progress = NO_PROGRESS
) -> torch.Tensor:
    """The ``retrieval`` score of every KV head ``(L, Hkv)``: the share of the answers' tokens
    each head copied from the needle, over ``prompts``."""
    copies = torch.zeros(lm.n_layers, lm.n_heads, dtype=torch.float64)
    answers = 0
    progress.start("copying from the needle", total=len(prompts), unit="prompts")
    with torch.no_grad():
        for prompt in prompts:
            consumer = _Copies(lm, prompt)
            with StreamingAttention(lm, consumer, stop_after_last=True):
                lm.model(input_ids=prompt.ids.to(lm.device))
            copies += consumer.copies
            answers += prompt.n_answer
            progress.advance()
    progress.end()
    return kv_max(lm, copies / max(answers, 1))
