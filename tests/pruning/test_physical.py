"""Physical pruning on every family: the smaller model computes what the masked one computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.models.tiny import FAMILIES, build

from headlab.errors import OutputExistsError, PruningError
from headlab.models import HeadCapture, encode, load
from headlab.pruning import head_ids, prune_model, save_pruned
from headlab.pruning.cost import count_parameters

TEXTS = ["The chef who trained in Paris prepared the fish carefully.", "Short one."]


def _removal(lm) -> dict[int, list[int]]:
    """A valid removal for any layout: one head (MHA) or one KV group (GQA) per layer, and
    under GQA with groups of 2+ also the same head from every remaining group in layer 1."""
    n, kv = lm.layout.heads_per_layer[0], lm.layout.kv_heads_per_layer[0]
    if kv == n:
        return {0: [0], 1: [1, 2]}
    group = n // kv
    if kv == 1:  # MQA: the same number from the single group
        return {0: [0], 1: [1, 2]}
    return {0: list(range(group)), 1: [g * group for g in range(kv)] if group > 1 else [0]}


def _hidden(lm, batch):
    with torch.no_grad():
        return lm.model(**batch).last_hidden_state


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_pruned_equals_masked_and_reloads(tmp_path: Path, family: str) -> None:
    lm = load(build(family, tmp_path / "src"))
    batch = encode(lm, TEXTS)
    remove = _removal(lm)
    with HeadCapture(lm, ablate=remove, record_queries_keys=False, record_head_outputs=False):
        masked = _hidden(lm, batch)
    before = count_parameters(lm.model)
    small = prune_model(lm, remove)
    pruned = _hidden(small, batch)
    real = batch["attention_mask"].bool()
    assert (pruned - masked).abs()[real].max() < 1e-5
    assert count_parameters(small.model) < before
    heads = [len(v) for v in remove.values()]
    assert sum(small.layout.heads_per_layer) == sum(lm.layout.heads_per_layer) - sum(heads)
    # head ids remember which original heads survived
    assert head_ids(small)[0] == [h for h in range(lm.n_heads) if h not in remove[0]]
    out = save_pruned(small, tmp_path / "out")
    again = load(out)
    assert again.layout.heads_per_layer == small.layout.heads_per_layer
    assert (_hidden(again, batch) - pruned).abs()[real].max() < 1e-6
    # pruning again, in current indices, keeps mapping to the original ids
    if lm.layout.kv_heads_per_layer[0] == lm.n_heads:
        twice = prune_model(again, {1: [0]})
        assert head_ids(twice)[1] == head_ids(small)[1][1:]


def test_uniform_llama_pruning_loads_in_transformers(tmp_path: Path) -> None:
    from transformers import AutoModel

    lm = load(build("llama", tmp_path / "src"))  # 4 heads, 2 KV groups per layer
    batch = encode(lm, TEXTS)
    small = prune_model(lm, {0: [0, 1], 1: [2, 3]})  # one whole group from every layer
    assert small.model.config.headlab_pruned["native"] is True
    out = save_pruned(small, tmp_path / "out")
    plain = AutoModel.from_pretrained(str(out), local_files_only=True).eval()
    assert plain.config.num_attention_heads == 2 and plain.config.num_key_value_heads == 1
    with torch.no_grad():
        ref = plain(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert (ref - _hidden(small, batch)).abs()[real].max() < 1e-5


def test_bert_pruning_is_headlab_only(tmp_path: Path) -> None:
    lm = load(build("bert", tmp_path / "src"))
    small = prune_model(lm, {0: [1]})
    assert small.model.config.headlab_pruned["native"] is False


def test_bad_requests_are_clear_errors(tmp_path: Path) -> None:
    lm = load(build("llama", tmp_path / "src"))  # 4 heads in 2 groups of 2
    with pytest.raises(PruningError, match="layer 0: removing all 4 heads"):
        prune_model(lm, {0: [0, 1, 2, 3]})
    with pytest.raises(PruningError, match=r"unequal query heads \[1, 2\]"):
        prune_model(lm, {0: [0]})
    with pytest.raises(PruningError, match=r"head indices must be in \[0, 4\)"):
        prune_model(lm, {1: [7]})
    # nothing was changed by the refused requests
    assert lm.layout.heads_per_layer == (4, 4) or list(lm.layout.heads_per_layer) == [4, 4]
    assert lm.model.layers[0].self_attn.q_proj.out_features == 4 * lm.head_dim


def test_saving_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lm = load(build("bert", tmp_path / "src"))
    small = prune_model(lm, {0: [0]})
    target = tmp_path / "out"
    save_pruned(small, target)
    with pytest.raises(OutputExistsError, match="already exists"):
        save_pruned(small, target)

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(small.tokenizer, "save_pretrained", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        save_pruned(small, tmp_path / "half")
    assert not (tmp_path / "half").exists()
    with pytest.raises(RuntimeError):
        save_pruned(small, target, overwrite=True)
    # the earlier complete model is untouched, and no temporary folders are left behind
    assert (target / "config.json").is_file() and load(target).layout.heads_per_layer[0] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]


def test_cli_on_a_model_pruned_layer_by_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """headlab heads shows each layer's remaining heads (the report: tests/report)."""
    import json

    from headlab.cli import main

    small = prune_model(load(build("bert", tmp_path / "src")), {0: [0, 2], 1: [1]})
    counts = list(small.layout.heads_per_layer)
    out = save_pruned(small, tmp_path / "small")
    assert main(["heads", "The cat sat on the mat.", "--model", str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["heads"]
    for layer, count in enumerate(counts):
        assert [h["head"] for h in shown if h["layer"] == layer] == list(range(count))
    # each head keeps its id in the unpruned model (4 heads; 0 and 2 of layer 0, 1 of layer 1 gone)
    kept = {0: [1, 3], 1: [0, 2, 3]}
    for layer, ids in kept.items():
        assert [h["original_head"] for h in shown if h["layer"] == layer] == ids
    assert main(["heads", "--model", str(out), "--head", str(max(counts)), "--json"]) == 1
    assert "out of range" in capsys.readouterr().err


def _llama_1b_shape(folder: Path) -> Path:
    """A tiny Llama with Llama-3.2-1B's proportions: 32 heads in 8 KV groups of 4, width 32 D."""
    FAMILIES.setdefault(
        "llama-1b-shape",
        {
            "model_type": "llama",
            "hidden_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 64,
            "max_position_embeddings": 128,
        },
    )
    try:
        return build("llama-1b-shape", folder)
    finally:
        del FAMILIES["llama-1b-shape"]


def test_gqa_pruning_to_a_count_that_does_not_divide_the_width_saves(tmp_path: Path) -> None:
    """#25 item 5: 32 -> 28 heads (one KV group per layer); 128 % 28 != 0, so transformers
    refuses such a config: the folder is saved for headlab, and equals the masked model."""
    from transformers import AutoModel

    lm = load(_llama_1b_shape(tmp_path / "src"))
    batch = encode(lm, TEXTS)
    remove = {0: [0, 1, 2, 3], 1: [12, 13, 14, 15]}
    with HeadCapture(lm, ablate=remove, record_queries_keys=False, record_head_outputs=False):
        masked = _hidden(lm, batch)
    small = prune_model(lm, remove)
    assert small.model.config.headlab_pruned["native"] is False
    out = save_pruned(small, tmp_path / "out")
    again = load(out)
    assert list(again.layout.heads_per_layer) == [28, 28]
    real = batch["attention_mask"].bool()
    assert (_hidden(again, batch) - masked).abs()[real].max() < 1e-5
    # half the groups: 16 heads divide 128, so the folder loads in transformers too
    lm = load(tmp_path / "src")
    remove = {layer: list(range(16)) for layer in range(2)}
    with HeadCapture(lm, ablate=remove, record_queries_keys=False, record_head_outputs=False):
        masked = _hidden(lm, batch)
    small = prune_model(lm, remove)
    assert small.model.config.headlab_pruned["native"] is True
    out = save_pruned(small, tmp_path / "half")
    plain = AutoModel.from_pretrained(str(out), local_files_only=True).eval()
    assert plain.config.num_attention_heads == 16 and plain.config.head_dim == 4
    with torch.no_grad():
        ref = plain(**batch).last_hidden_state
    assert (ref - masked).abs()[real].max() < 1e-5
    assert (_hidden(load(out), batch) - masked).abs()[real].max() < 1e-5


@pytest.mark.parametrize(
    ("heads", "message"),
    [
        ([3], "must list a positive count for each of the 2 layers"),
        ([2, 4], "disagree with the weights"),
        ([0, 4], "must list a positive count"),
        ([5, 4], "expected at most 4 heads"),
    ],
)
def test_a_pruned_folder_whose_counts_disagree_with_its_weights(
    tmp_path: Path, heads: list[int], message: str
) -> None:
    """#25 item 6: a one-line ModelLoadError, not an IndexError."""
    import json

    from headlab.errors import ModelLoadError

    out = save_pruned(prune_model(load(build("bert", tmp_path / "src")), {0: [1]}), tmp_path / "o")
    config = json.loads((out / "config.json").read_text())
    config["headlab_pruned"]["heads_per_layer"] = heads
    config["headlab_pruned"]["kv_heads_per_layer"] = heads
    config["headlab_heads_per_layer"] = config["headlab_kv_heads_per_layer"] = None
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=message) as info:
        load(out)
    assert "\n" not in str(info.value)
