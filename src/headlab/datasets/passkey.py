"""Passkey prompts (Mohtashami and Jaggi 2023): a number hidden at some depth in filler text, asked
for at the end.

The filler is the sentences of the original task, repeated; the needle says the key twice. A
model answers by copying the key's digits from the needle, which is what the retrieval score of
Wu et al. 2024 watches heads do. Text only: the caller tokenizes the parts and sizes the filler.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "it. I will quiz you about the important information there."
)
FILLER = (
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
QUESTION = " What is the pass key? The pass key is"


@dataclass(frozen=True)
class Passkey:
    """One prompt's parts: ``INTRO``, ``before`` fillers, the needle, ``after`` fillers, the
    question; the answer is ``" " + key``."""

    key: str
    before: int
    after: int

    @property
    def needle(self) -> str:
        return f" The pass key is {self.key}. Remember it. {self.key} is the pass key."

    @property
    def answer(self) -> str:
        return f" {self.key}"

    def text(self) -> str:
        """The whole prompt, question included, answer excluded."""
        return INTRO + FILLER * self.before + self.needle + FILLER * self.after + QUESTION


def passkeys(n: int, fillers: int, depths: tuple[float, ...], *, seed: int = 0) -> list[Passkey]:
    """``n`` prompts of ``fillers`` filler sentences, the needle after ``depth`` of them, the
    depths taken in turn; 5-digit keys drawn at ``seed``."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        before = round(depths[i % len(depths)] * fillers)
        key = str(rng.randint(10_000, 99_999))
        prompts.append(Passkey(key=key, before=before, after=fillers - before))
    return prompts
