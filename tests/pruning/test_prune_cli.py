"""``headlab prune`` end to end: MiniLM on the bundled STS-B sample, a GQA decoder on text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.models.tiny import build

from headlab.cli import main
from headlab.datasets import read_stsb, sample_path
from headlab.models import load
from headlab.pruning.metrics import StsbMetric


@pytest.mark.slow
def test_prune_minilm_writes_a_smaller_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pruned"
    args = ["prune", "--fraction", "0.25", "--step", "0.25", "--limit", "90"]
    assert main([*args, "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    for key in (
        "heads_before",
        "heads_after",
        "params_before",
        "params_after",
        "metric_before",
        "metric_after",
        "time_before_ms",
        "time_after_ms",
    ):
        assert key in res
    assert (res["heads_before"], res["heads_after"]) == (72, 54)
    assert res["params_after"] < res["params_before"] and res["bytes_after"] < res["bytes_before"]
    assert res["metric_after"] == pytest.approx(res["metric_masked"], abs=1e-3)
    assert res["loads_with"] == ["headlab"]
    # the folder loads with headlab and gives the metric the command reported
    small = load(out)
    assert sum(small.layout.heads_per_layer) == 54
    pairs = read_stsb(sample_path("stsb"), limit=90)
    metric = StsbMetric([p for i, p in enumerate(pairs) if i % 3 != 0])
    assert metric.evaluate(small) == pytest.approx(res["metric_after"], abs=1e-3)
    assert json.loads((out / "pruning.json").read_text())["heads_after"] == 54
    # an existing folder is refused before any work
    assert main([*args, "--out", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err


def test_bad_prune_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prune", "--fraction", "1.5", "--out", str(tmp_path / "x")]) == 1
    assert "--fraction must be in (0, 1)" in capsys.readouterr().err
    assert main(["prune", "--fraction", "0.5"]) == 1
    assert "needs --out" in capsys.readouterr().err
    assert main(["prune"]) == 1
    assert "either --fraction" in capsys.readouterr().err


def test_prune_gqa_decoder_on_text_loads_in_transformers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM

    model = build("llama", tmp_path / "llama")
    from transformers import AutoConfig

    # give the tiny model a language-model head so that perplexity is defined
    config = AutoConfig.from_pretrained(str(model))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(model)
    text = tmp_path / "held-out.txt"
    text.write_text(sample_path("treebank").read_text()[:30000].replace("\t", " "))
    out = tmp_path / "small"
    argv = ["prune", "--model", str(model), "--text", str(text), "--fraction", "0.5"]
    assert (
        main([*argv, "--step", "0.5", "--transformers-compatible", "--out", str(out), "--json"])
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["metric"] == "perplexity" and res["units"] == "KV groups"
    assert res["heads_per_layer"] == [2, 2] and res["loads_with"] == ["headlab", "transformers"]
    plain = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert plain.config.num_key_value_heads == 1
    bert = build("bert", tmp_path / "bert")
    assert (
        main(
            [
                "prune",
                "--model",
                str(bert),
                "--fraction",
                "0.5",
                "--out",
                str(tmp_path / "b"),
                "--transformers-compatible",
                "--limit",
                "12",
            ]
        )
        == 1
    )
    assert "cannot load in transformers" in capsys.readouterr().err


def test_a_model_that_cannot_be_pruned_is_refused_before_the_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ALBERT shares one attention module across layers: `prune --out` says so in one line
    before any head is scored (a search on a real model takes minutes to hours)."""
    from tests.models.architectures import build_model
    from tests.models.tiny import tokenizer_path
    from transformers import AutoTokenizer

    from headlab.cli import main

    folder, out = tmp_path / "albert", tmp_path / "pruned"
    build_model("albert").save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True).save_pretrained(
        folder
    )
    capsys.readouterr()  # the save's own progress bar
    assert main(["prune", "--model", str(folder), "--fraction", "0.25", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "one module shared by layers" in err and not out.exists()
