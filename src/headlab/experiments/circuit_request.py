"""What ``headlab circuit`` is asked, checked before any model loads, and the run it asks for:
the discovery and held-out prompts drawn, the roles run read as evidence, and the circuit found
(:func:`headlab.experiments.circuit.find_circuit`).

``headlab circuit`` builds a :class:`CircuitRequest` (its checks run then), loads the model,
calls :meth:`CircuitRequest.run` (which writes the page and figure asked for:
:meth:`CircuitRun.write`), and prints the JSON or
:func:`~headlab.experiments.circuit.circuit_text`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlab.cache import cached_roles_path
from headlab.causal.figure import write_circuit
from headlab.causal.generators import builtin_prompts
from headlab.causal.metric import IG_STEPS
from headlab.causal.patching import as_task
from headlab.causal.request import check_model
from headlab.causal.tasks import encode_task, read_prompts
from headlab.errors import DataFormatError, InputError
from headlab.experiments.circuit import MASK_STEPS, CircuitResult, find_circuit
from headlab.experiments.head_classes import roles_by_head
from headlab.models.loading import LoadedModel
from headlab.models.names import DECODER
from headlab.outputs import check_files, write_text_atomic
from headlab.page.circuit import circuit_html
from headlab.progress import NO_PROGRESS, Progress
from headlab.roles.results import read_roles_json

#: built-in prompts drawn by default
N_PROMPTS = 24


@dataclass(frozen=True, kw_only=True)
class CircuitRequest:
    """What ``headlab circuit`` is asked, its fields named as the command's flags; checked on
    creation: the output paths, no flag that would be ignored, held-out prompts beside given
    ones, and the roles and prompts files readable (a malformed file costs no model load).

    Attributes:
        model: a causal language model with its head (default: the bundled SmolLM2).
        task, n, seed: a built-in task (default ioi), its prompts drawn (default
            :data:`N_PROMPTS`) and held-out ones (``eval_n``, default ``n``) from its part
            that the discovery prompts never use.
        prompts, eval_prompts: JSON Lines files of discovery and held-out prompts instead.
        method, steps, search, sizes, target: as :func:`find_circuit` takes them (``steps``
            ``None``: :data:`~headlab.causal.metric.IG_STEPS`).
        mask_edges, mask_steps: the learned search's target and steps (``None``: its
            defaults, :data:`~headlab.experiments.circuit.MASK_SHARE` of the edges and
            :data:`~headlab.experiments.circuit.MASK_STEPS`).
        no_classes: name no head.
        roles: a ``headlab roles --json`` run of the model (default: its cached run).
        html, figure: the circuit's page and its PNG graph, to write.

    Raises:
        InputError: one line naming the flag.
        DataFormatError: a malformed prompts or roles file.
    """

    model: str = DECODER
    task: str | None = None
    prompts: str | None = None
    eval_prompts: str | None = None
    n: int | None = None
    eval_n: int | None = None
    seed: int = 0
    method: str = "eap-ig"
    steps: int | None = None
    search: str = "greedy"
    mask_edges: int | None = None
    mask_steps: int | None = None
    sizes: tuple[int, ...] | None = None
    target: float = 0.8
    no_classes: bool = False
    roles: str | None = None
    html: str | None = None
    figure: str | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """The checks of the class docstring, before any model loads."""
        check_files([("--html", self.html, ".html"), ("--figure", self.figure, ".png")])
        if self.html and self.figure and Path(self.html).resolve() == Path(self.figure).resolve():
            raise InputError("--html and --figure name the same file")
        for flag, ignored, reason in (
            ("--n", self.n is not None and self.prompts, "--prompts gives the prompts"),
            (
                "--eval-n",
                self.eval_n is not None and self.eval_prompts,
                "--eval-prompts gives them",
            ),
            ("--steps", self.steps is not None and self.method == "eap", "--method eap has none"),
            ("--roles", self.roles and self.no_classes, "--no-classes names no head"),
            (
                "--mask-edges",
                self.mask_edges is not None and self.search != "learned",
                "masks are learned by --search learned",
            ),
            (
                "--mask-steps",
                self.mask_steps is not None and self.search != "learned",
                "masks are learned by --search learned",
            ),
        ):
            if ignored:
                raise InputError(f"{flag} has no effect here: {reason}")
        if self.prompts and not self.eval_prompts:
            raise InputError(
                "--prompts finds the circuit; add --eval-prompts FILE.jsonl to measure it on "
                "prompts it was not found on"
            )

        check_model(self.model)  # an encoder has no next-token logits to find a circuit of
        if self.roles:
            read_roles_json(self.roles)
        for given in (self.prompts, self.eval_prompts):
            if given:
                read_prompts(given)

    def run(
        self,
        lm: LoadedModel,
        progress: Progress = NO_PROGRESS,
        *,
        notify: Callable[[str], None] = lambda note: None,
    ) -> CircuitRun:
        """The circuit this request asks for in ``lm`` (:func:`run_circuit`), its ``figure``
        and ``html`` page written (:meth:`CircuitRun.write`)."""
        found = run_circuit(lm, self, progress=progress, notify=notify)
        found.write(self)
        return found


@dataclass(frozen=True, eq=False)
class CircuitRun:
    """A ``headlab circuit`` run: the circuit found and ``roles_from``, the path of the roles
    run used as evidence (``None``: none)."""

    result: CircuitResult
    roles_from: str | None

    def to_json(self) -> dict[str, Any]:
        """``headlab circuit --json``: :meth:`CircuitResult.to_json` and ``roles_from``."""
        return {**self.result.to_json(), "roles_from": self.roles_from}

    def write(self, request: CircuitRequest) -> None:
        """Write the files ``request`` asks for, each atomically: the circuit's PNG graph at
        ``request.figure`` and its page (:func:`headlab.page.circuit.circuit_html`, built
        before anything is written) at ``request.html``."""
        data = self.to_json()
        page = circuit_html(data) if request.html else None
        if request.figure:
            write_circuit(data, request.figure)
        if request.html and page is not None:
            write_text_atomic(request.html, page)


def run_circuit(
    lm: LoadedModel,
    request: CircuitRequest,
    *,
    progress: Progress = NO_PROGRESS,
    notify: Callable[[str], None] = lambda note: None,
) -> CircuitRun:
    """The circuit of ``request`` in ``lm`` and the roles run used as evidence; ``notify``
    hears, in a line each, of a roles run of another model and of a target no circuit
    measured reaches."""

    name, n = request.task or "ioi", request.n or N_PROMPTS
    task = as_task(lm, request.prompts or name, n=n, seed=request.seed)
    if request.eval_prompts:
        held = as_task(lm, request.eval_prompts)
    else:
        drawn = builtin_prompts(
            name, lm.tokenizer, request.eval_n or n, seed=request.seed, part="held-out"
        )
        held = encode_task(lm.tokenizer, drawn, name=f"{name} held-out")
    for line in dict.fromkeys([*task.notes, *held.notes]):
        notify(line)
    roles, roles_from = _roles(lm, request, notify)
    result = find_circuit(
        lm,
        task,
        held,
        method=request.method,  # type: ignore[arg-type]
        steps=request.steps or IG_STEPS,
        search=request.search,  # type: ignore[arg-type]
        mask_edges=request.mask_edges,
        mask_steps=request.mask_steps or MASK_STEPS,
        sizes=request.sizes,
        target=request.target,
        classes=not request.no_classes,
        roles=roles,
        progress=progress,
    )
    run = CircuitRun(result, roles_from)
    if not result.reached:
        data = run.to_json()
        notify(
            f"no circuit measured reaches {request.target:.0%} of the logit difference; kept "
            f"the most faithful, {data['circuit']['edges']} edges at "
            f"{data['circuit']['faithfulness']:.1%} (try more --sizes)"
        )
    return run


def _roles(
    lm: LoadedModel, request: CircuitRequest, notify: Callable[[str], None]
) -> tuple[Any, str | None]:
    """The roles run given, else the model's cached one (``None`` without either), checked
    against the model's heads."""

    path = Path(request.roles) if request.roles else cached_roles_path(lm.name)
    if request.no_classes or not path.is_file():
        return None, None
    try:
        data = read_roles_json(path)
        roles = roles_by_head(data, list(lm.layout.heads_per_layer))
    except (InputError, DataFormatError) as exc:
        if request.roles:
            raise InputError(f"--roles {path}: {exc}") from None
        return None, None  # a cached run that cannot be read, or of another model: no evidence
    if data["model"] != lm.name:
        notify(
            f"--roles {path} was measured on {data['model']!r}, the model is {lm.name!r}; its "
            "heads match in number, so its roles are used"
        )
    return roles, str(path)
