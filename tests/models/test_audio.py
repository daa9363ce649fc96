"""Whisper hears a sound: ``headlab heads TRANSCRIPT --audio FILE.wav`` shows where each word
of the transcript listens (cross-attention) and where each moment of the sound attends
(encoder), in seconds; every head's weights equal HF eager's on features made independently
by the folder's own feature extractor."""

from __future__ import annotations

import json
import math
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.models.architectures import build_model

from headlab.cli import main

TEXT = "The cat sat."
RATE, HOP = 16000, 1000  # the tiny extractor: 16 frames a second, 2 per encoder position


def _wav(path: Path, samples: np.ndarray, rate: int = RATE, channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(np.repeat((samples * 20000).astype(np.int16), channels).tobytes())
    return path


def _tone(seconds: float, rate: int = RATE) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 440 * t) * np.exp(-3 * t)).astype(np.float32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models.tiny import tokenizer_path
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    path = tmp_path_factory.mktemp("whisper") / "whisper"
    model = build_model("whisper")
    with torch.no_grad():  # random tiny weights spread attention evenly: sharpen the queries
        for name, p in model.named_parameters():
            if name.endswith("q_proj.weight"):
                p.mul_(40.0)
    model.save_pretrained(path, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True).save_pretrained(
        path
    )
    extractor = WhisperFeatureExtractor(
        feature_size=8, sampling_rate=RATE, hop_length=HOP, chunk_length=1, n_fft=2 * HOP
    )
    extractor.save_pretrained(path)
    return path


def _oracle(folder: Path, samples: np.ndarray, kind: str, rows: list[int]) -> np.ndarray:
    """``(heads, positions)`` weights of every layer of ``kind`` from HF eager, the query
    rows ``rows`` averaged, on features from the folder's extractor."""
    from transformers import AutoModel, AutoTokenizer, WhisperFeatureExtractor

    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    extractor = WhisperFeatureExtractor.from_pretrained(str(folder), local_files_only=True)
    model = AutoModel.from_pretrained(
        str(folder), local_files_only=True, attn_implementation="eager"
    ).eval()
    feats = extractor(samples, sampling_rate=RATE, return_tensors="pt")["input_features"]
    ids = [model.config.decoder_start_token_id, *tok(text_target=TEXT)["input_ids"]]
    with torch.no_grad():
        out = model(
            input_features=feats, decoder_input_ids=torch.tensor([ids]), output_attentions=True
        )
    maps = out.cross_attentions if kind == "cross" else out.encoder_attentions
    return np.stack([m[0][:, rows].mean(1).numpy() for m in maps])  # (layers, heads, S)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def _check(heads: list[dict[str, Any]], oracle: np.ndarray, real: int) -> None:
    for h in heads:
        row = oracle[h["layer"], h["head"]]  # (S,)
        order = [int(j) for j in np.argsort(-row[:real], kind="stable")[:3]]
        want = [(f"{j * 2 * HOP / RATE:.2f}s", float(row[j])) for j in order]
        got = [(t["word"], t["weight"]) for t in h["top"]]
        # 4 decimals in the JSON, and float32 scores of sharpened queries: 2e-4
        np.testing.assert_allclose([x for _, x in got], [x for _, x in want], atol=2e-4)
        for (w, x), (v, _) in zip(got, want, strict=True):  # near-equal weights may swap
            assert w == v or any(abs(x - y) < 2e-4 for u, y in want if u != v)
        assert h["special"] == pytest.approx(float(row[real:].sum()), abs=2e-4)  # the padding


def test_each_word_listens_as_eager_says(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = _tone(0.5)
    wav = _wav(tmp_path / "tone.wav", samples)
    args = ["--word", "cat", "--json"]
    out = _cli(capsys, "heads", TEXT, "--model", str(folder), "--audio", str(wav), *args)
    assert out["attention"] == "cross" and len(out["heads"]) == 2 * 4
    assert out["audio"] == str(wav) and out["seconds"] == 0.5
    real = math.ceil(len(samples) / (2 * HOP))  # 4 positions of sound, then silence
    # "cat" is the second word the decoder reads: after the start token, [CLS] and "The"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    words = tok(text_target=TEXT).word_ids()
    rows = [i + 1 for i, w in enumerate(words) if w == 1]
    _check(out["heads"], _oracle(folder, samples, "cross", rows), real)
    weights = [h["top"][0]["weight"] for h in out["heads"]]
    assert max(weights) - min(weights) > 0.02  # heads differ: the check is not of flat rows


def test_each_moment_attends_in_the_encoder(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = _tone(0.5)
    wav = _wav(tmp_path / "tone.wav", samples)
    args = ["--kind", "encoder", "--word", "0.25s", "--json"]
    out = _cli(capsys, "heads", TEXT, "--model", str(folder), "--audio", str(wav), *args)
    assert out["word"] == "0.25s"
    _check(out["heads"], _oracle(folder, samples, "encoder", [2]), 4)


def test_another_rate_and_stereo_are_resampled(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wav = _wav(tmp_path / "stereo.wav", _tone(0.5, 8000), rate=8000, channels=2)
    out = _cli(capsys, "heads", TEXT, "--model", str(folder), "--audio", str(wav), "--json")
    times = {t["word"] for h in out["heads"] for t in h["top"]}
    assert times <= {"0.00s", "0.12s", "0.25s", "0.38s"}  # 0.5 s: the first 4 positions


def test_sound_mistakes_get_one_line(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a sound")
    long = _wav(tmp_path / "long.wav", _tone(2.0))
    bart = tmp_path / "bart"
    build_model("bart").save_pretrained(bart, safe_serialization=True)
    from tests.models.tiny import tokenizer_path
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True).save_pretrained(
        bart
    )
    capsys.readouterr()
    cases = [
        (["heads", TEXT, "--audio", str(text)], "is not a PCM WAV file"),
        (["heads", TEXT, "--audio", str(tmp_path / "none.wav")], "no sound file at"),
        (
            ["heads", TEXT, "--audio", str(long)],
            "the sound is 2.000 s long; this model hears 1.000 s",
        ),
        (["heads", "--audio", str(long)], "--audio needs the transcript"),
    ]
    for args, message in cases:
        assert main([*args, "--model", str(folder)]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    assert main(["heads", TEXT, "--model", str(bart), "--audio", str(long)]) == 1
    assert "--audio goes with models that hear (Whisper)" in capsys.readouterr().err


def test_moments_by_any_time_and_halves_of_precision(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--word 0.3s`` is the position holding 0.3 s (0.25-0.375 s here); a moment after the
    sound, or a moment where rows are words, is one line; a bfloat16 model hears the same."""
    wav = str(_wav(tmp_path / "tone.wav", _tone(0.5)))
    base = ["heads", TEXT, "--model", str(folder), "--audio", wav, "--json"]
    out = _cli(capsys, *base, "--kind", "encoder", "--word", "0.3s")
    assert out["word"] == "0.25s"
    for extra, message in (
        (["--kind", "encoder", "--word", "0.9s"], "past the end of the sound (0.500 s)"),
        (["--word", "0.3s"], "is a moment of the sound: --kind encoder"),
    ):
        assert main([*base, *extra]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err
    full = _cli(capsys, *base)
    half = _cli(capsys, *base, "--dtype", "bfloat16")
    for a, b in zip(full["heads"], half["heads"], strict=True):
        assert abs(a["top"][0]["weight"] - b["top"][0]["weight"]) < 0.03
