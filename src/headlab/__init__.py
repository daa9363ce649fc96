"""headlab: multi-head attention, opened up.

The package is light to import: submodules that need torch (``headlab.attention``,
``headlab.models``) are imported on use, so ``headlab spec`` and ``headlab --help`` never load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headlab.explore.sentence import SentenceHeads

from headlab._version import __version__

__all__ = ["__version__", "capture"]


def capture(model: Any, text: str, *, word: str | None = None) -> SentenceHeads:
    """Every head of ``model`` on ``text``: word- and token-level patterns, shown in a notebook
    as the layer x head grid and a head's pattern (:func:`headlab.explore.sentence.capture`).

    ``model``: a loaded model, or a name (``"minilm"``, ``"tiny-shakespeare"``, ``"smollm2"``,
    a folder), loaded once per process.
    """
    from headlab.explore.sentence import capture as capture_sentence

    return capture_sentence(model, text, word=word)
