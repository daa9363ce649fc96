"""Interrupt and resume a role measurement: the sums so far, saved every few batches.

A checkpoint holds, for each pass over a corpus (treebank, GAP, induction sequences), how many
of this process's batches are done, their sums (float64, bit for bit) and the per-batch counts
of examples left out; and a fingerprint of everything the sums depend on: the options, the
model (name, configuration, every parameter's name, shape, dtype and float64 sum), the data
and the ranks. The same arguments resume where the file left off, and since the batches are
the same and are added in the same order, the result is the one an uninterrupted run gives,
to the bit. A file from other arguments is refused.

Under ``torchrun`` each rank keeps its own file (``FILE.rank1-of-2``...): its sums and its place
in its own share of the batches, independent of the other ranks'.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from headlab.errors import InputError
from headlab.outputs import write_bytes_atomic
from headlab.roles.bootstrap import Sums

FORMAT = "headlab-roles-checkpoint"
VERSION = 1


@dataclass
class Stage:
    """One pass over a corpus: its sums, the examples its batches left out (``counts``, by
    reason), and how many of this process's batches are done."""

    name: str
    sums: Sums
    counts: Counter[str] = field(default_factory=Counter)
    done: int = 0


class Checkpoint:
    """Saves stages to ``path`` every ``every`` batches (atomically), and restores them.

    Args:
        path: the checkpoint file (under ``torchrun``, each rank adds ``.rankR-of-W``).
        every: save after this many batches of this process.
    """

    def __init__(self, path: str | Path, *, every: int = 50) -> None:
        if every < 1:
            raise InputError(f"--checkpoint-every must be 1 or more, got {every}")
        self.base = Path(path)
        self.every = every
        self.path = self.base
        self.fingerprint = ""
        self._saved: dict[str, dict[str, Any]] = {}
        self._stages: dict[str, Stage] = {}
        self._since = 0

    def open(self, fingerprint: str, part: tuple[int, int] = (0, 1)) -> None:
        """Read the file for this rank, if there is one; refuse one from other arguments."""
        rank, world = part
        if world > 1:
            self.path = self.base.with_name(f"{self.base.name}.rank{rank}-of-{world}")
        self.fingerprint = fingerprint
        if not self.path.exists():
            return
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise InputError(
                f"checkpoint {self.path} cannot be read ({type(exc).__name__}); delete it to "
                "start over"
            ) from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise InputError(f"{self.path} is not a headlab roles checkpoint")
        if state.get("version") != VERSION or state.get("fingerprint") != fingerprint:
            raise InputError(
                f"checkpoint {self.path} was saved by a run with other arguments, model or data; "
                "rerun with those, or delete it to start over"
            )
        self._saved = state["stages"]

    def begin(self, stage: Stage) -> None:
        """Restore ``stage`` from the file (when it holds it); from now on it is saved too."""
        self._stages[stage.name] = stage
        saved = self._saved.get(stage.name)
        if saved is None:
            return
        stage.done = int(saved["done"])
        stage.counts = Counter({k: int(v) for k, v in saved["counts"].items()})
        stage.sums.values = {k: v.to(stage.sums.device) for k, v in saved["values"].items()}

    def after_batch(self, stage: Stage) -> Callable[[], None]:
        """What a pass calls after each batch of ``stage``: counts it, and saves when due."""

        def done() -> None:
            stage.done += 1
            self._since += 1
            if self._since >= self.every:
                self.save()

        return done

    def save(self) -> None:
        """Write every stage begun so far to the file, atomically."""
        self._since = 0
        stages = {
            name: {
                "done": s.done,
                "counts": dict(s.counts),
                "values": {k: v.cpu() for k, v in s.sums.gather().values.items()},
            }
            for name, s in self._stages.items()
        }
        state = {
            "format": FORMAT,
            "version": VERSION,
            "fingerprint": self.fingerprint,
            "stages": stages,
        }
        buf = io.BytesIO()
        torch.save(state, buf)
        write_bytes_atomic(self.path, buf.getvalue())

    def remove(self) -> None:
        """Delete this rank's file (the run it was for is complete)."""
        self.path.unlink(missing_ok=True)


def fingerprint(
    lm: Any,
    treebank: Sequence[Any],
    gap: Any,
    frequencies: Counter[str],
    options: Any,
    part: tuple[int, int],
) -> str:
    """A hash of everything a checkpoint's sums depend on (see the module's docstring)."""
    h = hashlib.sha256()

    def add(value: Any) -> None:
        h.update(json.dumps(value, sort_keys=True, default=str).encode())
        h.update(b"\0")

    add(["options", asdict(options), "part", list(part), "device", str(lm.device)])
    add(["bootstrap over documents"])  # sums of the item-level bootstrap do not resume here
    config = lm.model.config.to_json_string(use_diff=False)
    add(["model", lm.name, config])
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            total = None if p.device.type == "meta" else float(p.sum(dtype=torch.float64))
            add([name, list(p.shape), str(p.dtype), total])
    for s in treebank:
        add([s.words, s.heads, s.relations, s.doc_id or s.sent_id])  # documents: folds, bootstrap
    if gap is not None:
        for e in gap.examples:
            add([e.text, e.pronoun, e.candidates, e.answer, e.source or e.id])
    add(sorted(frequencies.items()))
    return h.hexdigest()
