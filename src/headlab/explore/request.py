"""A ``headlab heads`` request (:class:`headlab.request.Request`): what was asked for (a
sentence, an image or a parse to trace), checked and read before any model loads, and run on
whichever model loads, to one :class:`HeadsResult`.

The command is these calls in order: :class:`HeadsRequest` (its :meth:`~HeadsRequest.check`:
quick one-line errors, then the sound, the image or the parse read), :meth:`HeadsRequest.ready`
(the model, loaded for images or text), :meth:`HeadsRequest.run` (the sentence's table, an
encoder-decoder's of ``kind``; the image's; or the traced word), and the result's
:meth:`~HeadsResult.to_json` or :meth:`~HeadsResult.text`. Nothing here imports torch at import
time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from headlab.datasets.lesson import LESSON_SENTENCE
from headlab.errors import InputError, ModalityError
from headlab.explore.heads_text import heads_text, image_text, patch_grids, trace_text
from headlab.explore.images import image_table
from headlab.explore.table import heads_table
from headlab.progress import NO_PROGRESS, Progress
from headlab.text import Part

if TYPE_CHECKING:
    from headlab.datasets.treebank import TreebankSentence
    from headlab.models.audio import Sound
    from headlab.models.loading import LoadedModel
    from headlab.roles.trace import SentenceTrace

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
    """The options of ``headlab heads``, named as its flags (``layer``: the ``--layer`` s);
    checked on creation (:meth:`check`).

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

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse options that do not go together, then read what the run needs that no model
        does: the ``image``, the parse to ``trace``, the ``audio`` (all before any model
        loads).

        Raises:
            InputError: one line naming the options that clash; an image, parse or sound
                file that cannot be read.
        """
        self._check_options()
        if self.image is not None:
            self.picture  # noqa: B018 (read now, kept for the run)
        elif self.trace:
            self.parse  # noqa: B018
        else:
            self.sound  # noqa: B018

    def _check_options(self) -> None:
        """Refuse options that do not go together, in one line naming them."""
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

    @cached_property
    def sound(self) -> Sound | None:
        """The sound of ``audio`` (``None`` without one), read once.

        Raises:
            InputError: a missing file, or one that is not a PCM WAV file.
        """
        from headlab.models.audio import read_wav

        return None if self.audio is None else read_wav(self.audio)

    @cached_property
    def picture(self) -> Any:
        """The image of ``image`` (an RGB PIL image), read once.

        Raises:
            InputError: a missing file, or one that is not an image.
        """
        from headlab.models.images import open_image

        return open_image(self.image)  # type: ignore[arg-type]

    @cached_property
    def parse(self) -> tuple[TreebankSentence, str]:
        """The parsed sentence to ``trace`` and its word, read once
        (:func:`~headlab.roles.trace.sentence_to_trace`).

        Raises:
            InputError: a parse that cannot be read or a word it does not have.
        """
        from headlab.roles.trace import sentence_to_trace

        return sentence_to_trace(
            self.text, self.word, conllu=self.conllu, sentence_id=self.sentence_id, spacy=self.spacy
        )

    def ready(self, load: Callable[..., LoadedModel]) -> LoadedModel:
        """The model, loaded by ``load(**options)``: ``reads="images"`` for an ``image``.

        Raises:
            ModalityError: an ``image`` for a model that does not read images.
        """
        if self.image is None:
            return load()
        try:
            return load(reads="images")
        except ModalityError as exc:
            raise ModalityError(
                f"{exc}: --image needs a vision model folder (ViT, CLIP)", reads=exc.reads
            ) from None

    def run(
        self,
        lm: LoadedModel,
        progress: Progress = NO_PROGRESS,
        *,
        notify: Callable[[str], None] | None = None,
    ) -> HeadsResult:
        """The heads of the sentence through ``lm`` (an encoder-decoder's of ``kind``, Whisper
        hearing ``audio``), of the ``image``, or the word traced through the parse (an
        encoder-decoder's encoder). One forward pass each, so ``progress`` hears of no stage;
        ``notify`` hears, in a line, that the relation table of a trace is measured now (no
        ``roles`` file: about 20 s).

        Raises:
            InputError: a kind, target, sound, layer, head or word that does not fit ``lm``.
        """
        if self.image is not None:
            table = image_table(
                lm,
                self.picture,
                str(self.image),
                patch=self.patch,
                layers=self.layers_of(lm),
                heads=self.head,
                top=self.top,
            )
            return HeadsResult(kind="image", data=table, top=self.top)
        if self.trace:
            trace = self._trace(lm, notify)
            return HeadsResult(kind="trace", data=trace.to_json(), top=self.top, trace=trace)
        from headlab.models.seq2seq import reads_audio

        self.check_model(lm, self.sound)
        return HeadsResult(
            kind="sentence",
            data=self.sentence_table(lm, self.sound),
            top=self.top,
            model=lm.name,
            hears=reads_audio(lm),
            seconds=None if self.sound is None else self.sound.seconds,
        )

    def _trace(self, lm: LoadedModel, notify: Callable[[str], None] | None) -> SentenceTrace:
        """The word of the parse traced through ``lm``'s heads (an encoder-decoder's encoder:
        the parse is of the source sentence), against the relation table of ``roles`` or one
        measured now."""
        from headlab.models.seq2seq import text_side
        from headlab.roles.trace import MEASURING, relation_table, trace_word

        lm = text_side(lm, why="--trace follows a text's parse")
        if self.roles is None and notify is not None:
            notify(MEASURING)
        relations, source = relation_table(lm, self.roles)
        sentence, word = self.parse
        return trace_word(lm, sentence, word, relations, k=self.top, table_source=source)

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


@dataclass(frozen=True, kw_only=True)
class HeadsResult:
    """What ``headlab heads`` found: the table of a sentence's or an image's heads, or a
    traced word.

    Attributes:
        kind: ``"sentence"``, ``"image"`` or ``"trace"``.
        data: ``headlab heads --json``: the table of a sentence or an image, or the trace's.
        top: words (patches; heads per dependent) per row.
        model, hears, seconds: a sentence's model, whether it hears the sound, its length.
        trace: the traced word (``kind == "trace"``).
    """

    kind: str
    data: dict[str, Any]
    top: int
    model: str | None = None
    hears: bool = False
    seconds: float | None = None
    trace: SentenceTrace | None = None

    def to_json(self) -> dict[str, Any]:
        """``headlab heads --json``."""
        return self.data

    def text(self) -> list[Part]:
        """What a person reads (:mod:`headlab.explore.heads_text`): the table, or the trace."""
        if self.trace is not None:
            return trace_text(self.trace)
        if self.kind == "image":
            return image_text(self.data, self.top)
        return heads_text(
            self.data, self.top, model=self.model, hears=self.hears, seconds=self.seconds
        )

    def grids(self, width: int) -> list[str]:
        """An image's patch grid per head, ``width`` characters at most a line (drawn as they
        are, after :meth:`text`); none for a sentence or a trace."""
        return patch_grids(self.data, width) if self.kind == "image" else []
