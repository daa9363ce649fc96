"""An encoder-decoder's heads on one sentence: the table ``headlab heads`` prints for T5, BART,
Marian or Whisper. The encoder's heads on the source, or the decoder's self- and
cross-attention heads on a target; Whisper's encoder on the sound's moments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from headlab.errors import InputError
from headlab.explore.table import default_word, head_rows
from headlab.models.analysis import seq2seq_attention, word_attention
from headlab.models.loading import LoadedModel
from headlab.models.seq2seq import reads_audio, text_encoder


def seq2seq_table(
    lm: LoadedModel,
    text: str,
    *,
    target: str | None = None,
    kind: str | None = None,
    word: str | None = None,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    top: int = 3,
    sound: Any = None,
    audio: str | None = None,
) -> dict[str, Any]:
    """The table of ``headlab heads TEXT --json`` for an encoder-decoder: one row per head of
    ``layers`` (default all) of ``kind`` (``encoder``, ``decoder`` or ``cross``; default: cross
    with a target or a sound, the decoder for a model that hears, else the encoder).

    ``sound`` (:class:`~headlab.models.audio.Sound`, read from the file ``audio``): Whisper hears
    it, ``text`` is its transcript, and a ``word`` such as ``"1.2s"`` is a moment of it.

    Raises:
        InputError: a kind, target, layer, head or word that does not fit the model.
    """
    hears = reads_audio(lm)
    if sound is not None and not hears:
        raise InputError(f"--audio goes with models that hear (Whisper); {lm.name} reads text")
    heard = sound is not None
    default = "cross" if heard or (target and not hears) else "decoder" if hears else "encoder"
    kind = kind or default
    if hears and not heard and kind != "decoder":
        raise InputError(
            f"{lm.name} hears audio: its {kind} heads need sound (--audio FILE.wav); "
            "--kind decoder shows its decoder's heads on the text"
        )
    if hears and target:
        raise InputError(
            f"{lm.name}'s decoder reads the sentence itself, as the transcript of the sound: "
            "give the text without --target"
        )
    target = text if hears else target
    if kind != "encoder" and target is None:
        raise InputError(f"--kind {kind} needs --target TEXT (the sentence the decoder reads)")
    flat = [i for i, h in enumerate(lm.layers) if h.kind == kind]
    blocks = _chosen(lm, layers, heads, flat, kind)
    if heard:  # the encoder's "words" are moments of time
        wa = seq2seq_attention(
            lm, None, cast(str, target), layers=[flat[b] for b in blocks], sound=sound
        )
        at = {block: flat[block] for block in blocks}
    elif kind == "encoder" and target is None:  # the encoder alone: no decoder run
        lm = text_encoder(lm)
        wa = word_attention(lm, text, layers=blocks)
        at = {block: block for block in blocks}
    else:
        # a decoder's kind without a target was refused above
        wa = seq2seq_attention(lm, text, cast(str, target), layers=[flat[b] for b in blocks])
        at = {block: flat[block] for block in blocks}
    queries = wa.words_of(next(iter(at.values())))[0]
    if heard and word is not None and seconds_of(word) is not None:
        if kind != "encoder":
            raise InputError(
                f"{word!r} is a moment of the sound: --kind encoder shows where moments attend; "
                f"{kind} rows are the transcript's words"
            )
        word = _moment(word, queries, lm.path, sound)
    try:
        word = word or default_word(queries.text, queries)
        queries.word_index(word)  # a clear error if the word is missing
    except InputError as exc:
        if kind == "encoder":
            raise
        what = "transcript" if hears else "target"
        raise InputError(
            f"{exc} (the {what}'s: {kind} rows are the words the decoder reads)"
        ) from None
    rows = [{"attention": kind, **row} for row in head_rows(lm, wa, word, at, heads=heads, top=top)]
    return {
        "model": lm.name,
        "text": text,
        "target": target,
        **({"audio": audio, "seconds": round(sound.seconds, 3)} if heard else {}),
        "attention": kind,
        "word": word,
        "heads": rows,
    }


def _chosen(
    lm: LoadedModel, layers: list[int] | None, heads: list[int] | None, flat: list[int], kind: str
) -> list[int]:
    """``layers`` (default all) of ``kind``, checked, and ``heads`` checked."""
    what = f"{kind} layers"
    chosen = layers or list(range(len(flat)))
    for layer in chosen:
        if not 0 <= layer < len(flat):
            raise InputError(
                f"--layer {layer} out of range: {lm.name} has {what} 0..{len(flat) - 1}"
            )
    counts = lm.layout.heads_per_layer  # fewer in some layers of a model pruned layer by layer
    most = max(counts[flat[layer]] for layer in chosen)
    for head in heads or []:
        if not 0 <= head < most:
            raise InputError(f"--head {head} out of range: {lm.name} has heads 0..{most - 1}")
    return chosen


def seconds_of(word: str) -> float | None:
    """``"1.2s"``, ``"1.2"``: a moment in seconds; ``None`` for a word."""
    text = word[:-1] if word.endswith("s") else word
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 and text.replace(".", "", 1).isdigit() else None


def _moment(word: str, positions: Any, folder: Path, sound: Any) -> str:
    """The label of the encoder position that holds moment ``word`` of the sound."""
    config = json.loads((Path(folder) / "preprocessor_config.json").read_text())
    step = 2 * int(config["hop_length"]) / int(config["sampling_rate"])  # seconds a position
    at = seconds_of(word) or 0.0
    index = int(at / step + 1e-9)
    if at >= sound.seconds or index >= len(positions.words) or positions.is_special[index]:
        raise InputError(f"{word!r} is past the end of the sound ({sound.seconds:.3f} s)")
    return str(positions.words[index])
