"""The requests of ``headlab patch`` and ``headlab compose``, checked before any work (the options
that go together, the output paths, a model that reads next-token logits, told from its name
and not loaded), and the runs they ask for.

``headlab patch`` builds a :class:`PatchRequest` (its checks run then), loads the model, draws
the prompts (:func:`patch_task`) and calls :func:`run_patch`: activation or gradient patching,
direct logit attribution, or path patching; or, with ``write``, the prompts written
(:class:`PromptsWritten`). ``headlab compose`` builds a
:class:`ComposeRequest` and calls :func:`run_compose`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headlab.causal.composition import (
    check_receivers,
    composition_scores,
    parse_heads,
    receiver_senders,
)
from headlab.causal.dla import direct_logit_attribution
from headlab.causal.figure import write_composition, write_heatmap
from headlab.causal.methods import method as patch_method
from headlab.causal.methods import names as method_names
from headlab.causal.metric import IG_STEPS
from headlab.causal.patching import as_task, parse_position, run_patching
from headlab.causal.paths import parse_head, parse_receiver, path_patching
from headlab.causal.tasks import read_prompts, write_prompts
from headlab.errors import InputError
from headlab.models.names import DECODER, resolve
from headlab.outputs import check_files, write_text_atomic
from headlab.progress import NO_PROGRESS, Progress

#: ``--method``'s default, the one path patching (``--to``) goes with
DEFAULT_METHOD = "activation"

if TYPE_CHECKING:
    from headlab.causal.composition import CompositionScores
    from headlab.causal.dla import DLAResult
    from headlab.causal.result import PatchingResult
    from headlab.causal.tasks import Task
    from headlab.models.loading import LoadedModel


def check_request(
    *,
    method: str,
    component: str = "z",
    source: str = "corrupt",
    compare: bool = False,
    to: str | None = None,
    path: str | None = None,
    prompts: str | None = None,
    write: str | None = None,
    figure: str | None = None,
    csv_out: str | None = None,
    csv: bool = False,
) -> None:
    """Check the output paths (``write``, ``figure``, ``csv_out``:
    :func:`headlab.outputs.check_files`) and
    that the options go together: a path-patching receiver ``to`` (and sender ``path``), the
    ``method`` and what its table entry (:mod:`headlab.causal.methods`) takes: a ``component``,
    a ``source``, a ``compare`` of a gradient estimate, a figure or CSV of every head.

    Raises:
        InputError: one line naming the option.
    """
    check_files(
        [("--write", write, ".jsonl"), ("--figure", figure, ".png"), ("--csv-out", csv_out, ".csv")]
    )
    chosen = patch_method(method)
    if write and prompts:
        raise InputError("--write writes a built-in task's prompts: give --task, not --prompts")
    if compare and not chosen.gradient and chosen.heads:
        gradients = " or ".join(method_names(lambda m: m.gradient))
        raise InputError(f"--compare compares a gradient estimate: add --method {gradients}")
    if path is not None and to is None:
        raise InputError("--path names a sender: add --to q|k|v:L.H or --to logits")
    if to is not None:
        parse_receiver(to)
        if path is not None:
            parse_head(path)
        if method != DEFAULT_METHOD or component != "z" or compare:
            raise InputError("--to is path patching: no --method, --component or --compare")
        if source != "corrupt":
            raise InputError("--to is path patching from the corrupted run: no --source")
    if not chosen.heads and (figure or csv_out or csv or compare):
        raise InputError(
            f"--method {method} gives a table or --json; no --figure, CSV or --compare"
        )
    if component not in chosen.components:
        takers = " or ".join(method_names(lambda m: component in m.components))
        raise InputError(f"--component {component} is patched by --method {takers} only")
    if source not in chosen.sources:
        takers = " or ".join(method_names(lambda m: source in m.sources))
        raise InputError(f"--source {source} is patched by --method {takers} only")
    if source != "corrupt" and component != "z":
        raise InputError(f"--source {source} replaces query heads' outputs: no --component")


def check_model(model: str, prompts: str | None = None) -> None:
    """Check, without loading it, that ``model`` is a causal language model with its head
    (where its name or folder tells), and read ``prompts`` (a malformed file costs no model
    load).

    Raises:
        InputError: a model that reads no next-token logits.
        DataFormatError: a malformed prompts file.
    """

    folder_config = Path(model) / "config.json"
    readable = not Path(model).is_dir() or folder_config.is_file()  # else load() says why
    if readable and resolve(model).causal is False:
        raise InputError(
            f"--model {model}: patching reads next-token logits, and this is not a causal "
            "language model with its head (its config.json names no ...ForCausalLM or "
            "...LMHeadModel architecture)"
        )
    if prompts:
        read_prompts(prompts)


@dataclass(frozen=True, kw_only=True)
class PatchRequest:
    """What ``headlab patch`` is asked, its fields named as the command's flags; checked on
    creation (:func:`check_request`, :func:`check_model`).

    Attributes:
        model: a causal language model with its head (default: the bundled SmolLM2).
        task, prompts, n, seed: the prompts: a built-in task (default ioi) drawn ``n`` at
            ``seed``, or a JSON Lines file.
        method: a method of :mod:`headlab.causal.methods`' table (activation, attribution,
            ig, dla, and any registered there).
        component, position, steps, compare: as :func:`headlab.causal.patching.run_patching`
            takes them (``position``: ``"all"`` or ``"last"``).
        source: what replaces a head's output (the intervention, apart from the outputs
            below): ``"corrupt"`` the corrupted prompt's run (activation patching), ``"mean"``
            the head's mean output over the task's clean prompts, ``"resample"`` another clean
            prompt's output.
        no_layers: skip the per-layer table activation patching of head outputs adds.
        to, path: path patching's receiver (``q:L.H``, ``k:L.H``, ``v:L.H`` or ``logits``) and
            sender (``L.H``; default every head below the receiver).
        write: write the built-in task's prompts here instead of patching (:meth:`run`
            returns :class:`PromptsWritten`).
        figure, csv_out: a heatmap (PNG) and every head's effect (CSV) to write.
        csv: every head's effect as CSV on stdout (only checked here).
    """

    model: str = DECODER
    task: str | None = None
    prompts: str | None = None
    n: int = 24
    seed: int = 0
    method: str = DEFAULT_METHOD
    component: str = "z"
    source: str = "corrupt"
    position: str = "all"
    steps: int = IG_STEPS
    compare: bool = False
    no_layers: bool = False
    to: str | None = None
    path: str | None = None
    write: str | None = None
    figure: str | None = None
    csv_out: str | None = None
    csv: bool = False

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Every check that needs no model (:class:`headlab.request.Request`)."""
        check_request(
            method=self.method,
            component=self.component,
            source=self.source,
            compare=self.compare,
            to=self.to,
            path=self.path,
            prompts=self.prompts,
            write=self.write,
            figure=self.figure,
            csv_out=self.csv_out,
            csv=self.csv,
        )
        check_model(self.model, self.prompts)

    def run(self, lm: LoadedModel, progress: Progress = NO_PROGRESS) -> Any:
        """The measurement on ``lm`` (:func:`run_patch` on :func:`patch_task`'s prompts), its
        heatmap and CSV written where ``figure`` and ``csv_out`` say; with ``write``, the
        prompts written there instead (:class:`PromptsWritten`)."""
        return run_patch(lm, patch_task(lm, self), self, progress=progress)


