"""Every role headlab measures, described once: :class:`Role`, and the registry of them.

Everything that lists roles reads this registry: the names and letters of
:mod:`headlab.roles.classify`, the defaults of its ``Thresholds``, the scores each head's result
lists and the detail it gets (:mod:`headlab.roles.scoring`), the encoder/decoder split of the
report (:mod:`headlab.report.decoder`), the palette and legends of every page and figure
(:mod:`headlab.page.styles`), the decoder section's prose and the circuit classes of
:mod:`headlab.experiments.head_classes`.

One name per concept: ``previous-token`` is the role; its bar in ``Thresholds`` and in a roles
result's ``thresholds`` is the name with underscores (:attr:`Role.threshold`, a Python
identifier), and the circuit class of the same heads is the name with spaces
(:attr:`Role.circuit_class`, as the IOI paper writes its classes). Both are derived, never typed.

A new role fed by the treebank or the induction pass (docs/architecture.md, "A new role"): a
probe module whose ``scores(sums)`` gives the role's score under the role's name (and, for
sums of its own, whose ``collect`` its pass runs), and one :class:`Role` in :data:`BUILTIN`, or
:func:`register` at run time, as tests/roles/test_registry.py does.

Example:
    >>> from headlab.roles import registry
    >>> registry.get("previous-token").threshold, registry.get("previous-token").circuit_class
    ('previous_token', 'previous token')
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import overload

import torch

from headlab.errors import InputError
from headlab.roles.bootstrap import Sums
from headlab.roles.geometry import BROAD_RATIO
from headlab.roles.probes import broad, delimiter, induction, positional, rare

#: a probe's scores from its pass's sums: ``{name: (R+1, L, H)}``
Scorer = Callable[[Sums], dict[str, torch.Tensor]]
#: a probe's sums of one batch on its pass, each ``{key: (B, H)}``, added up per item as
#: ``key`` (the treebank pass) or ``key.sum`` (the induction pass); each pass has one calling
#: convention: the treebank pass ``collect(weights (B, H, t, S), geo, start)`` for each block
#: of query rows ``start..start+t`` (a :class:`~headlab.roles.geometry.Geometry`), the
#: induction pass ``collect(pattern (B, H, T, T), half, start)`` for each layer
#: (:mod:`headlab.roles.repeated`)
Collector = Callable[..., dict[str, torch.Tensor]]
#: a head's score by name on the whole data (``None``: missing or NaN)
Value = Callable[[str], "float | None"]
#: the passes over data that feed roles (:mod:`headlab.roles.measure`'s stages)
PASSES = ("treebank", "gap", "induction")
UNCLASSIFIED = "unclassified"
#: what a sink head's detail names, by the part of the sink with most of its attention
SINK_LABELS = {"cls": "[CLS]", "sep": "[SEP]/BOS/EOS", "first": "the first token"}


@dataclass(frozen=True, kw_only=True)
class Role:
    """One role: what names it, what feeds it, what bar it must clear, how it is drawn.

    Attributes:
        name: the role's one spelling (``previous-token``); a head's score for it is under
            this name in its result's ``scores``.
        letter: its letter in the text grid and on the pages.
        colour: its colour on every page and figure; ``None``: a spare one.
        fed_by: the pass whose sums it is scored from, one of :data:`PASSES`.
        bar: the literature's bar a score must clear (the default of ``Thresholds``); ``None``
            for a tested role (syntactic, coreference: baseline plus a margin and a test,
            decided in :mod:`headlab.roles.scoring`).
        scorer: its probe's ``scores(sums)``; ``None`` for a tested role. Several roles may
            share one probe (delimiter and sink), which then runs once.
        collect: its probe's sums of each batch (:data:`Collector`), which its pass runs for
            every registered role that has one (a collector shared by roles runs once). The
            treebank pass feeds the built-in probes itself, with what the engine hands it
            besides the weights (each row's largest weight, entropy, masses); the GAP pass
            runs none: a role fed by it reads the sums it keeps.
        needs: a key that must be in its pass's sums for it to be scored (an induction pass
            that ran no sequence has none).
        baseline: the score that is its chance level, shown as its baseline (``rare_chance``);
            ``None``: the bar itself.
        shows: the scores every head's result lists for it (the probe's, in the result's order).
        detail: a head's detail when this is its primary role, from its scores.
        proof: scores shown in the evidence of a head with this role, not required by it.
        causal: measured on causal models only (the encoder/decoder split of the report).
        fallback: primary only where a head clears no other bar (the sink).
        repeats: its pattern shows only on a sentence that repeats itself (figures pick one).
        attends: for the report's decoder section, where such a head attends.
        circuit_bar: the bar of its circuit class (:mod:`headlab.experiments.head_classes`),
            only where that class measures the role on other text than the roles pass does;
            ``None``: the role's own bar (:attr:`class_bar`).
    """

    name: str
    letter: str
    colour: str | None = None
    fed_by: str = "treebank"
    bar: float | None = None
    scorer: Scorer | None = None
    collect: Collector | None = None
    needs: str | None = None
    baseline: str | None = None
    shows: tuple[str, ...] = ()
    detail: Callable[[Value], str] | None = None
    proof: tuple[str, ...] = ()
    causal: bool = False
    fallback: bool = False
    repeats: bool = False
    attends: str = ""
    circuit_bar: float | None = None

    def __post_init__(self) -> None:
        if self.collect is not None and self.fed_by == "gap":
            raise InputError(f"role {self.name!r}: the GAP pass runs no role's collect")
        if self.fed_by not in PASSES:
            raise InputError(
                f"role {self.name!r}: fed_by must be one of {PASSES}, not {self.fed_by!r}"
            )
        if (self.bar is None) != (self.scorer is None):
            raise InputError(
                f"role {self.name!r}: a role with a bar needs a scorer, a tested one neither"
            )
        if not self.name or self.name == UNCLASSIFIED or "_" in self.name or " " in self.name:
            raise InputError(f"a role's name is words joined by '-', got {self.name!r}")

    @property
    def threshold(self) -> str:
        """Its bar's name in ``Thresholds`` and in a result's ``thresholds``: ``previous_token``."""
        return self.name.replace("-", "_")

    @property
    def class_bar(self) -> float | None:
        """The bar of its circuit class: :attr:`circuit_bar`, else the role's."""
        return self.bar if self.circuit_bar is None else self.circuit_bar

    @property
    def circuit_class(self) -> str:
        """Its circuit class's name (:mod:`headlab.experiments.head_classes`): ``previous token``."""
        return self.name.replace("-", " ")


