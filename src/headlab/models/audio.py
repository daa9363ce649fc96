"""Sound for Whisper's heads: a WAV file, its log-mel features, and the encoder's positions as
moments of time (the "words" a transcript's words listen to through cross-attention).

Whisper's encoder reads a fixed window (30 s in the released models) of log-mel frames, padded
with silence; two convolutions halve the frames, so each encoder position covers
``2 * hop_length`` samples (20 ms at 16 kHz). Positions past the end of the sound are the
padding: shown apart, like a sentence's special tokens.
"""

from __future__ import annotations

import math
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headlab.errors import InputError, ModelLoadError
from headlab.models.words import Alignment

#: the label of encoder positions after the end of the sound
PADDING = "(silence)"


@dataclass(frozen=True, kw_only=True)
class Sound:
    """One mono sound: ``samples`` (float32 in [-1, 1]) at ``rate`` samples per second."""

    samples: np.ndarray
    rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate


def read_wav(path: str | Path) -> Sound:
    """A PCM WAV file (8, 16 or 32-bit integers, any number of channels, averaged to mono).

    Raises:
        InputError: a missing file, or one that is not a PCM WAV file.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no sound file at {path} (expected a PCM .wav file)")
    try:
        with wave.open(str(path), "rb") as f:
            width, channels, rate = f.getsampwidth(), f.getnchannels(), f.getframerate()
            raw = f.readframes(f.getnframes())
    except (wave.Error, EOFError) as exc:
        if "unknown format: 3" in str(exc):
            raise InputError(
                f"{path} holds floating-point samples; headlab reads integer PCM"
            ) from None
        why = f" ({exc})" if str(exc) else ""
        raise InputError(f"{path} is not a PCM WAV file{why}") from None
    kinds = {1: (np.uint8, 128.0, 128.0), 2: (np.int16, 0.0, 32768.0), 4: (np.int32, 0.0, 2.0**31)}
    if width not in kinds:
        raise InputError(f"{path}: {8 * width}-bit samples; headlab reads 8, 16 or 32-bit PCM")
    dtype, offset, scale = kinds[width]
    data = (np.frombuffer(raw, dtype=dtype).astype(np.float32) - offset) / scale
    data = data.reshape(-1, channels).mean(axis=1)  # (samples,)
    if data.size == 0:
        raise InputError(f"{path} holds no sound")
    return Sound(samples=data, rate=rate)


def features(folder: Path, sound: Sound, device: Any) -> tuple[torch.Tensor, int, float]:
    """The folder's feature extractor on ``sound``: ``(input_features (1, mels, frames),
    encoder positions that hold sound, seconds per encoder position)``. A sound at another
    rate is resampled linearly to the extractor's; a longer one than the window is refused.

    Raises:
        ModelLoadError: a folder without a feature extractor (preprocessor_config.json).
        InputError: a sound longer than the model's window.
    """
    from transformers import AutoFeatureExtractor

    if not (folder / "preprocessor_config.json").is_file():
        raise ModelLoadError(
            f"{folder} has no preprocessor_config.json (the feature extractor that turns sound "
            "into the model's log-mel frames)"
        )
    try:
        extractor = AutoFeatureExtractor.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise ModelLoadError(f"{folder}: cannot read its feature extractor ({detail})") from None
    rate = int(extractor.sampling_rate)
    samples = sound.samples
    if sound.rate != rate:  # linear interpolation onto the extractor's clock
        times = np.arange(round(len(samples) * rate / sound.rate)) / rate
        samples = np.interp(times, np.arange(len(samples)) / sound.rate, samples)
    window = int(extractor.n_samples)
    if len(samples) > window:
        raise InputError(
            f"the sound is {len(samples) / rate:.3f} s long; this model hears {window / rate:.3f} s "
            "at a time (cut it: headlab does not truncate silently)"
        )
    out = extractor(samples.astype(np.float32), sampling_rate=rate, return_tensors="pt")
    per_position = 2 * int(extractor.hop_length)  # the encoder's convolutions halve the frames
    real = math.ceil(len(samples) / per_position)
    return out["input_features"].to(device), real, per_position / rate


def time_alignment(n_positions: int, real: int, seconds: float) -> Alignment:
    """The encoder's positions as words: ``"1.24s"`` (each position's start) while there is
    sound, :data:`PADDING` (special) after it."""
    words = tuple(f"{i * seconds:.2f}s" if i < real else PADDING for i in range(n_positions))
    return Alignment(
        words=words,
        is_special=tuple(i >= real for i in range(n_positions)),
        token_to_word=tuple(range(n_positions)),
        word_spans=((-1, -1),) * n_positions,
        text="",
    )
