"""The table of ``headlab patch --method``: each method's name, its help, the options it takes,
and the function that runs it. The CLI's choices and help, :class:`PatchRequest`'s checks and
:func:`run_patch`'s dispatch all read this one table (:mod:`headlab.causal.request`).

Nothing here imports torch: ``headlab patch --help`` lists the methods without loading it; a
built-in method names its runner as ``"module:function"``, imported when it runs.

A new method is one :func:`register` call::

    from headlab.causal.methods import PatchMethod, register

    register(PatchMethod(name="mine", help="mine (what it measures)", run=run_mine, heads=False))

``run_mine(lm, task, request, progress)`` gets the loaded model, the encoded
:class:`~headlab.causal.tasks.Task`, the :class:`~headlab.causal.request.PatchRequest` and a
:class:`~headlab.progress.Progress`, and returns a result with ``to_json()`` (with ``heads``, a
:class:`~headlab.causal.result.PatchingResult`: ``--figure`` and CSV then draw it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headlab.errors import InputError

#: what replaces a head's output (pyvene's ``source``): the corrupted prompt's run (activation
#: patching), the head's mean output over the task's clean prompts (mean ablation), or another
#: clean prompt's output (resample ablation; Chan et al. 2022)
SOURCES = ("corrupt", "mean", "resample")
#: what is patched: query heads' outputs, or each KV head's keys or values
COMPONENTS = ("z", "k", "v")


@dataclass(frozen=True, kw_only=True)
class PatchMethod:
    """One value of ``headlab patch --method``.

    Attributes:
        name: the ``--method`` value.
        help: its part of ``--method``'s help, starting with the name.
        run: ``(lm, task, request, progress) -> result`` with ``to_json()``, or the
            ``"module:function"`` that is it (imported when it runs).
        gradient: estimates activation patching from gradients (takes ``--steps`` and
            ``--compare``).
        heads: gives every head's effect, a
            :class:`~headlab.causal.result.PatchingResult` (``--figure``, ``--csv``,
            ``--csv-out``); else a table or ``--json`` only.
        components: the ``--component`` values it patches.
        sources: the ``--source`` values it patches from.
    """

    name: str
    help: str
    run: str | Callable[..., Any]
    gradient: bool = False
    heads: bool = True
    components: tuple[str, ...] = ("z",)
    sources: tuple[str, ...] = ("corrupt",)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").isalnum():
            raise InputError(f"a patch method's name is a word, got {self.name!r}")
        unknown = [c for c in self.components if c not in COMPONENTS]
        unknown += [s for s in self.sources if s not in SOURCES]
        if unknown:
            raise InputError(
                f"patch method {self.name}: unknown components or sources {unknown} (expected "
                f"{', '.join(COMPONENTS)}; {', '.join(SOURCES)})"
            )

    def runner(self) -> Callable[..., Any]:
        """The function that runs the method."""
        if callable(self.run):
            return self.run
        module, _, function = self.run.partition(":")
        return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


_TABLE: dict[str, PatchMethod] = {}


def register(method: PatchMethod) -> PatchMethod:
    """Add ``method`` to the table (after the ones there).

    Raises:
        InputError: a method of that name is there already.
    """
    if method.name in _TABLE:
        raise InputError(f"patch method {method.name!r} is registered already")
    _TABLE[method.name] = method
    return method


def unregister(name: str) -> None:
    """Take method ``name`` out of the table (nothing if it is not there)."""
    _TABLE.pop(name, None)


def methods() -> tuple[PatchMethod, ...]:
    """Every method, in the order registered."""
    return tuple(_TABLE.values())


def names(where: Callable[[PatchMethod], bool] = lambda m: True) -> tuple[str, ...]:
    """The names of the methods ``where`` holds for (default all), in order."""
    return tuple(m.name for m in _TABLE.values() if where(m))


def method(name: str) -> PatchMethod:
    """The method called ``name``.

    Raises:
        InputError: no such method (the known ones listed).
    """
    if name not in _TABLE:
        raise InputError(f"--method must be one of {', '.join(_TABLE)}, got {name!r}")
    return _TABLE[name]


def choices_help() -> str:
    """``--method``'s help: each method's own part, in order (``a, b, or c``)."""
    parts = [m.help for m in _TABLE.values()]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", or " + parts[-1]


_HEADS = "headlab.causal.request:run_heads"

register(PatchMethod(name="activation", help="activation (exact)", run=_HEADS,
                     components=COMPONENTS, sources=SOURCES))  # fmt: skip
register(
    PatchMethod(
        name="attribution",
        help="attribution (gradient x difference, one backward pass; Nanda 2023)",
        run=_HEADS,
        gradient=True,
    )
)
register(
    PatchMethod(
        name="ig",
        help="ig (integrated gradients, EAP-IG; Hanna et al. 2024)",
        run=_HEADS,
        gradient=True,
    )
)
register(
    PatchMethod(
        name="dla",
        help="dla (direct logit attribution: what each head writes to the answer directly, "
        "through the final norm frozen at the clean run)",
        run="headlab.causal.request:run_dla",
        heads=False,
    )
)