def _sink_detail(value: Value) -> str:
    parts = {p: value(p) or 0.0 for p in delimiter.SINK_PARTS}
    return SINK_LABELS[max(parts, key=lambda p: parts[p])]


def _copying(value: Value) -> str:
    copying = value("copying")
    return "" if copying is None else f"copying {copying:+.2f}"


#: the roles headlab ships, in the order results list them; on a tie the order never decides
#: (:mod:`headlab.roles.classify`). Colours: Tableau 10, unclassified heads stay white.
BUILTIN = (
    Role(
        name="positional",
        letter="P",
        colour="#4e79a7",
        bar=0.9,  # Voita et al. (2019): one offset is the argmax of 90% of tokens
        scorer=positional.scores,
        shows=("positional", "previous", "next"),
        detail=lambda value: f"offset {int(value('positional_offset') or 0):+d}",
    ),
    Role(
        name="delimiter",
        letter="D",
        colour="#76b7b2",
        bar=0.5,
        scorer=delimiter.scores,
        # the delimiter probe's masses, the sink's parts among them
        shows=("delimiter", "sink", "cls", "sep", "first", "punct"),
        detail=lambda value: "punctuation",
    ),
    Role(
        name="rare-token",
        letter="R",
        colour="#edc948",
        bar=0.5,
        scorer=rare.scores,
        baseline="rare_chance",
        shows=("rare-token",),
    ),
    Role(name="syntactic", letter="S", colour="#59a14f", shows=("syntactic",)),
    Role(name="coreference", letter="C", colour="#e15759", fed_by="gap", shows=("coreference",)),
    Role(
        name="broad",
        letter="B",
        colour="#f28e2b",
        bar=BROAD_RATIO,
        scorer=broad.scores,
        shows=("broad", "entropy"),
        detail=lambda value: f"{value('entropy') or 0.0:.2f} nats",
    ),
    Role(
        name="sink",
        letter="K",
        colour="#d7d3cf",
        # mean share of attention on the sink ([CLS], [SEP], BOS, EOS, the first position):
        # more than half, as Clark et al. (2019) counted BERT's heads on [SEP]
        bar=0.5,
        scorer=delimiter.scores,
        shows=("sink", "cls", "sep", "first"),
        detail=_sink_detail,
        fallback=True,
    ),
    Role(
        name="induction",
        letter="I",
        colour="#b07aa1",
        fed_by="induction",
        bar=0.3,
        scorer=induction.scores,
        collect=induction.collect,
        needs="induction.n",
        shows=("induction", "copying"),
        detail=_copying,
        proof=("copying",),
        causal=True,
        repeats=True,
        attends="from a repeated token to the token that followed its earlier occurrence",
    ),
    Role(
        name="previous-token",
        letter="T",
        colour="#ff9da7",
        fed_by="induction",
        # mean weight on the previous token: most of the head's weight (docs/roles.md)
        bar=0.5,
        scorer=induction.scores,
        collect=induction.collect,
        needs="induction.n",
        shows=("previous-token",),
        causal=True,
        attends="to the token just before",
        # The circuit class measures the same thing on other text: the mean weight on the
        # previous token at every position of the IOI prompts, the first ones after BOS (an
        # attention sink) included, where the roles pass reads random tokens past the first.
        # Real prompts pull weight to the sink and to repeated names, so the class's bar is
        # lower; measured on SmolLM2 with 0.4 (commit 12b91bd, docs/circuits.md), kept.
        circuit_bar=0.4,
    ),
    Role(
        name="duplicate-token",
        letter="U",
        colour="#9c755f",
        fed_by="induction",
        # mean weight on the earlier occurrence of the same token, on induction's scale
        bar=0.3,
        scorer=induction.scores,
        collect=induction.collect,
        needs="induction.n",
        shows=("duplicate-token",),
        causal=True,
        repeats=True,
        attends="to an earlier copy of the same token",
    ),
)

