"""Encoder-decoders through the CLI: ``headlab heads`` shows the encoder's heads on a sentence,
the decoder's self-attention and its cross-attention (target word -> source words) on
``--target``, each equal to HF eager's ``output_attentions`` turned into words by an
independent loop over the tokenizer's own word ids; ``headlab roles`` measures the encoder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.models.architectures import build_model

from headlab.cli import main

SOURCE = "The cat sat on the mat near the door."
TARGET = "Die Katze sass auf der Matte."


def _sharpen(model: Any) -> Any:
    """Random tiny weights spread attention almost evenly: larger queries make each head pick."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", ".q.weight")):
                p.mul_(40.0)
    return model


@pytest.fixture(scope="module", params=["bart", "t5", "marian"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models.tiny import tokenizer_path
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp(request.param) / request.param
    _sharpen(build_model(request.param)).save_pretrained(path, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True).save_pretrained(
        path
    )
    return path


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def _oracle(folder: Path, kind: str, word: str) -> dict[tuple[int, int], list[tuple[str, float]]]:
    """Every head's word weights from HF eager, by loops over the tokenizer's word ids: mean
    over the query word's tokens, sum over each key word's tokens, special tokens and words
    the row cannot see (weight 0: the decoder's later words) left out of the ranking."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = AutoModel.from_pretrained(
        str(folder), local_files_only=True, attn_implementation="eager"
    ).eval()
    src = tok(SOURCE)
    tgt = tok(text_target=TARGET)
    start = model.config.decoder_start_token_id
    decoder_ids = torch.tensor([[start, *tgt["input_ids"]]])
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([src["input_ids"]]),
            decoder_input_ids=decoder_ids,
            output_attentions=True,
        )
    maps = {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions}
    maps["cross"] = out.cross_attentions
    src_words = src.word_ids()
    tgt_words = [None, *tgt.word_ids()]  # the start token first
    q_words, k_words = {
        "encoder": (src_words, src_words),
        "decoder": (tgt_words, tgt_words),
        "cross": (tgt_words, src_words),
    }[kind]
    q_text, k_text = {
        "encoder": (SOURCE, SOURCE),
        "decoder": (TARGET, TARGET),
        "cross": (TARGET, SOURCE),
    }[kind]
    q_names = q_text.replace(".", " .").split()
    k_names = k_text.replace(".", " .").split()
    rows = [i for i, w in enumerate(q_words) if w is not None and q_names[w] == word]
    result = {}
    for block, layer_map in enumerate(maps[kind]):
        pattern = layer_map[0].numpy()  # (H, T, S)
        for head in range(pattern.shape[0]):
            row = pattern[head, rows].mean(axis=0)  # (S,)
            mass: dict[int, float] = {}
            for j, w in enumerate(k_words):
                if w is not None:
                    mass[w] = mass.get(w, 0.0) + float(row[j])
            ranked = sorted(((w, x) for w, x in mass.items() if x > 0), key=lambda kv: -kv[1])
            result[(block, head)] = [(k_names[w], x) for w, x in ranked]
    return result


def _check(heads: list[dict[str, Any]], oracle: dict[Any, list[tuple[str, float]]]) -> None:
    assert len(heads) == len(oracle)
    for h in heads:
        want = oracle[(h["layer"], h["head"])]
        got = [(t["word"], t["weight"]) for t in h["top"]]
        np.testing.assert_allclose([x for _, x in got], [x for _, x in want[:3]], atol=1e-4)
        for i, ((w, _), (v, y)) in enumerate(zip(got, want, strict=False)):
            tied = any(abs(y - z) < 1e-4 for j, (_, z) in enumerate(want) if j != i)
            assert w.lower() == v.lower() or tied  # equal weights may come in either order


@pytest.mark.parametrize("kind", ["cross", "decoder"])
def test_target_words_attend_as_eager_says(
    folder: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _cli(
        capsys, "heads", SOURCE, "--model", str(folder), "--target", TARGET,
        "--kind", kind, "--word", "Katze", "--json",
    )  # fmt: skip
    assert out["attention"] == kind and out["target"] == TARGET
    assert {h["attention"] for h in out["heads"]} == {kind}
    _check(out["heads"], _oracle(folder, kind, "Katze"))
    weights = [h["top"][0]["weight"] for h in out["heads"]]
    assert max(weights) - min(weights) > 0.02  # heads differ: the check is not of flat rows


def test_cross_is_the_default_with_a_target(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _cli(capsys, "heads", SOURCE, "--model", str(folder), "--target", TARGET, "--json")
    assert out["attention"] == "cross"
    assert out["word"] == "Katze"  # the target's longest word: the attending word is a target's


def test_the_encoder_alone_without_a_target(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _cli(capsys, "heads", SOURCE, "--model", str(folder), "--word", "cat", "--json")
    assert out["attention"] == "encoder" and out["target"] is None
    _check(out["heads"], _oracle(folder, "encoder", "cat"))


def test_roles_measure_the_encoder(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["roles", "--model", str(folder), "--no-gap", "--replicates", "0", "--limit", "20"]
    out = _cli(capsys, *args, "--json")
    assert out["model"].endswith("(encoder)")
    assert len(out["heads"]) == 2 * 4  # the encoder's 2 layers x 4 heads, no decoder head


def test_encoder_decoder_mistakes_get_one_line(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["heads", SOURCE, "--model", str(folder), "--kind", "cross"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("--kind cross needs --target TEXT (the sentence the decoder reads)")
    assert len(err.splitlines()) == 1
    assert main(["heads", SOURCE, "--model", str(folder), "--target", TARGET, "--layer", "2"]) == 1
    assert "has cross layers 0..1" in capsys.readouterr().err
    assert main(["heads", SOURCE, "--model", str(folder), "--target", TARGET, "--word", "cat"]) == 1
    assert "word 'cat' is not in the sentence" in capsys.readouterr().err


def test_target_on_a_single_stack_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["heads", SOURCE, "--target", TARGET]) == 1
    err = capsys.readouterr().err.strip()
    assert "--target, --kind and --audio go with encoder-decoder models" in err
    assert len(err.splitlines()) == 1


def test_whisper_shows_its_decoder_and_refuses_what_needs_sound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.models.tiny import tokenizer_path
    from transformers import AutoTokenizer

    path = tmp_path / "whisper"
    build_model("whisper").save_pretrained(path, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True).save_pretrained(
        path
    )
    out = _cli(capsys, "heads", TARGET, "--model", str(path), "--json")
    assert out["attention"] == "decoder" and len(out["heads"]) == 2 * 4
    assert main(["heads", TARGET, "--model", str(path), "--kind", "cross"]) == 1
    assert "hears audio" in capsys.readouterr().err
    assert main(["heads", TARGET, "--model", str(path), "--target", "hello there"]) == 1
    assert "give the text without --target" in capsys.readouterr().err
    for args in (
        ["roles", "--no-gap", "--limit", "5"],
        ["prune", "--curve"],
        ["report", "--out", str(tmp_path / "report"), "--no-gap", "--limit", "5", "--roles-only"],
    ):
        assert main([*args, "--model", str(path)]) == 1
        err = capsys.readouterr().err.strip()
        assert "its encoder reads audio (input_features), not text" in err
        assert len(err.splitlines()) == 1


def test_too_long_for_the_position_table_is_one_line(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """BART's and Marian's position tables hold 64 positions here: a longer source or target
    is refused before the forward (T5's relative positions have no limit)."""
    long = " ".join(["Katze"] * 80)
    for args in (["heads", long], ["heads", SOURCE, "--target", long, "--word", "Katze"]):
        code = main([*args, "--model", str(folder)])
        err = capsys.readouterr().err.strip()
        if folder.name == "t5":
            assert code == 0
            continue
        assert code == 1 and len(err.splitlines()) == 1
        assert "takes at most 64" in err and "shorten it" in err


def test_prune_measures_the_encoder_and_refuses_a_pruned_folder(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pruned"
    assert main(["prune", "--model", str(folder), "--fraction", "0.25", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is an encoder-decoder" in err
    assert "pruning search" not in err and not out.exists()  # refused before any search


def test_trace_and_target_do_not_mix(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["heads", SOURCE, "--model", str(folder), "--target", TARGET, "--trace"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--target and --kind do not go with it" in err


def test_layers_by_name_capture_and_ablate_one_head_set() -> None:
    """``"cross 1"`` is the second cross-attention layer: ablating its heads by name is
    ablating them by index, moves only what the decoder computes after it, and a name the model
    lacks is one line."""
    from tests.models.architectures import inputs

    from headlab.errors import InputError
    from headlab.models import HeadCapture, wrap

    lm = wrap(_sharpen(build_model("bart")), None, name="bart")
    batch = inputs(lm.model)
    flat = [h.name for h in lm.layers].index("cross 1")
    with torch.no_grad():
        plain = lm.model(**batch)
        with HeadCapture(lm, ablate={"cross 1": [0, 2]}, layers=["cross 0"]) as cap:
            named = lm.model(**batch)
        with HeadCapture(lm, ablate={flat: [0, 2]}):
            indexed = lm.model(**batch)
    assert list(cap.records) == [[h.name for h in lm.layers].index("cross 0")]
    assert torch.equal(named.last_hidden_state, indexed.last_hidden_state)
    assert not torch.allclose(named.last_hidden_state, plain.last_hidden_state)
    assert torch.equal(named.encoder_last_hidden_state, plain.encoder_last_hidden_state)
    with pytest.raises(InputError, match="no layer named 'cross 9'"):
        HeadCapture(lm, ablate={"cross 9": [0]})
