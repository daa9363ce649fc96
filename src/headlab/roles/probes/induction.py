"""Induction, previous-token and duplicate-token heads (causal models only), on repeated
random tokens.

Each sequence is ``half`` random tokens repeated twice, ``[A B C ... | A B C ...]``, after a BOS
token when the tokenizer has one. Random tokens carry no grammar, so only position and repetition
can draw a head's attention; each score is a mean attention weight on one key per query:

* **induction** (prefix matching; Olsson et al. 2022, "In-context Learning and Induction Heads",
  section 2): at a token of the second copy, the weight on the token that *followed* the same
  token in the first copy (``t - half + 1``), over the second copy but its last token;
* **previous-token** (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits";
  Olsson et al. 2022): the weight on the token at ``t - 1``, over the first copy from its second
  token on. The first copy, because there no earlier occurrence competes for the weight (in the
  second copy an induction or duplicate-token target can take it), and because it is where the
  induction circuit needs the previous token: the keys an induction head later matches are the
  first copy's positions (K-composition). The first copy's first token is left out: its previous
  token is BOS, the attention sink of many heads;
* **duplicate-token** (Wang et al. 2022, "Interpretability in the Wild", section 3): at a token
  of the second copy, the weight on the earlier occurrence of the same token (``t - half``), over
  the whole second copy.

Induction heads also *copy*: Olsson et al.'s copying score of each head's OV circuit is
:mod:`headlab.roles.copying` (from the weights, not from these sequences).
"""

from __future__ import annotations

from typing import Any

import torch

from headlab.roles.bootstrap import Sums, ratio

#: score name -> the key of its sums (``.sum``), in the order :func:`collect` returns them
SCORES = {
    "induction": "induction",
    "previous-token": "previous_token",
    "duplicate-token": "duplicate_token",
}


def sequences(tokenizer: Any, n: int, half: int, seed: int) -> tuple[torch.Tensor, int]:
    """``n`` sequences of ``half`` random tokens, each repeated twice, after a BOS token if the
    tokenizer has one; returns ``(input_ids (n, T), start)`` with ``start`` the first random slot."""
    gen = torch.Generator().manual_seed(seed)
    special = set(tokenizer.all_special_ids)
    allowed = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    picks = allowed[torch.randint(len(allowed), (n, half), generator=gen)]
    ids = torch.cat([picks, picks], dim=1)
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None:
        ids = torch.cat([torch.full((n, 1), bos), ids], dim=1)
        return ids, 1
    return ids, 0


def positions(half: int, start: int) -> dict[str, tuple[range, int]]:
    """For each score, its query rows and the offset of its key (``key = row + offset``)."""
    second = start + half
    return {
        "induction": (range(second, second + half - 1), 1 - half),
        "previous-token": (range(start + 1, second), -1),
        "duplicate-token": (range(second, second + half), -half),
    }


def collect(pattern: torch.Tensor, half: int, start: int) -> dict[str, torch.Tensor]:
    """Mean weights per sequence and head ``(B, H)``, one per score of :data:`SCORES`, from the
    pattern ``(B, H, T, T)`` of sequences made by :func:`sequences`."""
    out = {}
    for name, (rows, offset) in positions(half, start).items():
        r = torch.arange(rows.start, rows.stop, device=pattern.device)
        out[SCORES[name]] = pattern[:, :, r, r + offset].mean(-1)  # (B, H)
    return out


def scores(sums: Sums) -> dict[str, torch.Tensor]:
    """``induction``, ``previous-token`` and ``duplicate-token`` ``(R+1, L, H)``."""
    n = sums.get("induction.n")[:, None, None]
    return {name: ratio(sums.get(f"{key}.sum"), n) for name, key in SCORES.items()}
