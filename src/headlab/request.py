"""What a command asks the library, as one protocol: a request checked before any model loads,
then run on the loaded model.

Every command that measures a model is these calls in order (docs/architecture.md, "A command,
from flags to output"): the request is built from the flags (a frozen dataclass whose fields
are named as the command's flags), :meth:`Request.check` refuses what does not go together in
one line before anything is loaded, the model loads, and :meth:`Request.run` returns a
:class:`Result`, whose :meth:`~Result.to_json` is what ``--json`` prints. ``headlab``'s front
door (:mod:`headlab.api`) makes the same calls, so a notebook gets what the command gets.

A command that builds what it measures and loads no model (``experiment cost``) follows the
same protocol: its run takes ``lm`` as ``None`` and reads nothing of it.

Requests check themselves on creation too (``__post_init__`` calls ``check``): a request that
exists is one that passed.

The types here are structural (:class:`typing.Protocol`): a request conforms by having the
methods, not by inheriting. ``lm`` is a :class:`headlab.models.loading.LoadedModel` and
``progress`` a :class:`headlab.progress.Progress`; they are named, not imported, since this
module sits below both.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

ResultT = TypeVar("ResultT", bound="Result", covariant=True)


@runtime_checkable
class Result(Protocol):
    """What a run returns: a frozen dataclass whose JSON is the command's ``--json``."""

    def to_json(self) -> Any:
        """The JSON-ready form (dicts, lists, numbers and strings)."""
        ...


@runtime_checkable
class Request(Protocol[ResultT]):
    """What a command asks for, checked before the model loads and run on it."""

    def check(self) -> None:
        """Refuse, in one line naming the flag (:class:`headlab.errors.InputError`), what does
        not go together or cannot be read; loads no model."""
        ...

    def run(self, lm: Any, progress: Any) -> ResultT:
        """The measurement on the loaded model ``lm``, telling ``progress`` of its stages."""
        ...
