"""The real default model: all-MiniLM-L6-v2 from its PyPI package, and the heads command."""

from __future__ import annotations

import json

import pytest
import torch

from headlab.cli import main
from headlab.models import HeadCapture, encode, load

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm():
    return load()


def test_default_model_is_minilm_with_6_by_12_heads(minilm) -> None:
    assert minilm.name == "all-MiniLM-L6-v2"
    assert (minilm.n_layers, minilm.n_heads, minilm.head_dim) == (6, 12, 32)
    assert minilm.model.config._attn_implementation != "eager"


def test_minilm_patterns_equal_eager_and_outputs_unchanged(minilm) -> None:
    from transformers import AutoModel

    batch = encode(minilm, ["The chef who trained in Paris prepared the fish carefully.", "Hi."])
    eager = AutoModel.from_pretrained(
        str(minilm.path), local_files_only=True, attn_implementation="eager"
    )
    sdpa = AutoModel.from_pretrained(str(minilm.path), local_files_only=True)
    with torch.no_grad():
        ref = eager(**batch, output_attentions=True)
        plain = sdpa(**batch).last_hidden_state
        with HeadCapture(minilm) as cap:
            hooked = minilm.model(**batch).last_hidden_state
    assert torch.equal(hooked, plain)
    real = batch["attention_mask"].bool()[:, None, :, None]
    for layer in range(6):
        diff = (cap.pattern(layer) - ref.attentions[layer]).abs()
        assert diff[real.expand_as(diff)].max() < 1e-5


def test_heads_command_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["heads", "--json", "--layer", "0", "--layer", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "all-MiniLM-L6-v2" and out["word"] == "prepared"
    assert len(out["heads"]) == 2 * 12
    first = out["heads"][0]
    assert (first["layer"], first["head"]) == (0, 0)
    words = set(
        [
            "The",
            "chef",
            "who",
            "trained",
            "in",
            "Paris",
            "prepared",
            "the",
            "fish",
            "carefully",
            ".",
        ]
    )
    for h in out["heads"]:
        assert len(h["top"]) == 3
        assert all(t["word"] in words for t in h["top"])
        weights = [t["weight"] for t in h["top"]]
        assert weights == sorted(weights, reverse=True)
        assert 0.0 <= h["special"] <= 1.0 and sum(weights) + h["special"] <= 1.0 + 1e-3


def test_heads_command_picks_a_word_of_the_users_sentence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without --word, a sentence of one's own gets its longest word, not the lesson's word."""
    assert main(["heads", "The cat that the dog chased ran away .", "--json", "--layer", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["word"] == "chased"
    assert len(out["heads"]) == 12
    assert main(["heads", "The cat sat on the mat.", "--json", "--layer", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["word"] == "cat"  # not "The": a function word
    assert main(["heads", "...", "--json"]) == 0  # marks alone: the sentence is about them
    assert json.loads(capsys.readouterr().out)["word"] == "."
    assert main(["heads", "   ", "--json"]) == 2  # no sentence: a usage error, one line
    assert "error" in capsys.readouterr().err


def test_heads_command_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["heads", "Hello there", "--word", "fish"]) == 1
    assert "word 'fish' is not in the sentence" in capsys.readouterr().err
    assert main(["heads", "--layer", "6"]) == 1
    assert "--layer 6 out of range" in capsys.readouterr().err
