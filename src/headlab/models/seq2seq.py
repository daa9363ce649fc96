"""Encoder-decoders (T5, BART, Marian, mBART, Pegasus, M2M-100, Whisper): their three head sets.

An encoder-decoder has encoder self-attention, decoder self-attention and decoder
cross-attention heads; :class:`~headlab.models.LoadedModel` lists all three in forward order,
each layer named by its kind and its block (``encoder 0``, ``cross 2``). Two ways in:

- :func:`text_encoder`: the encoder alone, as a model of its own (its self-attention heads on
  text, no decoder run): what ``headlab roles`` measures and ``headlab heads`` shows by default;
- :func:`seq2seq_inputs`: a source sentence for the encoder and a target sentence the decoder
  reads (teacher forcing: its start token, then the target's tokens), for the decoder's
  self-attention and its cross-attention from target words to source words.
"""

from __future__ import annotations

from typing import Any

import torch

from headlab.errors import InputError, TooLongError, UnsupportedModelError
from headlab.models.audio import features as heard_features
from headlab.models.audio import time_alignment
from headlab.models.loading import LoadedModel, wrap
from headlab.models.runner import encode
from headlab.models.words import Alignment, align

#: the attention kinds of an encoder-decoder, in the order a user meets them
KINDS = ("encoder", "decoder", "cross")


def is_encoder_decoder(lm: LoadedModel) -> bool:
    return bool(getattr(lm.model.config, "is_encoder_decoder", False)) and any(
        h.kind in KINDS for h in lm.layers
    )


def reads_audio(lm: LoadedModel) -> bool:
    """Whisper-like: the encoder reads a spectrogram, not tokens."""
    return getattr(lm.model, "main_input_name", "input_ids") == "input_features"


#: why a text is needed, in the error for an encoder that hears audio
TEXT_WHY = "roles, reports and pruning are measured on text"


def text_side(lm: LoadedModel, why: str = TEXT_WHY) -> LoadedModel:
    """What reads a text as one stack of layers: an encoder-decoder's encoder (roles, reports,
    pruning and traces measure it; a one-line error for Whisper, whose encoder hears audio,
    saying ``why`` text), any other model as it is."""
    return text_encoder(lm, why) if is_encoder_decoder(lm) else lm


def text_encoder(lm: LoadedModel, why: str = TEXT_WHY) -> LoadedModel:
    """The encoder of an encoder-decoder as a model of its own: its self-attention heads, run
    on text with no decoder input (the same weights: ablating here ablates the full model).

    Raises:
        UnsupportedModelError: an encoder that reads audio (Whisper).
    """
    if reads_audio(lm):
        raise UnsupportedModelError(
            f"{lm.name}: its encoder reads audio (input_features), not text: {why}"
        )
    encoder = lm.model.get_encoder()
    return wrap(encoder, lm.tokenizer, name=f"{lm.name} (encoder)", path=lm.path)


def _start_token(lm: LoadedModel) -> int:
    config = lm.model.config
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(config, "bos_token_id", None)
    if start is None:
        raise InputError(f"{lm.name}: its config names no decoder_start_token_id")
    return int(start)


def target_alignment(lm: LoadedModel, target: str) -> tuple[Alignment, torch.Tensor]:
    """The decoder's input for ``target``: its start token, then the target's tokens (as the
    tokenizer makes targets: ``text_target``), and their words; ``(alignment, ids (1, T))``.
    The start token is a special word of its own."""
    start = _start_token(lm)
    words = align(lm.tokenizer, text=target, max_tokens=None, as_target=True)
    ids = lm.tokenizer(text_target=words.text, truncation=False)["input_ids"]
    limit = lm.max_positions
    if limit is not None and len(ids) + 1 > limit:
        what = "transcript" if reads_audio(lm) else "target"
        raise TooLongError(
            f"the {what} is {len(ids) + 1} tokens long with the start token; {lm.name} takes "
            f"at most {limit} (shorten it: headlab does not truncate silently)"
        )
    alignment = Alignment(
        words=(lm.tokenizer.convert_ids_to_tokens(start), *words.words),
        is_special=(True, *words.is_special),
        token_to_word=(0, *(i + 1 for i in words.token_to_word)),
        word_spans=((-1, -1), *words.word_spans),
        text=words.text,
    )
    return alignment, torch.tensor([[start, *ids]], device=lm.device)


def seq2seq_inputs(
    lm: LoadedModel, source: str | None, target: str, *, sound: Any = None
) -> tuple[dict[str, Any], Alignment, Alignment]:
    """One forward's inputs: ``source`` through the encoder, ``target`` read by the decoder;
    with the source's and the target's word alignments. Whisper hears ``sound``
    (:class:`~headlab.models.audio.Sound`; its source words are moments of time), or else a
    silent (zero) spectrogram: its decoder heads read the text, its cross-attention has
    nothing to show."""
    target_words, decoder_ids = target_alignment(lm, target)
    if reads_audio(lm) and sound is not None:
        heard, real, seconds = heard_features(lm.path, sound, lm.device)
        heard = heard.to(lm.dtype)  # the model's precision (float16, bfloat16...)
        positions = heard.shape[-1] // 2  # the encoder's convolutions halve the frames
        inputs = {"input_features": heard, "decoder_input_ids": decoder_ids}
        return inputs, time_alignment(positions, real, seconds), target_words
    if sound is not None:
        raise InputError(f"{lm.name} reads text, not sound")
    if reads_audio(lm):
        config = lm.model.config
        frames = 2 * int(config.max_source_positions)
        features = torch.zeros(
            1, int(config.num_mel_bins), frames, device=lm.device, dtype=lm.dtype
        )
        source_words = Alignment(
            words=("<audio>",), is_special=(True,), token_to_word=(0,), word_spans=((-1, -1),),
            text="",
        )  # fmt: skip
        inputs = {"input_features": features, "decoder_input_ids": decoder_ids}
        return inputs, source_words, target_words
    if source is None:
        raise InputError(f"{lm.name} needs a source sentence")
    source_words = align(lm.tokenizer, text=source, max_tokens=lm.max_positions)
    inputs = encode(lm, [source_words.text])
    inputs["decoder_input_ids"] = decoder_ids
    return inputs, source_words, target_words
