"""A task metric for causal models: indirect object identification (IOI).

Wang et al. 2022 ("Interpretability in the Wild: a Circuit for Indirect Object Identification
in GPT-2 small") measure a model on prompts such as

    When Mary and John went to the store, John gave a drink to

where the right next token is the indirect object `` Mary`` and the wrong one the subject
`` John``. The score is the mean logit difference ``logit(IO) - logit(S)`` at the last position:
positive when the model prefers the indirect object. Both name orders appear (ABBA: the indirect
object first, BABA: the subject first), so that "the first name" is no shortcut.

Prompts come from a few templates, places and objects, and single-token names (those the
model's tokenizer keeps whole with a leading space), drawn with a fixed seed: the same prompts
on every run. The evaluation and importance prompts use disjoint names (even and odd positions
of the name list), so importance is never scored on the names the curve is measured on.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.pruning.metrics import Removed, _ablated

NAMES = (
    "Mary", "John", "Tom", "James", "Sarah", "Anna", "Mike", "David", "Lisa", "Kate",
    "Paul", "Emma", "Alice", "Bob", "Peter", "Jack", "Lucy", "Dan", "Sam", "Max",
    "Ben", "Amy", "Rose", "Jane", "Mark", "Adam", "Ryan", "Laura",
)  # fmt: skip
#: ``{io}``/``{s}``: the names; the subject ``{s}`` is repeated, the prompt ends before the answer
TEMPLATES = (
    "When {a} and {b} went to the {place}, {s} gave a {thing} to",
    "Then, {a} and {b} went to the {place}. {s} gave a {thing} to",
    "After {a} and {b} went to the {place}, {s} gave a {thing} to",
    "While {a} and {b} were working at the {place}, {s} gave a {thing} to",
    "Friends {a} and {b} went to the {place}. {s} gave a {thing} to",
)
PLACES = ("store", "park", "school", "hospital", "office", "station")
THINGS = ("drink", "book", "ring", "letter", "bag", "gift")
#: prompts of ``headlab prune --metric ioi``: evaluation and importance
EVAL_PROMPTS = 64
IMPORTANCE_PROMPTS = 32


@dataclass(frozen=True, kw_only=True)
class IoiPrompt:
    text: str
    io: str  # the indirect object, the right answer
    s: str  # the subject, the wrong one


def ioi_prompts(names: list[str], n: int, *, seed: int = 0) -> list[IoiPrompt]:
    """``n`` prompts from :data:`TEMPLATES` with pairs of distinct ``names``, half ABBA and half
    BABA, the same for the same arguments."""
    if len(set(names)) < 2:
        raise InputError(f"IOI prompts need at least 2 distinct names, got {names}")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        io, s = rng.sample(names, 2)
        a, b = (io, s) if i % 2 == 0 else (s, io)  # ABBA, then BABA
        text = TEMPLATES[i % len(TEMPLATES)].format(
            a=a, b=b, s=s, place=rng.choice(PLACES), thing=rng.choice(THINGS)
        )
        out.append(IoiPrompt(text=text, io=io, s=s))
    return out


def single_token_names(tokenizer: object, names: tuple[str, ...] = NAMES) -> list[str]:
    """The names that ``tokenizer`` encodes, after a space, as one token each."""
    return [
        name
        for name in names
        if len(tokenizer(" " + name, add_special_tokens=False)["input_ids"]) == 1  # type: ignore[operator]
    ]


@dataclass
class IoiMetric:
    """Mean IOI logit difference ``logit(IO) - logit(S)``; loss: its negative.

    ``batches``: ``(ids (B, T), io (B,), s (B,))`` token ids, each batch of one token length
    (no padding: the logits are read at the last position of every row).
    """

    batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    n_prompts: int
    batch: int = 16
    name: str = "ioi"
    unit: str = "logit difference"
    higher_is_better: bool = True

    @classmethod
    def build(
        cls, lm: LoadedModel, *, n: int, part: str = "evaluation", seed: int = 0, batch: int = 16
    ) -> IoiMetric:
        """``n`` prompts on ``part``'s names (``evaluation``: even positions of the
        single-token names, ``importance``: odd ones).

        Raises:
            InputError: not a causal model, or fewer than 4 single-token names.
        """
        if not lm.causal:
            raise InputError(
                f"--metric ioi needs a causal language model; {lm.name} is an encoder "
                "(use --metric stsb or fidelity)"
            )
        tok = lm.tokenizer
        names = single_token_names(tok)
        if len(names) < 4:
            raise InputError(
                f"--metric ioi needs at least 4 names that {lm.name}'s tokenizer keeps as one "
                f"token; it keeps {len(names)} of {len(NAMES)}"
            )
        mine = names[0::2] if part == "evaluation" else names[1::2]
        prompts = ioi_prompts(mine, n, seed=seed)
        rows: dict[int, list[tuple[list[int], int, int]]] = {}
        for p in prompts:
            ids = _encode(tok, p.text)
            io = tok(" " + p.io, add_special_tokens=False)["input_ids"][0]
            s = tok(" " + p.s, add_special_tokens=False)["input_ids"][0]
            rows.setdefault(len(ids), []).append((ids, io, s))
        batches = []
        for _, same in sorted(rows.items()):
            for lo in range(0, len(same), batch):
                chunk = same[lo : lo + batch]
                batches.append(
                    (
                        torch.tensor([r[0] for r in chunk]),
                        torch.tensor([r[1] for r in chunk]),
                        torch.tensor([r[2] for r in chunk]),
                    )
                )
        return cls(batches=batches, n_prompts=len(prompts), batch=batch)

    def _differences(self, lm: LoadedModel, part: tuple[int, int]) -> Iterator[torch.Tensor]:
        for ids, io, s in self.batches[part[0] :: part[1]]:
            logits = last_logits(lm, ids.to(lm.device)).float()  # (B, V)
            rows = torch.arange(ids.shape[0], device=logits.device)
            yield logits[rows, io.to(logits.device)] - logits[rows, s.to(logits.device)]

    def loss_batches(
        self, lm: LoadedModel, part: tuple[int, int] = (0, 1)
    ) -> Iterator[torch.Tensor]:
        for diff in self._differences(lm, part):
            yield -diff.mean()

    def evaluate(self, lm: LoadedModel, removed: Removed | None = None) -> float:
        with torch.inference_mode(), _ablated(lm, removed):
            diffs = torch.cat(list(self._differences(lm, (0, 1))))
        return float(diffs.mean())


def _encode(tokenizer: object, text: str) -> list[int]:
    """``text``'s ids with the tokenizer's leading special tokens (a BOS) but no trailing ones
    (BERT's ``[SEP]``): the prompt must end where the answer would come."""
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    full = tokenizer(text)["input_ids"]  # type: ignore[operator]
    prefix = full[: len(full) - len(plain)] if full[len(full) - len(plain) :] == plain else []
    return [*prefix, *plain]


def last_logits(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """Next-token logits ``(B, V)`` at the last position of ``ids`` ``(B, T)``.

    Only the last position goes through the language-model head when the model's forward takes
    ``logits_to_keep`` (the head of a 49k-token vocabulary is a fifth of SmolLM2's forward).

    Raises:
        InputError: the model was loaded without its language-model head.
    """
    if lm.model.get_output_embeddings() is None:
        raise InputError(f"{lm.name} was loaded without its language-model head")
    keep = "logits_to_keep" in inspect.signature(lm.model.forward).parameters
    out = lm.model(input_ids=ids, **({"logits_to_keep": 1} if keep else {}))
    return out.logits[:, -1]
