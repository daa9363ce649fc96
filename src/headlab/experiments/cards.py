"""One card per head (``headlab cards``): where it looks, what it reads, what it writes, what it
does and what it costs, each number taken from the analysis that measures it, called as its own
command calls it, and a one-line verdict written from them (:mod:`headlab.experiments.card_verdict`).

A card joins, for every head of the model:

- **looks**: its entry of a ``headlab roles`` run (role, roles, score over its bar, fold and
  bootstrap agreement, every probe's score: sink share, entropy, previous token...): the run
  given (``roles``), else the model's cached run (:func:`headlab.cache.cached_roles_path`), else
  one measured here (:class:`~headlab.roles.workflow.RolesRequest`, ``limit`` sentences);
  and its top examples on the bundled UD EWT sentences (:func:`top_examples`);
- **reads**: its :data:`TOP_SENDERS` strongest senders by Q-, K- and V-composition, each against
  the random baseline (``headlab compose --receivers L.H``);
- **writes**: the tokens its OV circuit promotes and suppresses most
  (:func:`~headlab.roles.copying.written_tokens`), its copying score
  (:func:`~headlab.roles.copying.copying_scores`), and its direct logit attribution on each
  built-in task (``headlab patch --method dla``);
- **does**: its activation-patching effect on each built-in task (``headlab patch``), and its
  IOI class as ``headlab circuit`` names a circuit's heads
  (:func:`~headlab.experiments.head_classes.head_classes`, without path patching);
- **costs**: its share of the attention FLOPs per token and of the KV cache (a query head
  shares its KV group's cache with the group), from the layout as ``headlab spec`` computes them,
  and its gradient importance with its rank among all heads, as ``headlab prune`` scores heads
  (perplexity on the bundled text for a causal model, STS-B for an encoder).

The JSON (:data:`SCHEMA`) names, for every field, the command that reproduces its numbers
(``commands``, ``L.H`` standing for the head), and for every part left out why (``skipped``).

Shape vocabulary: ``L`` layers, ``H`` heads.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from headlab.cache import cached_roles_path
from headlab.causal.composition import KINDS
from headlab.causal.generators import BUILTIN
from headlab.causal.request import (
    PatchRequest,
    patch_task,
    run_patch,
)
from headlab.datasets import read_treebank, sample_path
from headlab.errors import DataFormatError, HeadlabError, InputError
from headlab.experiments.card_parts import (
    TOP_SENDERS,
    Measured,
    card_of,
    composition_senders,
    cost_shares,
    importance_ranks,
    prune_importance,
    top_examples,
)
from headlab.experiments.card_verdict import VERDICT_RULES, verdict
from headlab.experiments.head_classes import head_classes, roles_by_head
from headlab.layout.sheet import DEFAULT_CONTEXT
from headlab.models.loading import LoadedModel
from headlab.models.names import DECODER
from headlab.outputs import check_files, write_text_atomic
from headlab.page.atlas import atlas_html
from headlab.progress import NO_PROGRESS, Progress, stage
from headlab.roles.copying import copying_scores, written_tokens
from headlab.roles.results import read_roles_json
from headlab.roles.workflow import RolesRequest

#: the ``schema`` of ``headlab cards --json``
SCHEMA = "headlab.cards/1"
#: the built-in tasks patched by default
TASKS = ("ioi", "induction")
#: prompts drawn per task by default (``headlab patch``'s default)
N_PROMPTS = 24
#: tokens promoted and suppressed listed per head
TOP_TOKENS = 5
#: sentences of the bundled UD EWT sample searched for each head's top examples
EXAMPLE_SENTENCES = 40
#: where heads are patched (``headlab patch --position``)
POSITIONS = ("last", "all")
#: the parts a request may leave out, each its own ``--no-PART`` flag
PARTS = ("roles", "patch", "dla", "compose", "importance")


@dataclass(frozen=True, kw_only=True)
class CardsRequest:
    """What ``headlab cards`` is asked, its fields named as the command's flags; checked on
    creation (no model loaded).

    Attributes:
        model: any model headlab opens (default: the bundled SmolLM2).
        roles: a ``headlab roles --json`` run of the model (default: its cached run, else one
            measured here).
        limit: measure the roles here on this many sentences, the cached run aside
            (``None``: all of the bundled sample, when no run is given or cached).
        tasks: the built-in tasks patched (causal language models with their head).
        n, seed: prompts drawn per task, and their seed.
        position: where each head is patched: ``"last"`` (the default: the last token, where
            the answer is read; about 6x faster than every position on SmolLM2) or ``"all"``.
        top: tokens promoted and suppressed listed per head.
        examples: sentences of the bundled UD EWT sample searched for each head's
            :data:`TOP_EXAMPLES` top examples (:func:`top_examples`; 0: none).
        no_roles, no_patch, no_dla, no_compose, no_importance: leave that part out.
        html: the offline atlas of the cards to write (:meth:`Cards.write`).

    Raises:
        InputError: one line naming the flag.
        DataFormatError: a roles file that is not one.
    """

    model: str = DECODER
    roles: str | None = None
    limit: int | None = None
    tasks: tuple[str, ...] = TASKS
    n: int = N_PROMPTS
    seed: int = 0
    position: str = "last"
    top: int = TOP_TOKENS
    examples: int = EXAMPLE_SENTENCES
    no_roles: bool = False
    no_patch: bool = False
    no_dla: bool = False
    no_compose: bool = False
    no_importance: bool = False
    html: str | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """The checks of the class docstring, before any model loads."""
        check_files([("--html", self.html, ".html")])
        for task in self.tasks:
            if task not in BUILTIN:
                raise InputError(f"--tasks: unknown task {task!r}; expected {', '.join(BUILTIN)}")
        if not self.tasks and not (self.no_patch and self.no_dla):
            raise InputError("--tasks is empty: name a task, or add --no-patch --no-dla")
        if self.position not in POSITIONS:
            raise InputError(f"--position must be all or last, got {self.position!r}")
        if self.n < 1:
            raise InputError(f"--n must be at least 1, got {self.n}")
        if not 1 <= self.top <= 100:
            raise InputError(f"--top must be 1 to 100, got {self.top}")
        if not 0 <= self.examples <= 10_000:
            raise InputError(f"--examples must be 0 to 10000, got {self.examples}")
        if self.limit is not None and self.limit < 1:
            raise InputError(f"--limit must be at least 1, got {self.limit}")
        if self.roles and self.limit is not None:
            raise InputError("--limit has no effect here: --roles gives the roles run")
        if self.no_roles and (self.roles or self.limit is not None):
            flag = "--roles" if self.roles else "--limit"
            raise InputError(f"{flag} has no effect here: --no-roles leaves the roles out")
        if self.roles:
            read_roles_json(self.roles)

    def run(
        self,
        lm: LoadedModel,
        progress: Progress = NO_PROGRESS,
        *,
        notify: Callable[[str], None] = lambda note: None,
    ) -> Cards:
        """Every head's card (:func:`measure_cards`), and the atlas written where ``html``
        says (:meth:`Cards.write`)."""
        cards = measure_cards(lm, self, progress=progress, notify=notify)
        cards.write(self)
        return cards


@dataclass(frozen=True, kw_only=True)
class Cards:
    """Every head's card, the commands that reproduce each field, and the parts left out.

    Attributes:
        roles_measured: the roles run measured here (``headlab roles --json``'s JSON), for the
            caller to keep as the model's cached run; ``None`` when read or left out.
    """

    model: str
    heads_in_layer: tuple[int, ...]
    causal: bool
    settings: dict[str, Any]
    commands: dict[str, str]
    skipped: dict[str, str]
    cards: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    #: the sentences of the top examples, as the model's words (``looks.examples`` index them)
    sample: list[list[str]] = field(default_factory=list)
    roles_from: str | None = None
    roles_measured: dict[str, Any] | None = None

    def card(self, layer: int, head: int) -> dict[str, Any]:
        """Head ``layer.head``'s card."""
        return self.cards[sum(self.heads_in_layer[:layer]) + head]

    def to_json(self) -> dict[str, Any]:
        """``headlab cards --json`` (schema :data:`SCHEMA`; 0-based layer and head)."""
        return {
            "schema": SCHEMA,
            "model": self.model,
            "layers": len(self.heads_in_layer),
            "heads_in_layer": list(self.heads_in_layer),
            "causal": self.causal,
            "settings": self.settings,
            "roles_from": self.roles_from,
            "commands": self.commands,
            "skipped": self.skipped,
            "rules": VERDICT_RULES,
            "notes": self.notes,
            "sample": self.sample,
            "cards": self.cards,
        }

    def write(self, request: CardsRequest) -> None:
        """Write the atlas (:func:`headlab.page.atlas.atlas_html`) at ``request.html``,
        atomically, where it asks for one."""
        if request.html:
            write_text_atomic(request.html, atlas_html(self.to_json()))


# ------------------------------------------------------------------------------- the parts
def _roles(
    lm: LoadedModel, request: CardsRequest, progress: Progress, notify: Callable[[str], None]
) -> tuple[dict[str, Any] | None, str | None, bool]:
    """The roles run (given, cached, or measured here), where it came from, and whether it
    was measured here; ``(None, None, False)`` with ``no_roles``."""
    if request.no_roles:
        return None, None, False
    heads = list(lm.layout.heads_per_layer)
    path = Path(request.roles) if request.roles else cached_roles_path(lm.name)
    if request.limit is None and path.is_file():  # --limit asks for a run measured here
        data: dict[str, Any] | None = None
        try:
            data = read_roles_json(path)
        except (InputError, DataFormatError) as exc:
            if request.roles:
                raise
            why = str(exc)
        else:
            theirs = data.get("heads_in_layer")
            why = ""
            if theirs is not None and list(theirs) != heads:
                why = f"its heads per layer {list(theirs)} are not the model's {heads}"
                if request.roles:
                    raise InputError(f"--roles {path}: {why}")
        if data is not None and not why:
            if data["model"] != lm.name:
                notify(f"the roles run {path} was measured on {data['model']!r}; heads match")
            return data, str(path), False
        notify(f"the cached roles run {path} is not used ({why}); measuring roles")
    measured = RolesRequest(limit=request.limit).run(lm, progress).to_json()
    return measured, "measured", True


def _task_effects(
    lm: LoadedModel,
    request: CardsRequest,
    progress: Progress,
    notify: Callable[[str], None],
    roles: dict[str, Any] | None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[Any, Any], dict[str, str]]:
    """Each task's patching effects and direct logit attribution ``(L, H)``, as ``headlab
    patch`` (``--no-layers``) and ``headlab patch --method dla`` measure them; with DLA on IOI,
    each head's IOI class as ``headlab circuit`` names a circuit's heads
    (:func:`~headlab.experiments.head_classes.head_classes`, every head, without path
    patching; ``roles`` as its evidence); why not, per part."""
    patching: dict[str, torch.Tensor] = {}
    dla: dict[str, torch.Tensor] = {}
    classes: dict[Any, Any] = {}
    skipped: dict[str, str] = {}
    wanted = [
        part for part, off in (("patch", request.no_patch), ("dla", request.no_dla)) if not off
    ]
    if not wanted:
        return patching, dla, classes, skipped
    head = getattr(lm.model, "get_output_embeddings", lambda: None)()
    if not lm.causal or head is None:
        why = "patching reads next-token logits: not a causal language model with its head"
        return patching, dla, classes, dict.fromkeys(wanted, why)
    for name in request.tasks:
        asked = PatchRequest(
            model=request.model,
            task=name,
            n=request.n,
            seed=request.seed,
            position=request.position,
            no_layers=True,
        )
        try:
            task = patch_task(lm, asked)
        except InputError as exc:  # prompts this tokenizer cannot draw: the other parts stay
            skipped[f"task {name}"] = str(exc)
            continue
        for line in task.notes:
            notify(f"{name}: {line}")
        if "patch" in wanted:
            patching[name] = run_patch(lm, task, asked, progress=progress).effects
        if "dla" in wanted:
            dla[name] = run_patch(lm, task, replace(asked, method="dla"), progress=progress).dla
        if "dla" in wanted and name == "ioi":
            heads = [(i, h) for i, n in enumerate(lm.layout.heads_per_layer) for h in range(n)]
            known = None if roles is None else roles_by_head(roles, list(lm.layout.heads_per_layer))
            classes, shaped = head_classes(lm, task, heads, roles=known, paths=False)
            if not shaped:
                classes = {}
    return patching, dla, classes, skipped


# ------------------------------------------------------------------------------- the cards
def _commands(
    request: CardsRequest, context: int, roles_from: str | None, skipped: dict[str, str]
) -> dict[str, str]:
    """The command that reproduces each field measured, ``L.H`` standing for the head."""
    model = shlex.quote(request.model)
    draw = f"--n {request.n} --seed {request.seed}"
    roles = f"headlab roles --model {model} --json"
    if roles_from == "measured" and request.limit is not None:
        roles += f" --limit {request.limit}"
    elif roles_from not in (None, "measured"):
        roles += f" (read from {roles_from})"
    out = {
        "looks.roles": roles,
        **{
            f"reads.{kind}": f"headlab compose --model {model} --receivers L.H --kind {kind} "
            f"--top {TOP_SENDERS} --json"
            for kind in KINDS
        },
        "looks.examples": "python: headlab.experiments.cards.top_examples(lm, the first "
        f"{request.examples} sentences of the bundled UD EWT sample) (over "
        "headlab.models.analysis.word_attention)",
        "writes.promoted": f"python: headlab.roles.copying.written_tokens(lm, k={request.top})",
        "writes.suppressed": f"python: headlab.roles.copying.written_tokens(lm, k={request.top})",
        "writes.copying": f"{roles} (scores.copying); python: "
        "headlab.roles.copying.copying_scores(lm)",
        "costs.flops_share": f"headlab spec {model} --context {context} --json "
        "(attention_flops_per_token of the head's layer / the model's / its heads)",
        "costs.kv_share": f"headlab spec {model} --context {context} --json (kv_cache_bytes "
        "of the head's layer / the model's / its query heads)",
        "costs.importance": "python: headlab.pruning.importance.gradient_importance(lm, "
        "headlab.pruning.inputs.build_metrics(lm, PruneOptions())[1]) (what headlab prune "
        "ranks heads by)",
    }
    for task in request.tasks:
        out[f"does.patching.{task}"] = (
            f"headlab patch --model {model} --task {task} {draw} --position {request.position} "
            "--no-layers --json"
        )
        if task == "ioi":
            out["does.ioi_class"] = (
                "python: headlab.experiments.head_classes.head_classes(lm, task, every head, "
                "roles=the roles run, paths=False) (headlab circuit's classes) on the prompts "
                f"of headlab patch --model {model} --task ioi {draw}"
            )
        out[f"writes.dla.{task}"] = (
            f"headlab patch --model {model} --task {task} --method dla {draw} --json"
        )
    parts = {
        "roles": ("looks.roles",),
        "compose": ("reads.",),
        "patch": ("does.patching.",),
        "dla": ("writes.dla.", "does.ioi_class"),
        "importance": ("costs.importance",),
        "writes": ("writes.promoted", "writes.suppressed", "writes.copying"),
    }
    for task in request.tasks:  # a built-in task whose prompts could not be drawn
        parts[f"task {task}"] = (f"does.patching.{task}", f"writes.dla.{task}") + (
            ("does.ioi_class",) if task == "ioi" else ()
        )
    gone = tuple(p for part in skipped for p in parts.get(part, ()))
    return {k: v for k, v in out.items() if not k.startswith(gone)}


def _optional(
    what: str, off: bool, skipped: dict[str, str], progress: Progress, run: Callable[[], Any]
) -> Any:
    """``run()`` as its own stage, or ``None`` with why in ``skipped``: its ``--no-`` flag
    (``off``), or the one line of the error that stopped it."""
    if off:
        skipped[what] = f"--no-{what}"
        return None
    with stage(progress, what):
        try:
            return run()
        except HeadlabError as exc:
            skipped[what] = str(exc)
            return None


def measure_cards(
    lm: LoadedModel,
    request: CardsRequest,
    *,
    progress: Progress = NO_PROGRESS,
    notify: Callable[[str], None] = lambda note: None,
) -> Cards:
    """Every head's card of ``lm`` as ``request`` asks (the module docstring); ``notify``
    hears each note (a task's prompts dropped, a roles run not used), kept in the result too."""
    notes: list[str] = []

    def note(line: str) -> None:
        notes.append(line)
        notify(line)

    skipped: dict[str, str] = {}
    roles, roles_from, measured = _roles(lm, request, progress, note)
    if roles is None:
        skipped["roles"] = "--no-roles"
    sample: list[list[str]] = []
    examples = None
    if request.examples:
        with stage(progress, "top examples", request.examples, "sentences") as bar:
            gold = read_treebank(sample_path("treebank"), limit=request.examples)
            sample, examples = top_examples(
                lm, [list(s.words) for s in gold.sentences], progress=bar
            )
    patching, dla, classes, why = _task_effects(lm, request, progress, note, roles)
    skipped.update(why)
    skipped.update(
        {part: f"--no-{part}" for part in ("patch", "dla") if getattr(request, f"no_{part}")}
    )
    senders = _optional(
        "compose", request.no_compose, skipped, progress, lambda: composition_senders(lm)
    )
    importance = _optional(
        "importance", request.no_importance, skipped, progress, lambda: prune_importance(lm)
    )
    with stage(progress, "OV circuits"):
        written = written_tokens(lm, request.top)
        copying = copying_scores(lm) if written is not None else None
    if written is None:
        skipped["writes"] = "no unembedding: neither a language-model head nor tied embeddings"
    context = min(DEFAULT_CONTEXT, lm.layout.max_positions or DEFAULT_CONTEXT)
    flops, kv = cost_shares(lm, context)
    parts = Measured(
        roles={(h["layer"], h["head"]): h for h in roles["heads"]} if roles else {},
        examples=examples,
        senders=senders,
        written=written,
        copying=copying,
        dla=dla,
        patching=patching,
        classes=classes,
        flops=flops,
        kv=kv if lm.causal else None,
        importance=importance,
        ranks=importance_ranks(importance),
    )
    cards = [
        card_of(lm, parts, layer, head)
        for layer, count in enumerate(lm.layout.heads_per_layer)
        for head in range(count)
    ]
    largest = {t: float(v.nan_to_num(0.0).abs().max()) for t, v in dla.items()}
    by_id = {c["id"]: c for c in cards}
    folds = int(roles.get("folds") or 0) if roles else 0
    for card in cards:
        card["verdict"] = verdict(
            card, by_id, folds=folds, largest_dla=largest, position=request.position
        )
    commands = _commands(request, context, roles_from, skipped)
    if not lm.causal:
        commands.pop("costs.kv_share")
    return Cards(
        model=lm.name,
        heads_in_layer=tuple(lm.layout.heads_per_layer),
        causal=lm.causal,
        settings={
            "tasks": list(request.tasks),
            "n": request.n,
            "seed": request.seed,
            "position": request.position,
            "top": request.top,
            "examples": request.examples,
            "context": context,
        },
        commands=commands,
        skipped=skipped,
        cards=cards,
        notes=notes,
        sample=sample,
        roles_from=roles_from,
        roles_measured=roles if measured else None,
    )
