"""``headlab kv`` on a tiny Llama (4 query heads on 2 KV heads): the scores against loops over
transformers' eager attention patterns, the choice, the head set written and read back, the
cost measured through the caches, and bad input refused in one line before any model loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.models.tiny import build

from headlab.cli import main
from headlab.datasets.passkey import passkeys
from headlab.errors import InputError
from headlab.experiments.kv import KVRequest, choose, random_heads, read_heads
from headlab.experiments.kv_scores import (
    encode_passkey,
    fillers_for,
    outside_scores,
    retrieval_scores,
)
from headlab.models import LoadedModel, load

SINK, WINDOW = 2, 6


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("llama", tmp_path_factory.mktemp("llama"), lm_head=True)


@pytest.fixture(scope="module")
def lm(folder: Path) -> LoadedModel:
    return load(folder, with_lm_head=True)


@pytest.fixture(scope="module")
def eager(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()


def _patterns(eager: Any, ids: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return [a[0] for a in eager(ids, output_attentions=True).attentions]  # (H, T, S) each


def _group_max(per_head: list[list[float]], group: int) -> list[list[float]]:
    return [
        [max(row[kv * group : (kv + 1) * group]) for kv in range(len(row) // group)]
        for row in per_head
    ]


def test_outside_score_is_the_attention_beyond_sink_and_window(lm: LoadedModel, eager: Any) -> None:
    chunks = [
        torch.randint(5, 1000, (1, 40), generator=torch.Generator().manual_seed(s)) for s in (0, 1)
    ]
    got = outside_scores(lm, chunks, sink=SINK, window=WINDOW)
    sums = [[0.0] * lm.n_heads for _ in range(lm.n_layers)]
    rows = 0
    for ids in chunks:
        patterns = _patterns(eager, ids)
        for i in range(40):
            if i - WINDOW < SINK:  # no key outside the sink and the window yet
                continue
            rows += 1
            for layer, pattern in enumerate(patterns):
                for h in range(lm.n_heads):
                    sums[layer][h] += sum(
                        float(pattern[h, i, j]) for j in range(SINK, i - WINDOW + 1)
                    )
    want = _group_max([[s / rows for s in row] for row in sums], 2)
    torch.testing.assert_close(got, torch.tensor(want, dtype=got.dtype), atol=1e-5, rtol=0)
    assert float(got.min()) > 0.0  # random heads attend everywhere


def test_retrieval_score_counts_argmax_copies_from_the_needle(lm: LoadedModel, eager: Any) -> None:
    prompts = [encode_passkey(lm, p) for p in passkeys(3, fillers_for(lm, 90), (0.2, 0.8), seed=3)]
    got = retrieval_scores(lm, prompts)
    copies = [[0] * lm.n_heads for _ in range(lm.n_layers)]
    answers = 0
    for prompt in prompts:
        ids = prompt.ids[0].tolist()
        assert prompt.answer == ids[-prompt.n_answer :]
        text = lm.tokenizer.decode(ids[prompt.needle_start : prompt.needle_end])
        assert prompt.prompt.key in text.replace(" ", "")  # the span is the needle
        patterns = _patterns(eager, prompt.ids)
        for position in range(len(ids) - prompt.n_answer, len(ids)):
            answers += 1
            for layer, pattern in enumerate(patterns):
                for h in range(lm.n_heads):
                    top = int(pattern[h, position - 1].argmax())
                    inside = prompt.needle_start <= top < prompt.needle_end
                    copies[layer][h] += inside and ids[top] == ids[position]
    want = _group_max([[c / answers for c in row] for row in copies], 2)
    torch.testing.assert_close(got, torch.tensor(want, dtype=got.dtype), atol=0, rtol=0)


def test_choose_takes_the_lowest_scores_and_random_is_seeded() -> None:
    scores = torch.tensor([[0.5, 0.1, 0.9], [0.2, 0.8, 0.05]])
    assert choose(scores, 0.5) == ((0, 1), (1, 0), (1, 2))  # 0.1, 0.2, 0.05
    assert choose(scores, 0.0) == () and len(choose(scores, 1.0)) == 6
    assert random_heads(2, 3, 0.5, seed=1) == random_heads(2, 3, 0.5, seed=1)
    assert len(random_heads(2, 3, 0.5, seed=1)) == 3


def _kv(folder: Path, **flags: Any) -> dict[str, Any]:
    options = {"model": str(folder), "context": 90, "window": WINDOW, "sink": SINK, "texts": 1}
    return KVRequest(**{**options, **flags}).run(load(folder, with_lm_head=True)).to_json()


def test_the_head_set_is_written_and_read_back(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "heads.json"
    duo = tmp_path / "duo"
    first = _kv(folder, fraction=0.5, heads_out=str(out), duo_out=str(duo), passkeys=2)
    saved = read_heads(str(out))
    assert saved["streaming"] == first["streaming"] and len(first["streaming"]) == 2
    streaming = {tuple(h) for h in first["streaming"]}
    assert saved["full_attention_heads"] == [
        [int((layer, h) not in streaming) for h in range(2)] for layer in range(2)
    ]
    both = torch.maximum(*(torch.tensor(first["scores"][k]) for k in ("outside", "retrieval")))
    lowest = choose(both, 0.5)  # the default score: a head is needed when either says so
    # DuoAttention's loader reads its pattern with np.loadtxt(..., delimiter="\t")
    matrix = np.loadtxt(duo / "full_attention_heads.tsv", dtype=float, delimiter="\t")
    assert matrix.tolist() == saved["full_attention_heads"]
    assert json.loads((duo / "config.json").read_text()) == {
        "sink_size": SINK,
        "recent_size": WINDOW,
    }
    assert [list(h) for h in lowest] == first["streaming"]
    again = _kv(folder, heads_from=str(out))
    assert again["streaming"] == first["streaming"] and again["scores"] == {}
    assert again["kv_bytes"] == first["kv_bytes"]
    assert again["kv_bytes"]["mixed"] < again["kv_bytes"]["full"]
    # two heads of four keep SINK + WINDOW - 1 of the 90 tokens: float32 keys and values
    per_token = 2 * 8 * 4
    saved_bytes = 2 * (90 - (SINK + WINDOW - 1)) * per_token
    assert first["kv_bytes"]["full"] - first["kv_bytes"]["mixed"] == saved_bytes


def test_no_streaming_head_is_the_full_cache(folder: Path) -> None:
    data = _kv(folder, fraction=0.0, passkeys=1)
    assert data["streaming"] == []
    assert data["kv_bytes"]["mixed"] == data["kv_bytes"]["full"]
    assert data["perplexity"]["mixed"] == pytest.approx(data["perplexity"]["full"], rel=1e-6)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--window", "200", "--context", "100"], "--window 200"),
        (["--fraction", "1.5"], "--fraction"),
        (["--context", "500"], "--context 500 is longer than the model's 128"),
        (["--heads-out", "x.txt"], "--heads-out"),
    ],
)
def test_bad_input_is_one_line_before_loading(
    folder: Path, flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["kv", "--model", str(folder), *flags])
    err = capsys.readouterr().err.strip()
    assert code in (1, 2) and len(err.splitlines()) == 1 and said in err


def test_a_model_without_lm_head_is_refused(tmp_path: Path) -> None:
    encoder = build("bert", tmp_path / "bert")
    with pytest.raises(InputError, match="not a causal language model"):
        KVRequest(model=str(encoder), context=64, window=8)


def test_a_foreign_heads_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "h.json"
    bad.write_text(json.dumps({"streaming": [[0, 1]]}))
    with pytest.raises(Exception, match="headlab kv --heads-out"):
        KVRequest(heads_from=str(bad))


def test_the_curve_measures_each_choice_through_the_caches(folder: Path) -> None:
    """Fraction 0 is the full cache; every point's bytes are what its streaming heads keep; a
    whole set of streaming heads with a window past the prompt loses no passkey it had."""
    data = _kv(folder, fraction=0.5, passkeys=2, curve=(0.5, 1.0), decode=3)
    curve = data["curve"]
    assert [(p["choice"], p["fraction"]) for p in curve] == [
        ("full", 0.0),
        ("both", 0.5),
        ("random", 0.5),
        ("both", 1.0),
        ("random", 1.0),
    ]
    full = curve[0]
    assert full["kv_bytes"] == data["kv_bytes"]["full"]
    assert full["perplexity"] == pytest.approx(data["perplexity"]["full"], rel=1e-9)
    per_token = 2 * 8 * 4
    for point in curve[1:]:
        streaming = round(point["fraction"] * 4)
        saved = streaming * (90 - (SINK + WINDOW - 1)) * per_token
        assert full["kv_bytes"] - point["kv_bytes"] == saved
        assert 0.0 <= point["passkey"] <= 1.0 and point["ms_per_token"] > 0
    assert curve[3]["perplexity"] == pytest.approx(curve[4]["perplexity"], rel=1e-9)  # all heads
