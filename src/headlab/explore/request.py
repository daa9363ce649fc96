"""A ``headlab heads`` request: what was asked for (a sentence, an image or a parse to trace),
the checks that need no model, and the table of a sentence for whichever model loads.

The command is these calls in order: :meth:`HeadsRequest.check` (quick one-line errors),
:meth:`HeadsRequest.sound` (Whisper's ``--audio``), the model, :meth:`HeadsRequest.check_model`,
then :meth:`HeadsRequest.sentence_table` (or :func:`~headlab.explore.images.image_table`, or
:func:`~headlab.roles.trace.trace_word`). Nothing here imports torch at import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headlab.datasets.lesson import LESSON_SENTENCE
from headlab.errors import InputError
from headlab.explore.table import heads_table

if TYPE_CHECKING:
    from headlab.models.audio import Sound
    from headlab.models.loading import LoadedModel

#: options of the sentence path that an image does not take, and why
TEXT_ONLY = {
    "word": "--word picks a word of a sentence; with --image the query is the class token "
    "or --patch ROW,COL",
    "trace": "--trace follows a sentence's parse; it does not go with --image",
    "conllu": "--conllu goes with --trace on a sentence, not with --image",
    "sentence_id": "--sentence-id goes with --trace on a sentence, not with --image",
    "spacy": "--spacy goes with --trace on a sentence, not with --image",
    "roles": "--roles goes with --trace on a sentence, not with --image",
    "target": "--target is the sentence an encoder-decoder's decoder reads, not for --image",
    "kind": "--kind picks an encoder-decoder's heads, not for --image",
}
#: options that only ``--trace`` takes
TRACE_ONLY = ("conllu", "sentence_id", "spacy", "roles")


@dataclass(frozen=True, kw_only=True)
class HeadsRequest:
    """The options of ``headlab heads``, named as its flags (``layer``: the ``--layer`` s).

    Attributes:
        text: the sentence (``None``: the lesson's); with ``audio``, the sound's transcript.
        word: the attending word (``None``: chosen from the sentence or the parse).
        target: the sentence an encoder-decoder's decoder reads.
        audio: a WAV file Whisper hears.
        kind: an encoder-decoder's heads: ``encoder``, ``decoder`` or ``cross``.
        layer, head: only these layers and heads (``None``: all).
        top: words (patches; with ``trace``, heads) per row.
        trace: trace the word's dependents in a parse (``conllu``, ``sentence_id``,
            ``spacy``), beside the relation table of ``roles`` (a file, or measured).
        image, patch: an image for a vision model, and its attending patch (row, col).
    """

    text: str | None = None
    word: str | None = None
    target: str | None = None
    audio: str | None = None
    kind: str | None = None
    layer: Sequence[int] | None = None
    head: Sequence[int] | None = None
    top: int = 3
    trace: bool = False
    conllu: str | None = None
    sentence_id: str | None = None
    spacy: bool = False
    roles: str | None = None
    image: str | None = None
    patch: tuple[int, int] | None = None

    def check(self) -> None:
        """Refuse options that do not go together, before anything is read or loaded.

        Raises:
            InputError: one line naming the options that clash.
        """
        if self.image is not None or self.patch is not None:
            if self.image is None:
                raise InputError(
                    "--patch ROW,COL picks a patch of an image: give one with --image FILE"
                )
            if self.text is not None:
                raise InputError("give a sentence or --image FILE, not both")
            for name, why in TEXT_ONLY.items():
                if getattr(self, name):
                    raise InputError(why)
        elif self.trace:
            if self.target or self.kind:
                raise InputError(
                    "--trace follows the sentence's parse through an encoder's heads; --target "
                    "and --kind do not go with it"
                )
            if self.layer or self.head:
                raise InputError("--trace ranks every head; --layer and --head do not go with it")
        else:
            for name in TRACE_ONLY:
                if getattr(self, name):
                    raise InputError(f"--{name.replace('_', '-')} goes with --trace")
            if self.audio is not None and self.text is None:
                raise InputError("--audio needs the transcript: headlab heads 'TEXT' --audio FILE")
        if self.top < 1:
            raise InputError(f"--top must be at least 1, got {self.top}")

    def sound(self) -> Sound | None:
        """The sound of ``audio`` (``None`` without one), read before the model loads.

        Raises:
            InputError: a missing file, or one that is not a PCM WAV file.
        """
        from headlab.models.audio import read_wav

        return None if self.audio is None else read_wav(self.audio)

    def check_model(self, lm: LoadedModel, sound: Sound | None = None) -> None:
        """Refuse ``target``, ``kind`` and a sound for a model with one stack of layers.

        Raises:
            InputError: one of them given for such a model.
        """
        from headlab.models.seq2seq import is_encoder_decoder

        if not is_encoder_decoder(lm) and (self.target or self.kind or sound is not None):
            raise InputError(
                f"--target, --kind and --audio go with encoder-decoder models (T5, BART, "
                f"Whisper...); {lm.name} has one stack of layers"
            )

    def layers_of(self, lm: LoadedModel) -> list[int]:
        """``layer`` (default every layer of ``lm``), checked, and ``head`` checked against the
        most heads of those layers (fewer in some layers of a model pruned layer by layer).

        Raises:
            InputError: a layer or head ``lm`` does not have.
        """
        chosen = list(self.layer or range(lm.n_layers))
        for layer in chosen:
            if not 0 <= layer < lm.n_layers:
                raise InputError(
                    f"--layer {layer} out of range: {lm.name} has layers 0..{lm.n_layers - 1}"
                )
        most = max(lm.layout.heads_per_layer[layer] for layer in chosen)
        for head in self.head or []:
            if not 0 <= head < most:
                raise InputError(f"--head {head} out of range: {lm.name} has heads 0..{most - 1}")
        return chosen

    def sentence_table(self, lm: LoadedModel, sound: Sound | None = None) -> dict[str, Any]:
        """The heads table of the sentence (default the lesson's) through ``lm``, on ``layer``
        (an encoder-decoder's: of ``kind``, :func:`~headlab.explore.seq2seq.seq2seq_table`;
        else :func:`~headlab.explore.table.heads_table`), ``sound`` heard by Whisper.

        Raises:
            InputError: a kind, target, layer, head or word that does not fit the model.
        """
        from headlab.models.seq2seq import is_encoder_decoder

        text = LESSON_SENTENCE if self.text is None else self.text
        if not is_encoder_decoder(lm):
            layers = self.layers_of(lm)
            return heads_table(
                lm, text, word=self.word, layers=layers, heads=self.head, top=self.top
            )
        from headlab.explore.seq2seq import seq2seq_table

        return seq2seq_table(
            lm,
            text,
            target=self.target,
            kind=self.kind,
            word=self.word,
            layers=None if self.layer is None else list(self.layer),
            heads=None if self.head is None else list(self.head),
            top=self.top,
            sound=sound,
            audio=self.audio,
        )