_REGISTRY: dict[str, Role] = {role.name: role for role in BUILTIN}


def roles() -> tuple[Role, ...]:
    """Every registered role, in order."""
    return tuple(_REGISTRY.values())


def get(name: str) -> Role | None:
    """The role named ``name``, or ``None`` (a name a newer headlab's result may carry)."""
    return _REGISTRY.get(name)


def role(name: str) -> Role:
    """The role named ``name``; :class:`~headlab.errors.InputError` if none is registered."""
    found = _REGISTRY.get(name)
    if found is None:
        raise InputError(f"no role {name!r}; the roles are {', '.join(_REGISTRY)}")
    return found


def register(new: Role) -> None:
    """Add ``new`` after the registered roles (its name and letter not taken yet)."""
    if new.name in _REGISTRY:
        raise InputError(f"a role {new.name!r} is registered already")
    taken = {r.letter for r in _REGISTRY.values()} | {"·"}
    if new.letter in taken:
        raise InputError(f"role {new.name!r}: its letter {new.letter!r} is taken")
    _REGISTRY[new.name] = new


def unregister(name: str) -> None:
    """Remove a role :func:`register` added (the built-in ones stay)."""
    if any(r.name == name for r in BUILTIN):
        raise InputError(f"{name!r} is one of headlab's own roles and stays registered")
    role(name)
    del _REGISTRY[name]


@contextmanager
def registered(new: Role) -> Iterator[Role]:
    """``new`` registered for the ``with`` block, removed after it whatever happens."""
    register(new)
    try:
        yield new
    finally:
        unregister(new.name)


class Names(Sequence[str]):
    """The names of the registered roles that ``keep`` accepts, read when used: a role
    registered later is in every module that imported the view before."""

    def __init__(self, keep: Callable[[Role], bool] = lambda r: True) -> None:
        self._keep = keep

    def _names(self) -> tuple[str, ...]:
        return tuple(r.name for r in _REGISTRY.values() if self._keep(r))

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._names())


class Letters(Mapping[str, str]):
    """Each registered role's letter, and unclassified's ``·``, read when used."""

    def _letters(self) -> dict[str, str]:
        return {**{r.name: r.letter for r in _REGISTRY.values()}, UNCLASSIFIED: "·"}

    def __getitem__(self, name: str) -> str:
        return self._letters()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._letters())

    def __len__(self) -> int:
        return len(self._letters())

    def __repr__(self) -> str:
        return repr(self._letters())


def scorers(passes: Mapping[str, Sums | None]) -> list[tuple[Role, Scorer, Sums]]:
    """The roles with a bar whose pass ran (``passes``: pass name -> its sums, or ``None``),
    each with its probe's scorer and its pass's sums."""
    out = []
    for r in _REGISTRY.values():
        sums = passes.get(r.fed_by)
        if r.scorer is None or sums is None or (r.needs is not None and r.needs not in sums):
            continue
        out.append((r, r.scorer, sums))
    return out


def collectors(fed_by: str) -> list[Collector]:
    """The probes' per-batch sums of the roles ``fed_by`` a pass, each once, in order."""
    found = (r.collect for r in _REGISTRY.values() if r.fed_by == fed_by)
    return list(dict.fromkeys(c for c in found if c is not None))


def score_names() -> tuple[str, ...]:
    """The scores a head's result lists, in order: each role's :attr:`Role.shows`, once."""
    return tuple(dict.fromkeys(name for r in _REGISTRY.values() for name in r.shows))
