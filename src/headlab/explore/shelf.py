"""The models the explorer offers, each loaded once, on first use, and kept.

The shelf holds the bundled models (``minilm``, the default all-MiniLM-L6-v2; the bundled GGUF
decoders, ``smollm2`` and ``gemma3`` (:data:`headlab.models.names.GGUF_MODELS`), each shown as
not installed without its packages; ``tiny-shakespeare``) and any other model given by folder
or name. A decoder is loaded with its language-model head, for its next-token prediction.

Its :attr:`Shelf.lock` serialises every use of a model: the capture and ablation hooks sit on
the model's own modules, so two sentences must never run through one model at once (and on a
CPU two at once would only share its cores).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from headlab.errors import InputError, ModelLoadError
from headlab.models.names import DEFAULT, GGUF_MODELS, TINY, gguf_missing, resolve

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Choice:
    """One model of the picker.

    Attributes:
        key: what the picker and the API call it (``minilm``, ``smollm2``...).
        label: its display name, as the model reports it once loaded.
        source: what :func:`headlab.models.load` is given (``None``: the default model).
        causal: whether it is a decoder with its language-model head, as the catalogue tells
            before loading (:func:`headlab.models.names.resolve`).
        missing: why it cannot load here (a package not installed), else ``None``.
    """

    key: str
    label: str
    source: str | None
    causal: bool | None
    missing: str | None = None


def entry_for(source: str | None, missing: str | None = None) -> Choice:
    """The picker's entry for ``source``, as the catalogue names it."""
    name = resolve(source)
    return Choice(
        key=name.key, label=name.display, source=name.source, causal=name.causal, missing=missing
    )


def bundled_choices() -> list[Choice]:
    """The bundled models, in the picker's order."""
    decoders = [entry_for(key, gguf_missing(key)) for key in GGUF_MODELS]
    return [entry_for(None), *decoders, entry_for(TINY)]


class Shelf:
    """Models by key, loaded once on first use.

    Args:
        extra: one more model (a folder, a ``.gguf`` file, a cached model name, or a bundled
            name); it becomes the default choice.
        device: where every model goes (``"cpu"``, ``"cuda"``...).
    """

    def __init__(self, extra: str | None = None, *, device: Any = "cpu") -> None:
        self.device = device
        self.choices: dict[str, Choice] = {c.key: c for c in bundled_choices()}
        self.default = DEFAULT
        self.lock = threading.RLock()
        self._loaded: dict[str, Any] = {}
        if extra is not None:
            self.default = self.add(extra)

    @staticmethod
    def _key_of(source: str) -> str:
        return resolve(source).key

    def add(self, source: str) -> str:
        """Offer ``source`` too (a folder, a ``.gguf`` file, a cached name); its key."""
        entry = entry_for(source)
        self.choices.setdefault(entry.key, entry)
        return entry.key

    def key(self, name: str | None) -> str:
        """The shelf's key for a picker key, a bundled name, or ``None`` (the default)."""
        if name is None or name == "":
            return self.default
        key = self._key_of(name)
        if key not in self.choices:
            raise InputError(f"no model {name!r} here; the explorer has: {', '.join(self.choices)}")
        return key

    def is_loaded(self, name: str | None) -> bool:
        return self.key(name) in self._loaded

    def get(self, name: str | None = None) -> Any:
        """The :class:`~headlab.models.loading.LoadedModel` of ``name``, loading it the first
        time (under :attr:`lock`).

        Raises:
            ModelLoadError: the model is not installed here (a bundled GGUF decoder without its packages).
        """
        key = self.key(name)
        with self.lock:
            if key not in self._loaded:
                self._loaded[key] = self._load(self.choices[key])
            return self._loaded[key]

    def _load(self, choice: Choice) -> Any:
        from headlab.models import load

        if choice.missing:
            raise ModelLoadError(f"{choice.key} is {choice.missing}")
        logger.info("loading %s", choice.label)
        lm = load(choice.source, device=self.device, with_lm_head=bool(choice.causal))
        from headlab.models.seq2seq import is_encoder_decoder

        if is_encoder_decoder(lm):
            raise InputError(
                f"{lm.name} is an encoder-decoder: the explorer shows models with one stack of "
                "layers (`headlab heads TEXT --target TEXT` shows its three head sets)"
            )
        return lm

    def describe(self) -> list[dict[str, Any]]:
        """The picker's entries: key, label, whether a decoder, installed, loaded."""
        out = []
        for c in self.choices.values():
            lm = self._loaded.get(c.key)
            out.append(
                {
                    "key": c.key,
                    "label": c.label if lm is None else lm.name,
                    "causal": c.causal if lm is None else lm.causal,
                    "installed": c.missing is None,
                    "note": c.missing,
                    "loaded": lm is not None,
                    "default": c.key == self.default,
                }
            )
        return out


#: the shelf of :func:`headlab.capture` given a model's name: a notebook loads each model once
_NOTEBOOK_SHELF: Shelf | None = None


def notebook_shelf() -> Shelf:
    """The process-wide shelf :func:`headlab.capture` loads named models from."""
    global _NOTEBOOK_SHELF
    if _NOTEBOOK_SHELF is None:
        _NOTEBOOK_SHELF = Shelf()
    return _NOTEBOOK_SHELF
