"""Path patching: how much of a behaviour travels from one head to another (Wang et al. 2022,
Appendix B; Goldowsky-Dill et al. 2023).

Activation patching says a head matters; path patching says through which reader. For a sender
head ``s`` and a receiver (a later head's queries, keys or values, or the logits):

1. run the clean prompt with ``s``'s output from the corrupted run and every other head's
   output frozen at its clean value (MLPs and norms recomputed): the corrupted information can
   travel from ``s`` only through the residual stream and the MLPs, never through another head;
   record what the receiver reads there (its query, key or value projection, or the logits);
2. run the clean prompt with only the receiver's input replaced by that recording.

The effect, normalized as in :mod:`headlab.causal.patching`, is the share of the logit
difference the path ``s -> receiver`` carries::

    effect = (LD_clean - LD_path) / (LD_clean - LD_corrupt)

With the logits as receiver, step 2 is step 1's own output: the sender's *direct* effect
(through the MLPs above it too). Every sender below the receiver goes at once: the heads of one
layer are copies on the batch axis, each layer's copies run from its clean residual upward, as
in activation patching. Under GQA a key or value receiver is a KV head (its projection's
columns feed every query head of its group).

Shape vocabulary: ``N`` copies, ``B`` prompts, ``T`` tokens, ``L`` layers, ``H`` heads.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import torch

from headlab.causal import table
from headlab.causal.activation import _runs
from headlab.causal.metric import (
    MAX_ROWS,
    _check_layers,
    _normalize,
    _positions,
    batched,
    check_task,
    last_logits,
    logit_difference,
)
from headlab.causal.tasks import Batch, Task
from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.models.patching import (
    ColumnSwap,
    HeadPatch,
    OutputPatch,
    OutputRecord,
    Swap,
    kv_columns,
    starting_at,
)
from headlab.progress import NO_PROGRESS, Progress, stage

RECEIVER_KINDS = ("q", "k", "v", "logits")


@dataclass(frozen=True)
class Receiver:
    """What a path ends in: ``kind`` ``q`` (a query head's queries), ``k``/``v`` (a KV head's
    keys or values) or ``logits``; ``layer`` and ``head`` (unused for the logits)."""

    kind: str
    layer: int = -1
    head: int = -1

    @property
    def name(self) -> str:
        return "logits" if self.kind == "logits" else f"{self.kind}:{self.layer}.{self.head}"


def parse_receiver(text: str) -> Receiver:
    """``"logits"``, or ``"q:23.3"`` / ``"k:17.1"`` / ``"v:17.1"`` (layer.head; a KV head for
    keys and values)."""
    if text == "logits":
        return Receiver("logits")
    match = re.fullmatch(r"([qkv]):(\d+)\.(\d+)", text.strip())
    if match is None:
        raise InputError(
            f"a receiver is logits or q|k|v:LAYER.HEAD (e.g. q:23.3, k:17.1), got {text!r}"
        )
    return Receiver(match.group(1), int(match.group(2)), int(match.group(3)))


def parse_head(text: str) -> tuple[int, int]:
    """``"16.0"`` -> ``(16, 0)``."""
    match = re.fullmatch(r"(\d+)\.(\d+)", text.strip())
    if match is None:
        raise InputError(f"a head is LAYER.HEAD (e.g. 16.0), got {text!r}")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True, kw_only=True)
class PathResult:
    """The share of the behaviour each sender's path to one receiver carries.

    Shape:
        effects: ``(L, H)`` float64, NaN for heads that are not senders.
    """

    model: str
    task: str
    receiver: str
    n_prompts: int
    clean: float
    corrupt: float
    effects: torch.Tensor
    seconds: float = 0.0

    def ranked(self) -> list[tuple[int, int, float]]:
        """``(layer, head, value)`` by decreasing absolute value, signed."""
        return table.ranked(self.effects)

    def top(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The ``k`` heads of largest absolute value, ``(layer, head, value)``, signed."""
        return table.top(self.effects, k)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "task": self.task,
            "method": "path",
            "receiver": self.receiver,
            "n_prompts": self.n_prompts,
            "metric": {"clean": self.clean, "corrupt": self.corrupt, "unit": "logit difference"},
            "seconds": round(self.seconds, 3),
            "senders": [
                {"layer": layer, "head": head, "effect": value}
                for layer, row in enumerate(self.effects.tolist())
                for head, value in enumerate(row)
                if value == value
            ],
        }


def _check_receiver(lm: LoadedModel, receiver: Receiver) -> None:
    if receiver.kind not in RECEIVER_KINDS:
        raise InputError(f"receiver kind must be one of {', '.join(RECEIVER_KINDS)}")
    if receiver.kind == "logits":
        return
    if not 0 <= receiver.layer < lm.n_layers:
        raise InputError(
            f"receiver {receiver.name}: layer must be in 0..{lm.n_layers - 1} for {lm.name}"
        )
    count = (
        lm.layout.heads_per_layer[receiver.layer]
        if receiver.kind == "q"
        else lm.layout.kv_heads_per_layer[receiver.layer]
    )
    what = "query heads" if receiver.kind == "q" else "KV heads"
    if not 0 <= receiver.head < count:
        raise InputError(
            f"receiver {receiver.name}: layer {receiver.layer} has {what} 0..{count - 1}"
        )
    if receiver.layer == 0:
        raise InputError(f"receiver {receiver.name}: no head sends to layer 0")


