"""What every patching run shares: the metric (the logit difference at the last position),
its normalization, and the checks of a task, a position and the layers patched."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import torch

from headlab.causal.tasks import Task
from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.models.runner import last_logits as logits_at_end

#: the methods :func:`headlab.causal.patching.run_patching` computes (``headlab patch``'s whole
#: list, with what each takes, is :mod:`headlab.causal.methods`' table)
Method = Literal["activation", "attribution", "ig"]
METHODS: tuple[str, ...] = get_args(Method)
#: EAP-IG's points on the path from the corrupted to the clean embeddings (Hanna et al. use 5)
IG_STEPS = 5
#: rows of one patched forward pass (copies x prompts), bounding its memory
MAX_ROWS = 256


def last_logits(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """Next-token logits ``(R, V)`` at the last position of ``ids`` ``(R, T)``."""
    return logits_at_end(lm, ids)


def logit_difference(
    logits: torch.Tensor, answer: torch.Tensor, distractor: torch.Tensor
) -> torch.Tensor:
    """``(R,)``: ``logit(answer) - logit(distractor)`` of each row of ``logits`` ``(R, V)``."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    answer, distractor = answer.to(logits.device), distractor.to(logits.device)
    return logits[rows, answer].double() - logits[rows, distractor].double()


def _positions(position: int | None, length: int) -> torch.Tensor | None:
    """bool ``(T,)`` of the one patched position (negative: from the end), or ``None``."""
    if position is None:
        return None
    if not -length <= position < length:
        raise InputError(
            f"position {position} is outside a prompt of {length} tokens "
            f"(expected -{length}..{length - 1}; -1 is the last token)"
        )
    mask = torch.zeros(length, dtype=torch.bool)
    mask[position] = True
    return mask


def batched(name: str, per_batch: int, batches: int, unit: str) -> tuple[str, int, str]:
    """A stage's ``(name, total, unit)`` that counts what it names: ``per_batch`` ``unit``
    once per batch of prompts (``"patching heads (270 heads x 2 batches)", 540, "passes"``)."""
    if batches == 1:
        return name, per_batch, unit
    return f"{name} ({per_batch} {unit} x {batches} batches)", per_batch * batches, "passes"


def check_task(lm: LoadedModel, task: Task) -> None:
    """A one-line error unless ``lm`` is a language model with its head (the metric reads
    next-token logits) and ``task`` has prompts, none longer than the model reads."""
    if lm.model.get_output_embeddings() is None:
        raise InputError(
            f"patching reads next-token logits: load {lm.name} with its language-model head "
            "(load(..., with_lm_head=True))"
        )
    if not task.batches:
        raise InputError(f"task {task.name!r} has no prompts")
    limit = lm.max_positions
    longest = max(task.batches, key=lambda b: b.clean.shape[-1])
    if limit is not None and longest.clean.shape[-1] > limit:
        where = task.prompts[longest.index[0]].source or f"prompt {longest.index[0] + 1}"
        raise InputError(
            f"{where}: the prompt has {longest.clean.shape[-1]} tokens; {lm.name} reads at most "
            f"{limit}"
        )


def _check_layers(lm: LoadedModel, layers: Sequence[int] | None) -> list[int]:
    if layers is None:
        return list(range(lm.n_layers))
    chosen = sorted({int(layer) for layer in layers})
    bad = [layer for layer in chosen if not 0 <= layer < lm.n_layers]
    if bad or not chosen:
        raise InputError(
            f"layers must be in 0..{lm.n_layers - 1} for {lm.name}, got "
            f"{', '.join(map(str, bad)) or 'none'}"
        )
    return chosen


def _normalize(clean: float, corrupt: float, patched: torch.Tensor, task: str) -> torch.Tensor:
    gap = clean - corrupt
    if abs(gap) < 1e-9:
        raise InputError(
            f"{task}: the clean and corrupted prompts score the same on average (logit "
            f"difference {clean:.4g}): the normalized effect is undefined; "
            "there is no gap for a head to explain; corrupt what the answer depends on"
        )
    return (clean - patched) / gap


def gap_warning(
    clean: float,
    corrupt: float,
    *,
    prompts: str = "the clean and corrupted prompts",
    measures: str = "effects",
) -> str | None:
    """One line when the clean and corrupted prompts' mean logit differences have the same
    sign (``None`` otherwise): the corruption then removes only part of the behaviour, and
    ``measures`` (patch's effects, circuit's faithfulness), shares of that part
    (:func:`_normalize`), can exceed 1 or fall below 0. ``prompts`` names the prompts."""
    if clean * corrupt <= 0:
        return None
    prefer, other = ("answer", "distractor") if clean > 0 else ("distractor", "answer")
    return (
        f"{prompts} both prefer the {prefer} (mean logit difference "
        f"{clean:.3g} and {corrupt:.3g}, the same sign): {measures} are shares of the "
        f"{clean - corrupt:.3g} between them and can exceed 1 or fall below 0; corrupted "
        "prompts that remove what the answer depends on (so that they score the answer and the "
        f"distractor alike, or prefer the {other}) give {measures} from 0 to 1"
    )


def _empty(lm: LoadedModel) -> torch.Tensor:
    return torch.full(
        (lm.n_layers, max(lm.layout.heads_per_layer)), float("nan"), dtype=torch.float64
    )


POSITIONS = ("all", "last")


def parse_position(position: str | int | None) -> int | None:
    """``"all"``/``None`` -> ``None`` (every position); ``"last"`` -> ``-1``; an int as is."""
    if position is None or position == "all":
        return None
    if position == "last":
        return -1
    if isinstance(position, int) and not isinstance(position, bool):
        return position
    raise InputError(f"position must be 'all', 'last' or a token index, got {position!r}")