def patch_task(lm: LoadedModel, request: PatchRequest) -> Task:
    """The request's prompts for ``lm``'s tokenizer: its file, else its built-in task."""

    source = request.prompts or request.task or "ioi"
    return as_task(lm, source, n=request.n, seed=request.seed)


@dataclass(frozen=True, kw_only=True)
class PromptsWritten:
    """What a :class:`PatchRequest` with ``write`` gives: the built-in task's prompts written as
    JSON Lines (to edit, then ``prompts``), nothing patched.

    Attributes:
        path: the file written.
        task: the task's name.
        n_prompts: the prompts in it.
    """

    path: str
    task: str
    n_prompts: int

    def to_json(self) -> dict[str, Any]:
        """``path``, ``task`` and ``n_prompts``."""
        return {"path": self.path, "task": self.task, "n_prompts": self.n_prompts}


def run_patch(
    lm: LoadedModel, task: Task, request: PatchRequest, *, progress: Progress = NO_PROGRESS
) -> Any:
    """What ``request`` asks for on ``task``: with ``write``, its prompts written there
    (:class:`PromptsWritten`); else the measurement: a
    :class:`~headlab.causal.paths.PathResult` (with ``to``), a
    :class:`~headlab.causal.dla.DLAResult` (``method="dla"``), else a
    :class:`~headlab.causal.result.PatchingResult`, whose heatmap and CSV are written where
    ``figure`` and ``csv_out`` say."""

    if request.write:
        write_prompts(task.prompts, request.write)
        return PromptsWritten(path=request.write, task=task.name, n_prompts=task.n_prompts)
    if request.to is not None:
        senders = None if request.path is None else [parse_head(request.path)]
        receiver = parse_receiver(request.to)
        position = parse_position(request.position)
        return path_patching(
            lm, task, receiver, senders=senders, position=position, progress=progress
        )
    chosen = patch_method(request.method)
    result = chosen.runner()(lm, task, request, progress)
    if chosen.heads and request.figure:
        write_heatmap(result, request.figure)
    if chosen.heads and request.csv_out:
        write_text_atomic(request.csv_out, result.to_csv())
    return result


