"""What ``headlab report`` was asked for, checked before any model is loaded: the files given,
the output folder, the held-out text, the viewer's word, and what to measure.

Example:
    >>> from headlab.report.request import ReportRequest, check_request
    >>> from headlab.models import load
    >>> from headlab.roles.workflow import read_gold
    >>> request = ReportRequest(roles_only=True)
    >>> inputs = check_request(request)  # the files read, the folder free to write
    >>> built = build_requested(request, load(), read_gold(), inputs)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.models.names import resolve
from headlab.models.seq2seq import text_side
from headlab.outputs import check_files, check_output, write_text_atomic
from headlab.progress import Progress
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
from headlab.roles.workflow import GoldInputs


@dataclass(frozen=True, kw_only=True)
class ReportRequest:
    """The options of ``headlab report`` (each named as its flag).

    Attributes:
        model: the model asked for (``None``: the default encoder).
        replicates: bootstrap resamples of the roles.
        out: the output folder (``None``: :func:`~headlab.report.build.default_folder`).
        sentence: the viewer's own sentences; ``word``: the word it opens on.
        prune, text, full, roles_only: what to measure (:attr:`measure`); ``text`` is the
            held-out text of a causal model's pruning curve.
        pruning, experiment, cost, patch, circuit: results given as files.
        ledger_md: where a Markdown copy of the ledger goes (:func:`write_ledger`).
    """

    model: str | None = None
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

    @property
    def folder(self) -> str:
        """Where the report goes."""
        return self.out or default_folder(self.model)

    @property
    def measure(self) -> str:
        """What :func:`~headlab.report.build.build_report` measures (:func:`measure_mode`)."""
        return measure_mode(full=self.full, prune=self.prune, roles_only=self.roles_only)

    def ready_model(self, load: Callable[[bool], LoadedModel]) -> tuple[LoadedModel, Any]:
        """The model to measure, loaded by ``load(with_lm_head)`` once (an encoder-decoder's
        encoder, as roles measure it), with its language-model head when ``prune`` measures a
        decoder's perplexity (the catalogue tells before loading); and the options of that
        perplexity curve, checked on the text before any measurement (else ``None``).

        Raises:
            InputError: the perplexity text cannot be read or cut into windows.
        """
        head = self.prune and bool(resolve(self.model).causal)
        lm = text_side(load(head))
        if self.prune and lm.causal and not head:  # only the loaded model could tell
            lm = text_side(load(True))
        options = causal_prune_options(lm, self.text) if self.prune and lm.causal else None
        return lm, options

    def viewer(self, causal: bool, gold: GoldInputs | None = None) -> tuple[list[str], str]:
        """The viewer's own sentences and the word it opens on, for a causal model or an
        encoder, the word checked to be in one of them or of ``gold``'s treebank sentences
        shown beside them (:func:`~headlab.report.build.treebank_sentences`).

        Raises:
            InputError: no sentence has the word.
        """
        sentences, word = viewer_sentences(causal, list(self.sentence), self.word)
        beside = treebank_sentences(gold) if gold is not None else []
        check_focus_word(word, [*sentences, *beside])
        return sentences, word


def check_request(request: ReportRequest, gold: GoldInputs | None = None) -> ReportInputs:
    """The files given, read and checked, and the output folder checked to be free (or a
    report, replaced): all before any model is loaded. The default encoder's viewer word is
    checked here too, in its sentences and ``gold``'s treebank sentences beside them (another
    model's sentences are known once it is loaded).

    Raises:
        InputError: a file that is not its command's JSON, ``text`` without ``prune``, a word
            in none of the sentences, a ``ledger_md`` that cannot be written.
        OutputExistsError, OutputError: a folder headlab may not replace, or cannot write.
    """
    inputs = read_inputs(
        pruning=request.pruning,
        experiments=list(request.experiment),
        cost=request.cost,
        patch=request.patch,
        circuit=request.circuit,
    )
    if request.text is not None and not request.prune:
        raise InputError("--text is the held-out text of --prune's perplexity curve: add --prune")
    if request.model is None:  # the default encoder: check the word before any work
        request.viewer(causal=False, gold=gold)
    check_output(request.folder, overwrite=request.overwrite, kind=KIND, replace_kind=True)
    check_files([("--ledger-md", request.ledger_md, None)])
    return inputs


def build_requested(
    request: ReportRequest,
    lm: LoadedModel,
    gold: GoldInputs,
    inputs: ReportInputs,
    *,
    prune_options: Any = None,
    progress: Progress | None = None,
) -> Built:
    """:func:`~headlab.report.build.build_report` as ``request`` asks: into its folder, with
    its viewer sentences and word (checked first, now that the model's sentences are known),
    its resamples and what it measures.

    Raises:
        InputError: the viewer's word is in none of its sentences; what the build raises.
    """
    sentences, word = request.viewer(lm.causal, gold)
    return build_report(
        lm,
        gold,
        inputs,
        out=request.folder,
        sentences=sentences,
        word=word,
        replicates=request.replicates,
        measure=request.measure,
        prune_options=prune_options,
        overwrite=request.overwrite,
        progress=progress,
    )


def write_ledger(folder: str | Path, path: str | Path) -> None:
    """Copy the Markdown ledger of the report in ``folder`` to ``path`` (atomically)."""
    write_text_atomic(path, (Path(folder) / "ledger.md").read_text(encoding="utf-8"))
