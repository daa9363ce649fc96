"""What ``headlab report`` was asked for (:class:`headlab.request.Request`), checked before any
model is loaded: the gold data, the files given, the output folder, the held-out text, the
viewer's word, and what to measure; then run on the loaded model.

Example:
    >>> from headlab.report.request import ReportRequest
    >>> from headlab.models import load
    >>> request = ReportRequest(roles_only=True, limit=50)  # checked: gold data read, folder free
    >>> built = request.run(request.ready(lambda head: load(with_lm_head=head)))
    >>> built.to_json()["index"]
    'headlab-report/index.html'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.models.names import resolve
from headlab.models.seq2seq import text_side
from headlab.outputs import check_files, check_output, write_text_atomic
from headlab.progress import NO_PROGRESS, Progress
from headlab.report.build import (
    Built,
    ReportInputs,
    build_report,
    causal_prune_options,
    check_focus_word,
    default_folder,
    measure_mode,
    read_inputs,
    treebank_sentences,
    viewer_sentences,
)
from headlab.report.folder import KIND
from headlab.roles.workflow import MAX_REPLICATES, GoldInputs, read_gold


@dataclass(frozen=True, kw_only=True)
class ReportRequest:
    """The options of ``headlab report`` (each named as its flag); checked on creation
    (:meth:`check`: the gold data and the files given read, the folder free to write).

    Attributes:
        model: the model asked for (``None``: the default encoder).
        treebank, gap, no_gap, limit, reliability: the gold data of the roles, as
            :func:`~headlab.roles.workflow.read_gold` takes them.
        replicates: bootstrap resamples of the roles.
        out: the output folder (``None``: :func:`~headlab.report.build.default_folder`).
        sentence: the viewer's own sentences; ``word``: the word it opens on.
        prune, text, full, roles_only: what to measure (:attr:`measure`); ``text`` is the
            held-out text of a causal model's pruning curve.
        pruning, experiment, cost, patch, circuit: results given as files.
        ledger_md: also write the ledger of the lesson's claims as Markdown to this file.
    """

    model: str | None = None
    treebank: str | Path | None = None
    gap: str | Path | None = None
    no_gap: bool = False
    limit: int | None = None
    reliability: int | None = None
    replicates: int = 100
    out: str | None = None
    overwrite: bool = False
    sentence: tuple[str, ...] = ()
    word: str | None = None
    prune: bool = False
    text: str | None = None
    full: bool = False
    roles_only: bool = False
    pruning: str | None = None
    experiment: tuple[str, ...] = ()
    cost: str | None = None
    patch: str | None = None
    circuit: str | None = None
    ledger_md: str | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """The files given, read and checked, the output folder checked to be free (or a
        report, replaced), and the gold data read: all before any model is loaded. The
        default encoder's viewer word is checked here too (another model's sentences are
        known once it is loaded).

        Raises:
            InputError: a file that is not its command's JSON, ``text`` without ``prune``, a
                word in none of the sentences, ``replicates`` out of range, gold data that
                cannot be read (as :func:`~headlab.roles.workflow.read_gold`).
            DataFormatError: a gold-data file that is not what it should be.
            OutputExistsError: a folder headlab may not replace.
        """
        self.inputs  # noqa: B018 (read now, kept for the run)
        if self.text is not None and not self.prune:
            raise InputError(
                "--text is the held-out text of --prune's perplexity curve: add --prune"
            )
        if not 0 <= self.replicates <= MAX_REPLICATES:
            raise InputError(f"--replicates must be 0 to {MAX_REPLICATES:,}, got {self.replicates}")
        check_output(self.folder, overwrite=self.overwrite, kind=KIND, replace_kind=True)
        check_files([("--ledger-md", self.ledger_md, None)])
        self.gold  # noqa: B018
        if self.model is None:  # the default encoder: check the word before any work
            self.viewer(causal=False)  # in its sentences and the treebank's shown beside them

    @cached_property
    def inputs(self) -> ReportInputs:
        """The results given as files, read once."""
        return read_inputs(
            pruning=self.pruning,
            experiments=list(self.experiment),
            cost=self.cost,
            patch=self.patch,
            circuit=self.circuit,
        )

    @cached_property
    def gold(self) -> GoldInputs:
        """The gold data of the roles, read once (``frequencies``: the bundled counts)."""
        return read_gold(
            treebank=self.treebank,
            gap=self.gap,
            no_gap=self.no_gap,
            limit=self.limit,
            reliability=self.reliability,
        )

    @property
    def folder(self) -> str:
        """Where the report goes."""
        return self.out or default_folder(self.model)

    @property
    def measure(self) -> str:
        """What :func:`~headlab.report.build.build_report` measures (:func:`measure_mode`)."""
        return measure_mode(full=self.full, prune=self.prune, roles_only=self.roles_only)

    def ready(self, load: Callable[[bool], LoadedModel]) -> LoadedModel:
        """The model to measure, loaded by ``load(with_lm_head)`` once (an encoder-decoder's
        encoder, as roles measure it), with its language-model head when ``prune`` measures a
        decoder's perplexity (the catalogue tells before loading)."""
        head = self.prune and bool(resolve(self.model).causal)
        lm = text_side(load(head))
        if self.prune and lm.causal and not head:  # only the loaded model could tell
            lm = text_side(load(True))
        return lm

    def viewer(self, causal: bool) -> tuple[list[str], str]:
        """The viewer's own sentences and the word it opens on, for a causal model or an
        encoder, the word checked to be in one of them or of the gold data's treebank
        sentences shown beside them (:func:`~headlab.report.build.treebank_sentences`).

        Raises:
            InputError: no sentence has the word.
        """
        sentences, word = viewer_sentences(causal, list(self.sentence), self.word)
        check_focus_word(word, [*sentences, *treebank_sentences(self.gold)])
        return sentences, word

    def run(self, lm: LoadedModel, progress: Progress = NO_PROGRESS) -> Built:
        """:func:`~headlab.report.build.build_report` as asked: the perplexity text of a
        causal model's ``prune`` and the viewer's word checked first (now that the model's
        sentences are known), then the report written into :attr:`folder` with its
        sentences, resamples and what it measures, and the ledger copied to ``ledger_md``.

        Raises:
            InputError: the perplexity text cannot be read or cut into windows; the viewer's
                word is in none of its sentences; what the build raises.
        """
        options = causal_prune_options(lm, self.text) if self.prune and lm.causal else None
        sentences, word = self.viewer(lm.causal)
        built = build_report(
            lm,
            self.gold,
            self.inputs,
            out=self.folder,
            sentences=sentences,
            word=word,
            replicates=self.replicates,
            measure=self.measure,
            prune_options=options,
            overwrite=self.overwrite,
            progress=progress,
        )
        if self.ledger_md:
            write_ledger(built.out, self.ledger_md)
        return built


def write_ledger(folder: str | Path, path: str | Path) -> None:
    """Copy the Markdown ledger of the report in ``folder`` to ``path`` (atomically)."""
    write_text_atomic(path, (Path(folder) / "ledger.md").read_text(encoding="utf-8"))