def run_heads(
    lm: LoadedModel, task: Task, request: PatchRequest, progress: Progress
) -> PatchingResult:
    """The runner of ``activation``, ``attribution`` and ``ig``
    (:func:`headlab.causal.patching.run_patching`); activation patching of head outputs from
    the corrupted run adds the per-layer table unless ``no_layers``."""
    head_outputs = (
        request.method == "activation" and request.component == "z" and request.source == "corrupt"
    )
    return run_patching(
        lm,
        task,
        method=request.method,  # type: ignore[arg-type]
        position=parse_position(request.position),
        component=request.component,
        source=request.source,
        steps=request.steps,
        compare=request.compare,
        layer_table=head_outputs and not request.no_layers,
        progress=progress,
    )


def run_dla(lm: LoadedModel, task: Task, request: PatchRequest, progress: Progress) -> DLAResult:
    """The runner of ``dla``: :func:`headlab.causal.dla.direct_logit_attribution`."""
    return direct_logit_attribution(lm, task, progress=progress)


@dataclass(frozen=True, kw_only=True)
class ComposeRequest:
    """What ``headlab compose`` is asked, its fields named as the command's flags; ``receivers``
    is parsed on creation.

    Attributes:
        model: the model whose weights are read (default: the bundled SmolLM2).
        receivers: heads ``L.H,L.H,...`` whose strongest senders to list (``None``: the top
            pairs of each kind).
        kind: with ``receivers``: ``q``, ``k`` or ``v`` composition.
        top: pairs, or senders per receiver, listed.
        figure: with ``receivers``: where their figure goes (written by :meth:`run`).
        heads: ``receivers`` as ``(layer, head)`` pairs.

    Raises:
        InputError: a malformed ``receivers``, or a ``figure`` without them.
    """

    model: str = DECODER
    receivers: str | None = None
    kind: str = "k"
    top: int = 10
    figure: str | None = None
    heads: tuple[tuple[int, int], ...] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Every check that needs no model (:class:`headlab.request.Request`)."""
        if self.receivers:
            object.__setattr__(self, "heads", tuple(parse_heads(self.receivers)))
        elif self.figure:
            raise InputError("--figure draws the heads of --receivers: add --receivers L.H,...")
        check_files([("--figure", self.figure, ".png")])

    def run(self, lm: LoadedModel, progress: Progress = NO_PROGRESS) -> ComposeResult:
        """:func:`run_compose`, and the receivers' figure written where ``figure`` says."""
        result = run_compose(lm, self)
        if self.figure and self.heads is not None:
            write_composition(result.scores, self.kind, list(self.heads), self.figure)
        return result


@dataclass(frozen=True, kw_only=True)
class ComposeResult:
    """Every pair's composition scores, and with receivers each one's strongest senders
    (:func:`headlab.causal.composition.receiver_senders`)."""

    scores: CompositionScores
    kind: str
    senders: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        """Every pair, best first (:meth:`CompositionScores.to_json`); with receivers
        ``{"model", "kind", "baseline", "receivers"}``."""
        if self.senders is None:
            return self.scores.to_json()
        base = self.scores.baseline[self.kind]
        return {
            "model": self.scores.model,
            "kind": self.kind,
            "baseline": base,
            "receivers": self.senders,
        }


def run_compose(lm: LoadedModel, request: ComposeRequest) -> ComposeResult:
    """The composition scores of ``lm``'s heads, and the receivers' senders when asked.

    Raises:
        InputError: a receiver ``lm`` does not have (before any score is computed).
    """

    heads = None if request.heads is None else list(request.heads)
    if heads is not None:
        check_receivers(lm, heads)
    scores = composition_scores(lm)
    senders = None
    if heads is not None:
        senders = receiver_senders(lm, scores, request.kind, heads, request.top)
    return ComposeResult(scores=scores, kind=request.kind, senders=senders)
