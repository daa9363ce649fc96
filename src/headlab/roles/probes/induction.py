"""Induction heads (causal models only).

On a random token sequence repeated twice, ``[A B C ... | A B C ...]``, an induction head at a
token of the second copy attends to the token that *followed* the same token in the first copy
(prefix matching; Olsson et al. 2022, "In-context Learning and Induction Heads", section 2). The
score is the mean attention weight on that position over the second copy. Random sequences carry
no grammar, so only the copying mechanism can score.
"""

from __future__ import annotations

from typing import Any

import torch

from headlab.roles.bootstrap import Sums, ratio


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


def collect(pattern: torch.Tensor, half: int, start: int) -> torch.Tensor:
    """Mean induction weight per sequence and head ``(B, H)`` from pattern ``(B, H, T, T)``."""
    # the second copy, but its last token
    rows = torch.arange(start + half, start + 2 * half - 1, device=pattern.device)
    cols = rows - half + 1  # the token after the earlier occurrence
    return pattern[:, :, rows, cols].mean(-1)


def scores(sums: Sums) -> dict[str, torch.Tensor]:
    """``induction`` ``(R+1, L, H)``."""
    return {"induction": ratio(sums.get("induction.sum"), sums.get("induction.n")[:, None, None])}
