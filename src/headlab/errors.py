"""Errors raised by headlab.

Every error a user can cause derives from :class:`HeadlabError`, and each subclass also derives
from the closest builtin exception, so ``except ValueError`` keeps working for callers that do
not know headlab. Messages are one line and name what was expected and what came in.
"""

from __future__ import annotations

from typing import ClassVar


class HeadlabError(Exception):
    """Base class of every error headlab raises on purpose."""


class ConfigError(HeadlabError, ValueError):
    """A configuration (constructor arguments, config.json) is inconsistent or incomplete."""


class ShapeError(HeadlabError, ValueError):
    """A tensor has the wrong shape or dtype for the call it was passed to."""


class MaskError(ShapeError):
    """A mask has the wrong shape or dtype."""


class PruningError(HeadlabError, ValueError):
    """A pruning request cannot be carried out (every head removed, an invalid GQA layout...)."""


class ModelLoadError(HeadlabError, OSError):
    """A model folder is missing, incomplete, corrupt or in a refused format."""


class UnsupportedModelError(HeadlabError, NotImplementedError):
    """The model's architecture has no headlab adapter."""


class InputError(HeadlabError, ValueError):
    """User input (text, words, options) cannot be used as given."""

    #: the kind of problem in a few words, the same for every error of a subclass (what a
    #: corpus run counts its skipped sentences by); ``None``: the message itself says it
    kind: ClassVar[str | None] = None


class TooLongError(InputError):
    """An input has more tokens than the model accepts (headlab never truncates)."""

    kind = "longer than the model accepts"


class ModalityError(InputError):
    """A model reads another kind of input than it was given: text for an image model such as
    ViT, an image for a text model. ``reads`` names what the model reads (``"text"``,
    ``"images"``, ``"audio"``), so that a command can say what to give instead."""

    def __init__(self, message: str, *, reads: str = "") -> None:
        super().__init__(message)
        self.reads = reads


class AlignmentError(InputError):
    """A sentence's words cannot be matched to its tokens (a token straddles two words, or a
    word gets no token)."""

    kind = "words could not be aligned to tokens"


class DataFormatError(HeadlabError, ValueError):
    """A data file (CoNLL-U, TSV, JSON) is malformed; the message names the file and line."""


class OutputExistsError(HeadlabError, FileExistsError):
    """An output path exists and overwriting was not asked for."""


class OutputError(HeadlabError, OSError):
    """An output folder cannot be written (read-only, full, no permission)."""


class DistributedError(HeadlabError, RuntimeError):
    """A run across processes (``torchrun``) cannot go on: another rank failed or stopped."""
