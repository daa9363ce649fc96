"""The build of ``headlab report``: its inputs read and checked before any measurement, the
output folder, the viewer's sentences and focus word, and the stages (roles, then what the
ledger of the lesson's claims needs, then the page).

Example:
    >>> from headlab.models import load
    >>> from headlab.report.build import ReportInputs, build_report
    >>> from headlab.roles.workflow import read_gold
    >>> out = build_report(load(), read_gold(), ReportInputs(), out="headlab-report")
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headlab.causal.patching import PatchingResult
from headlab.datasets.lesson import LESSON_SENTENCE, LESSON_WORD
from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.models.names import GGUF_MODELS
from headlab.models.words import find_word, split_words
from headlab.progress import Prefixed, Progress
from headlab.pruning.workflow import PruneOptions, build_metrics, read_pruning_json
from headlab.report.decoder import (
    DECODER_FOCUS,
    DECODER_PROMPT,
    ENCODER_FOLDER,
    REPEAT_PROMPT,
    decoder_folder,
)
from headlab.report.folder import write_report
from headlab.report.full import measure_extras
from headlab.roles.results import RoleReport
from headlab.roles.workflow import GoldInputs, keep_roles, run_roles

#: viewer sentences taken from the treebank besides the lesson's (6 to 25 words each)
TREEBANK_SENTENCES = 4


@dataclass(frozen=True, kw_only=True)
class ReportInputs:
    """Results given as files instead of measured (each read and checked by
    :func:`read_inputs`): a pruning curve, one-vs-many experiments, the cost of heads, a
    patching result, a circuit."""

    pruning: dict[str, Any] | None = None
    experiments: list[dict[str, Any]] = field(default_factory=list)
    cost: dict[str, Any] | None = None
    patching: dict[str, Any] | None = None
    circuit: dict[str, Any] | None = None


#: what the report draws of ``headlab circuit --json``
CIRCUIT_KEYS = (
    "model",
    "task",
    "edges_total",
    "circuit",
    "nodes",
    "edges",
    "classes",
    "group_size",
)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def read_json(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path``; a one-line error naming ``what`` otherwise."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise InputError(f"cannot read {what} {path}: JSON nested too deeply") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise InputError(f"cannot read {what} {path}: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{what} {path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_inputs(
    *,
    pruning: str | None = None,
    experiments: list[str] | None = None,
    cost: str | None = None,
    patch: str | None = None,
    circuit: str | None = None,
) -> ReportInputs:
    """The files given to ``headlab report``, read and checked whole before any measurement.

    Raises:
        InputError: a file that cannot be read or is not the JSON of its command.
    """
    read_pruning = None
    if pruning:
        read_pruning = read_pruning_json(read_json(pruning, "pruning result"), pruning)
    runs = [read_json(f, "experiment result") for f in experiments or []]
    for path, experiment in zip(experiments or [], runs, strict=True):
        if not isinstance(experiment.get("summary", []), list):
            raise InputError(f"{path}: expected the JSON of headlab experiment")
    read_cost = read_json(cost, "cost result") if cost else None
    patching = read_json(patch, "patching result") if patch else None
    if patching is not None:
        PatchingResult.from_json(patching, patch or "")
    if read_cost is not None and not isinstance(read_cost.get("rows"), list):
        raise InputError(f"{cost}: expected the JSON of headlab experiment cost --json")
    read_circuit = read_json(circuit, "circuit result") if circuit else None
    if read_circuit is not None:
        missing = [k for k in CIRCUIT_KEYS if k not in read_circuit]
        if read_circuit.get("schema") != "headlab.circuit/1" or missing:
            raise InputError(
                f"{circuit}: expected the JSON of headlab circuit --json (schema "
                f"headlab.circuit/1{', missing ' + ', '.join(missing) if missing else ''})"
            )
    return ReportInputs(
        pruning=read_pruning,
        experiments=runs,
        cost=read_cost,
        patching=patching,
        circuit=read_circuit,
    )


def check_models(inputs: ReportInputs, model: str) -> None:
    """A one-line error for a file given to the report that was measured on another model
    than the report's.

    Raises:
        InputError: the first such file, with both names.
    """
    given = {
        "--pruning": inputs.pruning,
        "--patch": inputs.patching,
        "--circuit": inputs.circuit,
    }
    for flag, data in given.items():
        if data is not None and data.get("model") != model:
            raise InputError(
                f"{flag}: measured on {data.get('model')!r}, the report is of {model!r}; "
                f"give the model with --model, or a result of {model!r}"
            )


def default_folder(model: str | None) -> str:
    """Where a report goes by default: a bundled decoder's page (headlab-report-KEY) beside the
    encoder's."""
    return decoder_folder(model) if model in GGUF_MODELS else ENCODER_FOLDER


def check_focus_word(word: str, sentences: list[str]) -> None:
    """The viewer opens on ``word`` in the first of ``sentences`` (its own and the treebank's
    beside them) that has it: refuse a word that none has, before any work.

    Raises:
        InputError: no sentence has the word (one message, however many sentences).
    """

    for sentence in sentences:
        words = [w for w, _, _ in split_words(sentence)]
        try:
            find_word(words, [False] * len(words), word)
            return
        except InputError:
            continue
    shown = "; ".join(repr(s if len(s) <= 40 else s[:39] + "\u2026") for s in sentences)
    raise InputError(
        f"--word {word!r} is in none of the viewer's {len(sentences)} sentence(s) ({shown}); "
        "give a word of one of them as written, or add a sentence that has it with --sentence"
    )


