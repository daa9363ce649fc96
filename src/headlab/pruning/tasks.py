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

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from headlab.datasets.ioi import (  # noqa: F401  (re-exported)
    NAMES,
    PLACES,
    TEMPLATES,
    THINGS,
    IoiPrompt,
    ioi_prompts,
    single_token_names,
)
from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.models.runner import last_logits
from headlab.pruning.metrics import Removed, ablated

#: prompts of ``headlab prune --metric ioi``: evaluation and importance
EVAL_PROMPTS = 64
IMPORTANCE_PROMPTS = 32


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
        with torch.inference_mode(), ablated(lm, removed):
            diffs = torch.cat(list(self._differences(lm, (0, 1))))
        return float(diffs.mean())


def _encode(tokenizer: object, text: str) -> list[int]:
    """``text``'s ids with the tokenizer's leading special tokens (a BOS) but no trailing ones
    (BERT's ``[SEP]``): the prompt must end where the answer would come."""
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    full = tokenizer(text)["input_ids"]  # type: ignore[operator]
    prefix = full[: len(full) - len(plain)] if full[len(full) - len(plain) :] == plain else []
    return [*prefix, *plain]
