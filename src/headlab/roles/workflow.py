"""A roles run as ``headlab roles`` and ``headlab report`` both make it: the gold inputs (files
given or the bundled samples), the folds by default, the measurement, and the run kept where
``headlab serve`` looks for it.

``headlab roles`` is a :class:`RolesRequest` (its gold data read and checked before the model
loads), the model, :meth:`RolesRequest.run`, :func:`keep_roles`, and the report printed.

Example:
    >>> from headlab.models import load
    >>> from headlab.roles.workflow import RolesRequest, keep_roles
    >>> request = RolesRequest(limit=50)  # the bundled UD EWT, GAP and frequency samples
    >>> report = request.run(load())
    >>> keep_roles(report.to_json())  # None, or why the cache could not be written
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from headlab.cache import cached_roles_path
from headlab.datasets import read_frequencies, read_gap, read_treebank, sample_path
from headlab.datasets.gap import GapData
from headlab.datasets.treebank import TreebankData
from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.models.seq2seq import text_side
from headlab.outputs import write_text_atomic
from headlab.progress import NO_PROGRESS, Progress
from headlab.roles.checkpoint import Checkpoint
from headlab.roles.folds import default_reliability, no_folds_reason
from headlab.roles.measure import RoleOptions, RoleReport, measure_roles

#: bootstrap resamples: each costs memory per head; 100,000 is far past where estimates settle
MAX_REPLICATES = 100_000


@dataclass(frozen=True, kw_only=True)
class GoldInputs:
    """What a roles run measures on.

    Attributes:
        treebank: the gold sentences (positional, delimiter, broad, rare-token, syntactic).
        gap: GAP rows for the coreference probe, or ``None`` (skipped).
        frequencies: word counts for the rare-token probe.
        folds: document folds to assign roles on too (0: none).
        folds_off: why folds are off by default (``None`` when they are on or were chosen).
    """

    treebank: TreebankData
    gap: GapData | None
    frequencies: Counter[str]
    folds: int
    folds_off: str | None


def read_gold(
    *,
    treebank: str | Path | None = None,
    gap: str | Path | None = None,
    no_gap: bool = False,
    frequencies: str | Path | None = None,
    limit: int | None = None,
    reliability: int | None = None,
) -> GoldInputs:
    """The gold inputs of a roles run: each file given, else its bundled sample (UD English EWT
    dev, GAP development, UD EWT train's word counts); ``limit`` sentences and GAP rows at most.
    ``reliability``: folds of whole documents (``None``: 5 when every data set has 5
    documents, else 0).

    Raises:
        InputError: a bad limit or fold count, a file that cannot be read.
        DataFormatError: a file that is not what it should be.
    """
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be at least 1, got {limit}")
    gold = read_treebank(treebank or sample_path("treebank"), limit=limit)
    rows = None if no_gap else read_gap(gap or sample_path("gap"), limit=limit)
    counts = read_frequencies(frequencies or sample_path("frequencies"))
    examples = None if rows is None else rows.examples
    folds_off = None
    if reliability is None:  # by default, when the data has enough documents for 5 folds
        folds_off = no_folds_reason(gold.sentences, examples)
        reliability = default_reliability(gold.sentences, examples)
    if reliability == 1:
        raise InputError("--reliability needs at least 2 folds (or 0 for none)")
    return GoldInputs(
        treebank=gold, gap=rows, frequencies=counts, folds=reliability, folds_off=folds_off
    )


def roles_dtype(dtype: str, bf16: bool = False) -> str:
    """The dtype a roles run loads its model in: ``bf16`` (``--bf16``) is ``bfloat16`` (the
    model and q k^T in bfloat16, softmax and statistics in float32).

    Raises:
        InputError: ``bf16`` with a dtype other than float32 (the default) or bfloat16.
    """
    if not bf16:
        return dtype
    if dtype not in ("float32", "bfloat16"):
        raise InputError(f"--bf16 is --dtype bfloat16; it contradicts --dtype {dtype}")
    return "bfloat16"


def run_roles(
    lm: LoadedModel,
    gold: GoldInputs,
    *,
    replicates: int = 100,
    seed: int = 0,
    batch_tokens: int = 4096,
    checkpoint: Checkpoint | None = None,
    progress: Progress | None = None,
) -> RoleReport:
    """Measure every head of ``lm`` on ``gold`` (:func:`~headlab.roles.measure.measure_roles`).

    Raises:
        InputError: ``replicates`` out of range.
    """
    if not 0 <= replicates <= MAX_REPLICATES:
        raise InputError(f"--replicates must be 0 to {MAX_REPLICATES:,}, got {replicates}")
    return measure_roles(
        lm,
        gold.treebank,
        gap=gold.gap,
        frequencies=gold.frequencies,
        options=RoleOptions(
            replicates=replicates, reliability=gold.folds, seed=seed, batch_tokens=batch_tokens
        ),
        checkpoint=checkpoint,
        progress=progress,
    )


@dataclass(frozen=True, kw_only=True)
class RolesRequest:
    """What ``headlab roles`` is asked, its fields named as the command's flags; checked on
    creation (:meth:`check`: the gold data read, before any model loads).

    Attributes:
        treebank, gap, no_gap, frequencies, limit, reliability: the gold data, as
            :func:`read_gold` takes them.
        replicates, seed, batch_tokens: as :func:`run_roles` takes them.
        checkpoint, checkpoint_every: save the sums to this file every so many batches and
            resume from it (:class:`~headlab.roles.checkpoint.Checkpoint`; :meth:`finish`
            deletes it once the result is out).
    """

    treebank: str | Path | None = None
    gap: str | Path | None = None
    no_gap: bool = False
    frequencies: str | Path | None = None
    limit: int | None = None
    reliability: int | None = None
    replicates: int = 100
    seed: int = 0
    batch_tokens: int = 4096
    checkpoint: str | Path | None = None
    checkpoint_every: int = 50

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Read the gold data (a bad file or limit costs no model load) and check the
        numbers.

        Raises:
            InputError, DataFormatError: as :func:`read_gold`; ``replicates`` out of range.
        """
        self.gold  # noqa: B018 (read now, kept for the run)
        if not 0 <= self.replicates <= MAX_REPLICATES:
            raise InputError(f"--replicates must be 0 to {MAX_REPLICATES:,}, got {self.replicates}")
        self.checkpoint_file  # noqa: B018

    @cached_property
    def gold(self) -> GoldInputs:
        """The gold data the request names, read once."""
        return read_gold(
            treebank=self.treebank,
            gap=self.gap,
            no_gap=self.no_gap,
            frequencies=self.frequencies,
            limit=self.limit,
            reliability=self.reliability,
        )

    @cached_property
    def checkpoint_file(self) -> Checkpoint | None:
        """The checkpoint the run saves to and resumes from (``None``: none asked for)."""
        if self.checkpoint is None:
            return None
        return Checkpoint(self.checkpoint, every=self.checkpoint_every)

    def run(self, lm: LoadedModel, progress: Progress = NO_PROGRESS) -> RoleReport:
        """Every head of ``lm`` (an encoder-decoder's encoder: roles are measured on text)
        scored and classified on the gold data."""
        return run_roles(
            text_side(lm),
            self.gold,
            replicates=self.replicates,
            seed=self.seed,
            batch_tokens=self.batch_tokens,
            checkpoint=self.checkpoint_file,
            progress=progress,
        )

    def finish(self) -> None:
        """The result is out: the checkpoint has served, delete it."""
        if self.checkpoint_file is not None:
            self.checkpoint_file.remove()


def keep_roles(data: dict[str, Any]) -> str | None:
    """Keep a roles run (``RoleReport.to_json()``) as its model's cached run, the one
    ``headlab serve`` shows beside each head, written atomically. Every command that measures
    roles (``headlab roles``, ``headlab report``) keeps its run. Returns ``None``, or a note
    saying why the cache could not be written (that costs the note, not the run)."""
    path = cached_roles_path(str(data["model"]))
    try:
        write_text_atomic(path, json.dumps(data) + "\n")
    except OSError as exc:
        return f"cannot keep this run for headlab serve at {path} ({exc.strerror or exc})"
    return None