def path_patching(
    lm: LoadedModel,
    task: Task,
    receiver: Receiver,
    *,
    senders: list[tuple[int, int]] | None = None,
    position: int | None = None,
    max_rows: int = MAX_ROWS,
    progress: Progress | None = None,
) -> PathResult:
    """The share of the behaviour each sender head's path to ``receiver`` carries.

    Args:
        senders: ``(layer, head)`` pairs (default: every head below the receiver's layer; every
            head for the logits).
        position: patch the sender at this position only (``-1``: the last); ``None`` every one.
    """
    check_task(lm, task)
    _check_receiver(lm, receiver)
    top = lm.n_layers if receiver.kind == "logits" else receiver.layer
    if senders is None:
        senders = [(la, h) for la in range(top) for h in range(lm.layout.heads_per_layer[la])]
    by_layer: dict[int, list[int]] = {}
    for layer, head in senders:
        _check_layers(lm, [layer])
        if layer >= top:
            raise InputError(
                f"sender {layer}.{head} is not below receiver {receiver.name}: a path runs upward"
            )
        if not 0 <= head < lm.layout.heads_per_layer[layer]:
            raise InputError(f"sender {layer}.{head}: layer {layer} has no head {head}")
        by_layer.setdefault(layer, []).append(head)
    module: Any = None
    columns: list[slice] = []
    if receiver.kind != "logits":
        try:
            module, columns = kv_columns(lm, receiver.layer, receiver.kind)
        except ValueError as exc:
            raise InputError(f"receiver {receiver.name}: {exc}") from None
    progress = progress or NO_PROGRESS
    start = time.perf_counter()
    patched = torch.full((lm.n_layers, max(lm.layout.heads_per_layer)), float("nan"))
    patched = patched.double()
    for layer, heads in by_layer.items():
        patched[layer, heads] = 0.0
    clean_sum = corrupt_sum = 0.0
    noun = "sender" if len(senders) == 1 else "senders"
    label, total, unit = batched("path patching", len(senders), len(task.batches), noun)
    with torch.inference_mode(), stage(progress, label, total, unit) as bar:
        for batch in task.batches:
            batch = batch.to(lm.device)
            where = _positions(position, batch.clean.shape[1])
            runs = _runs(lm, batch)
            clean_sum += float(runs.clean_ld.sum())
            corrupt_sum += float(runs.corrupt_ld.sum())
            per_pass = max(1, max_rows // batch.clean.shape[0])
            for layer, heads in sorted(by_layer.items()):
                for lo in range(0, len(heads), per_pass):
                    chosen = heads[lo : lo + per_pass]
                    ld = _path_ld(lm, batch, runs, layer, chosen, receiver, module, columns, where)
                    patched[layer, chosen] += ld.sum(dim=1).cpu()
                    bar.advance(len(chosen))
    n = task.n_prompts
    clean, corrupt = clean_sum / n, corrupt_sum / n
    return PathResult(
        model=lm.name,
        task=task.name,
        receiver=receiver.name,
        n_prompts=n,
        clean=clean,
        corrupt=corrupt,
        effects=_normalize(clean, corrupt, patched / n, task.name),
        seconds=time.perf_counter() - start,
    )


def _path_ld(
    lm: LoadedModel,
    batch: Batch,
    runs: Any,
    layer: int,
    chosen: list[int],
    receiver: Receiver,
    module: Any,
    columns: list[slice],
    where: torch.Tensor | None,
) -> torch.Tensor:
    """``(N, B)`` logit differences of the path from each of ``chosen`` (heads of ``layer``)."""
    copies = len(chosen)
    n_heads = lm.layout.heads_per_layer[layer]
    ids = batch.clean.repeat(copies, 1)  # (N*B, T)
    hidden = runs.residuals[layer].repeat(copies, 1, 1)  # (N*B, T, E)
    select = torch.zeros(copies, n_heads, dtype=torch.bool)
    select[torch.arange(copies), chosen] = True
    swaps: dict[int, list[Swap]] = {
        layer: [Swap(source=runs.corrupt_heads[layer], select=select, positions=where)]
    }
    for above in range(layer + 1, lm.n_layers):  # every other head frozen at its clean output
        frozen = torch.ones(copies, lm.layout.heads_per_layer[above], dtype=torch.bool)
        swaps[above] = [Swap(source=runs.clean_heads[above], select=frozen)]
    answer, distractor = batch.answer.repeat(copies), batch.distractor.repeat(copies)
    if receiver.kind == "logits":
        with starting_at(lm, layer, hidden), HeadPatch(lm, swaps):
            logits = last_logits(lm, ids)
        return logit_difference(logits, answer, distractor).view(copies, -1)
    with (
        starting_at(lm, layer, hidden),
        HeadPatch(lm, swaps),
        OutputRecord([module]) as seen,
    ):
        last_logits(lm, ids)  # step 1: what the receiver reads with only the sender corrupted
    mask = torch.zeros(copies, seen.outputs[module].shape[-1], dtype=torch.bool)
    mask[:, columns[receiver.head]] = True
    swap = ColumnSwap(source=seen.outputs[module], columns=mask, per_copy=True)
    top_hidden = runs.residuals[receiver.layer].repeat(copies, 1, 1)
    with starting_at(lm, receiver.layer, top_hidden), OutputPatch({module: swap}):
        logits = last_logits(lm, ids)  # step 2: the clean run with only that input patched
    return logit_difference(logits, answer, distractor).view(copies, -1)