def treebank_sentences(gold: GoldInputs) -> list[str]:
    """The treebank's sentences the viewer shows beside its own (:data:`TREEBANK_SENTENCES`
    of 6 to 25 words)."""
    shown = [" ".join(s.words) for s in gold.treebank.sentences if 6 <= len(s.words) <= 25]
    return shown[:TREEBANK_SENTENCES]


def viewer_sentences(
    causal: bool, own: list[str] | None = None, word: str | None = None
) -> tuple[list[str], str]:
    """The viewer's own sentences and the word it opens on: the lesson's sentence at
    "prepared" for an encoder; for a decoder the IOI prompt at its last word, a repeated
    sentence (for induction heads), then the lesson's sentence, each of ``own`` between."""
    mine = list(own or [])
    if causal:
        return [DECODER_PROMPT, REPEAT_PROMPT, *mine, LESSON_SENTENCE], word or DECODER_FOCUS
    return [LESSON_SENTENCE, *mine], word or LESSON_WORD


def causal_prune_options(lm: LoadedModel, text: str | None) -> Any:
    """``headlab prune --curve``'s options for a causal model (perplexity on ``text``, or on the
    pruning library's default text), checked on the text before any measurement.

    Raises:
        InputError: the text cannot be read or cut into windows.
    """

    options = PruneOptions(metric="perplexity", text=None if text is None else Path(text))
    options.check()
    try:
        build_metrics(lm, options)  # reads and cuts the text: a missing one fails here
    except InputError as exc:
        why = f"cannot measure perplexity ({exc})" if text else "needs held-out text"
        raise InputError(
            f"--prune on a causal model {why}: give --text FILE, or give the curve as --pruning "
            "FILE (headlab prune --model MODEL --curve --json > FILE)"
        ) from None
    return options


def measure_mode(*, full: bool = False, prune: bool = False, roles_only: bool = False) -> str:
    """What :func:`build_report` measures for ``--full``, ``--prune`` and ``--roles-only``:
    ``"full"`` (``--full``, or ``--prune`` without ``--roles-only``), ``"curve"`` (both),
    ``"roles"`` (``--roles-only`` alone) or ``"quick"`` (none)."""
    if full or (prune and not roles_only):
        return "full"
    if roles_only:
        return "curve" if prune else "roles"
    return "quick"


@dataclass(frozen=True, kw_only=True)
class Built:
    """What :func:`build_report` made: the folder, the roles it measured, and a note when the
    roles could not be kept for ``headlab serve``."""

    out: Path
    roles: RoleReport
    note: str | None

    def to_json(self) -> dict[str, Any]:
        """The folder written, its page, and the roles measured (``headlab roles --json``)."""
        return {
            "folder": str(self.out),
            "index": str(self.out / "index.html"),
            "roles": self.roles.to_json(),
        }


def build_report(
    lm: LoadedModel,
    gold: GoldInputs,
    inputs: ReportInputs,
    *,
    out: str | Path,
    sentences: list[str] | None = None,
    word: str | None = None,
    replicates: int = 100,
    measure: str = "quick",
    prune_options: Any = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Built:
    """Measure the roles (kept for ``headlab serve``), what the ledger needs, and write the
    report to ``out``.

    ``sentences`` and ``word``: the viewer's (default :func:`viewer_sentences`); a few
    sentences of the treebank join them. ``measure``: ``"quick"`` (the default run: the
    lesson's claims at a quick size, about 25 s), ``"full"`` (``--full`` or ``--prune``: the
    pruning curve on all the data), ``"curve"`` (the roles and that curve alone) or
    ``"roles"`` (the roles alone). Files in ``inputs`` replace their measurement.
    """

    check_models(inputs, lm.name)
    default_sentences, default_word = viewer_sentences(lm.causal, word=word)
    sentences, word = sentences or default_sentences, word or default_word
    shown = [*sentences, *treebank_sentences(gold)]
    if measure not in ("quick", "full", "curve", "roles"):
        raise InputError(f"measure must be quick, full, curve or roles, got {measure!r}")
    stages = measure in ("quick", "full")
    roles = run_roles(
        lm,
        gold,
        replicates=replicates,
        progress=Prefixed(progress, "stage 1/4, roles") if stages else progress,
    )
    note = keep_roles(roles.to_json())  # headlab serve shows it
    pruning, cost, experiments = inputs.pruning, inputs.cost, list(inputs.experiments)
    if measure != "roles":
        given = {"pruning"} if pruning is not None else set()
        given |= {"cost"} if cost is not None else set()
        if any(e.get("task", "").startswith("binding") for e in experiments):
            given.add("experiment")
        if measure == "curve":  # --prune with --roles-only: the curve alone
            given |= {"cost", "experiment"}
        extras = measure_extras(
            lm,
            progress=progress,
            prune_options=prune_options,
            quick=measure == "quick",
            given=frozenset(given),
        )
        pruning = pruning or extras["pruning"]
        cost = cost or extras["cost"]
        if extras["experiment"] is not None:
            experiments.insert(0, extras["experiment"])
    folder = write_report(
        lm,
        roles,
        out,
        sentences=shown,
        focus_word=word,
        pruning=pruning,
        experiment=experiments[0] if experiments else None,
        experiments=experiments[1:],
        cost=cost,
        patching=inputs.patching,
        circuit=inputs.circuit,
        overwrite=overwrite,
        progress=progress,
    )
    return Built(out=folder, roles=roles, note=note)
