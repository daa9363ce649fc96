"""Models bigger than one device (``--device-map``, ``--max-memory``, ``--offload-folder``):
tiny models whose layers a small CPU budget splits between the CPU and disk offload give what
the same model gives on one device: captures, ablation, ``headlab roles --json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.models.tiny import build

from headlab.cli import main
from headlab.datasets import read_stsb, sample_path
from headlab.errors import InputError, PruningError
from headlab.models import HeadCapture, encode, load
from headlab.models.dispatch import Placement, parse_max_memory, parse_size, placement_from_options
from headlab.pruning.importance import gradient_importance
from headlab.pruning.metrics import StsbMetric
from headlab.pruning.physical import prune_model

#: wide MLPs make each layer ~1.5 MB beside the 3.9 MB embeddings, so that a CPU budget of
#: 8 MB holds the embeddings and the first layer(s) and sends the rest to disk
WIDE = {"intermediate_size": 4096, "num_hidden_layers": 4}
BUDGET = "cpu=8MB"
SENTENCES = ["The chef prepared the fish.", "A dog barked at the mail carrier yesterday."]


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("wide")
    return {family: build(family, folder / family, **WIDE) for family in ("bert", "llama")}


def _split(folder: Path, offload: Path) -> Any:
    placement = placement_from_options(None, BUDGET, str(offload))
    return load(folder, placement=placement)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_layers_split_between_cpu_and_disk_capture_and_ablate_as_on_one_device(
    wide: dict[str, Path], family: str, tmp_path: Path
) -> None:
    one = load(wide[family])
    split = _split(wide[family], tmp_path / "offload")
    assert split.device_map is not None
    places = set(split.device_map.values())
    assert places == {"cpu", "disk"}, split.device_map
    assert split.device.type == "cpu"
    # the disk's layers hold no weights in memory between forward passes (transformers reads
    # them from the model's own safetensors files, or from the offload folder)
    on_disk = [name for name, device in split.device_map.items() if device == "disk"]
    params = [p for name in on_disk for p in split.model.get_submodule(name).parameters()]
    assert params and all(p.device.type == "meta" for p in params)
    batch = encode(one, SENTENCES)
    ablate = {1: [0, 2], 3: [1]}
    outputs = []
    for lm in (one, split):
        with torch.inference_mode(), HeadCapture(lm) as cap:
            hidden = lm.model(**batch).last_hidden_state
        with torch.inference_mode(), HeadCapture(lm, ablate=ablate):
            ablated = lm.model(**batch).last_hidden_state
        with torch.no_grad():
            parts = {
                "hidden": hidden,
                "ablated": ablated,
                **cap.activations(),
                **{f"pattern.{layer}": cap.pattern(layer) for layer in range(lm.n_layers)},
                **{f"contrib.{layer}": cap.contributions(layer) for layer in range(lm.n_layers)},
            }
        outputs.append(parts)
    ref, got = outputs
    assert ref.keys() == got.keys()
    for key in ref:
        assert torch.equal(ref[key], got[key]), key
    assert not torch.equal(ref["hidden"], ref["ablated"])  # the ablation did something


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_roles_json_with_offloaded_layers_equals_one_device(
    wide: dict[str, Path], family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["roles", "--model", str(wide[family]), "--limit", "12", "--replicates", "3"]
    assert main([*argv, "--device", "cpu", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    split = ["--max-memory", BUDGET, "--offload-folder", str(tmp_path / "off"), "--json"]
    assert main([*argv, *split]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == one


def test_explicit_map_inline_and_from_a_file(wide: dict[str, Path], tmp_path: Path) -> None:
    mapping = {
        "embed_tokens": "cpu",
        "layers.0": "cpu",
        "layers.1": "disk",
        "layers.2": "cpu",
        "layers.3": "disk",
        "norm": "cpu",
        "rotary_emb": "cpu",
    }
    file = tmp_path / "map.json"
    file.write_text(json.dumps(mapping))
    one = load(wide["llama"])
    batch = encode(one, SENTENCES)
    with torch.inference_mode():
        ref = one.model(**batch).last_hidden_state
    for text in (json.dumps(mapping), str(file)):
        placement = placement_from_options(text, None, str(tmp_path / "off"))
        lm = load(wide["llama"], placement=placement)
        assert lm.device_map == mapping
        with torch.inference_mode():
            assert torch.equal(lm.model(**batch).last_hidden_state, ref)


def test_physical_pruning_of_offloaded_weights_is_refused(
    wide: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lm = _split(wide["bert"], tmp_path / "off")
    with pytest.raises(PruningError, match="offloaded"):
        prune_model(lm, {3: [0]})
    out = tmp_path / "pruned"
    argv = ["prune", "--model", str(wide["bert"]), "--fraction", "0.25", "--out", str(out)]
    assert main([*argv, "--max-memory", BUDGET, "--offload-folder", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "offloaded" in err and "physical pruning" in err
    assert not out.exists()


def test_sizes_and_budgets_parse() -> None:
    assert parse_size("20GiB") == 20 * 2**30
    assert parse_size("1.5 GB") == 1_500_000_000
    assert parse_size("512") == 512
    assert parse_max_memory("cpu=64GiB, disk=1GB".replace(", disk=1GB", "")) == {"cpu": 64 * 2**30}
    assert parse_max_memory("0=20GiB,cuda:1=20GiB,cpu=64GiB") == {
        0: 20 * 2**30,
        1: 20 * 2**30,
        "cpu": 64 * 2**30,
    }
    assert placement_from_options(None, None, None) is None
    assert placement_from_options("sequential", None, None) == Placement("sequential")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-memory", "cpu=lots"], "--max-memory cpu: cannot read the size 'lots'"),
        (["--max-memory", "cpu"], "expected DEVICE=SIZE items separated by commas"),
        (["--max-memory", "cpu=1GB,cpu=2GB"], "--max-memory names 'cpu' twice"),
        (["--max-memory", "tpu=1GB"], "unknown device 'tpu'"),
        (["--max-memory", "disk=1GB"], "disk has no budget"),
        (["--max-memory", "7=1GB"], "names GPU 7; this machine has"),
        (["--device-map", "everywhere"], "is none of these"),
        (["--device-map", '{"layers.0": "tpu"}'], "unknown device 'tpu'"),
        (["--device-map", "{not json"], "not valid JSON"),
        (["--device-map", '{"layers.9": "cpu"}'], "names 'layers.9', which"),
        (["--device-map", '{"layers": "cpu"}'], "places no device for"),
        (["--device-map", '{"": "disk"}'], "need --offload-folder DIR"),
        (["--max-memory", "cpu=100KB"], "cannot hold one layer (layers."),
        (["--device-map", "auto", "--device", "cpu"], "--device (one device) or --device-map"),
    ],
)
def test_bad_placement_is_a_one_line_error_before_loading(
    wide: dict[str, Path], flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["roles"], ["heads"]):
        assert main([*command, "--model", str(wide["llama"]), *flags, "--json"]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith("headlab: error: ") and captured.err.count("\n") == 1
        assert message in captured.err, captured.err


def test_a_strategy_needs_no_split_modules(
    wide: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers.models.llama.modeling_llama import LlamaPreTrainedModel

    monkeypatch.setattr(LlamaPreTrainedModel, "_no_split_modules", None)
    with pytest.raises(InputError, match="no _no_split_modules"):
        load(wide["llama"], placement=Placement("auto"))
    assert main(["roles", "--model", str(wide["llama"]), "--device-map", "balanced"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot split it; give an explicit JSON map" in err


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_roles_with_layers_on_two_gpus_match_one_device(
    wide: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each layer's statistics run on its own GPU; the sums meet at the end."""
    mapping = {"embed_tokens": 0, "layers.0": 0, "layers.1": 1, "layers.2": 0, "layers.3": 1}
    mapping |= {"norm": 1, "rotary_emb": 0}
    argv = ["roles", "--model", str(wide["llama"]), "--limit", "12", "--replicates", "3"]
    assert main([*argv, "--device", "cpu", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert main([*argv, "--device-map", json.dumps(mapping), "--json"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert [h["role"] for h in two["heads"]] == [h["role"] for h in one["heads"]]
    for a, b in zip(one["heads"], two["heads"], strict=True):
        for key, value in a["scores"].items():
            if value is not None:
                assert b["scores"][key] == pytest.approx(value, abs=1e-4), key


@pytest.mark.slow
def test_gradient_and_ablation_importance_through_offloaded_layers(
    wide: dict[str, Path], tmp_path: Path
) -> None:
    """Gradients backpropagate through layers whose weights live on disk: the same importance
    as on one device."""
    pairs = read_stsb(sample_path("stsb"), limit=8)
    scores = []
    for lm in (load(wide["bert"]), _split(wide["bert"], tmp_path / "off")):
        metric = StsbMetric(pairs, batch=4)
        scores.append((gradient_importance(lm, metric), metric.evaluate(lm, {1: [0], 2: [3]})))
    (grad, value), (grad_split, value_split) = scores
    assert torch.equal(grad.isnan(), grad_split.isnan())
    torch.testing.assert_close(grad_split, grad, rtol=1e-5, atol=1e-7, equal_nan=True)
    assert value_split == pytest.approx(value, abs=1e-6)
