"""Pruning a GQA decoder: the IOI metric, KV-cache savings, and pruned folders that load and
generate in transformers with the logits of the masked model (HF eager as the oracle)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from tests.models.tiny import build

from headlab.cli import main
from headlab.models import load
from headlab.models.loading import LoadedModel, wrap
from headlab.pruning import prune_model, save_pruned
from headlab.pruning.tasks import IoiMetric, ioi_prompts, single_token_names

PROMPT = "When Mary and John went to the store, John gave a drink to"


def _oracle(folder: Path, remove: dict[int, list[int]], head_dim: int) -> torch.nn.Module:
    """The unpruned model in HF eager attention with the removed heads' output-projection
    input columns zeroed: zero-ablation without any headlab code."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(folder), attn_implementation="eager", local_files_only=True
    ).eval()
    with torch.no_grad():
        for layer, heads in remove.items():
            weight = model.model.layers[layer].self_attn.o_proj.weight  # (E, H*D)
            for h in heads:
                weight[:, h * head_dim : (h + 1) * head_dim] = 0.0
    return model


def _check_in_transformers(
    lm: LoadedModel, remove: dict[int, list[int]], out: Path, ids: torch.Tensor
) -> str:
    """Prune ``lm``, save it to ``out``, load it with transformers alone and check its logits
    and greedy tokens against the oracle; the generated continuation."""
    from transformers import AutoModelForCausalLM

    oracle = _oracle(lm.path, remove, lm.head_dim)
    small = prune_model(lm, remove)
    assert small.model.config.headlab_pruned["native"] is True
    save_pruned(small, out)
    assert "headlab_sdpa" not in (out / "config.json").read_text()
    plain = AutoModelForCausalLM.from_pretrained(
        str(out), attn_implementation="eager", local_files_only=True
    ).eval()
    kept = lm.layout.heads_per_layer[0] - len(remove[0])
    assert plain.config.num_attention_heads == kept
    with torch.no_grad():
        ref, got = oracle(input_ids=ids).logits, plain(input_ids=ids).logits
    # float32 through 30 layers: the pruned matrices are narrower, their sums run in another
    # order (by CPU: 1e-5 on one machine, 2e-4 on another, for logits of size ~12)
    scale = float(ref.abs().max())
    assert (got - ref).abs().max() < 5e-5 * max(scale, 1.0)
    new = plain.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(new, oracle.generate(ids, max_new_tokens=8, do_sample=False))
    assert new.shape[1] == ids.shape[1] + 8
    return str(lm.tokenizer.decode(new[0, ids.shape[1] :]))


# --- tiny random Llama: 2 layers, 4 query heads in 2 KV groups of 2 -----------------------


@pytest.fixture
def tiny(tmp_path: Path) -> LoadedModel:
    return load(build("llama", tmp_path / "src", lm_head=True), with_lm_head=True)


def test_ioi_prompts_are_fixed_and_balanced() -> None:
    names = ["Mary", "John", "Tom", "Anna"]
    prompts = ioi_prompts(names, 20)
    assert prompts == ioi_prompts(names, 20)
    for i, p in enumerate(prompts):
        assert p.io != p.s and p.text.count(p.s) == 2 and p.text.count(p.io) == 1
        first = min((p.text.index(p.io), p.io), (p.text.index(p.s), p.s))[1]
        assert first == (p.io if i % 2 == 0 else p.s)  # ABBA, BABA, ABBA...
        assert p.text.endswith(" to")


def test_ioi_metric_equals_a_loop_over_prompts(tiny: LoadedModel) -> None:
    from transformers import AutoModelForCausalLM

    metric = IoiMetric.build(tiny, n=12)
    tok = tiny.tokenizer
    names = single_token_names(tok)
    plain = AutoModelForCausalLM.from_pretrained(
        str(tiny.path), attn_implementation="eager", local_files_only=True
    ).eval()
    diffs = []
    for p in ioi_prompts(names[0::2], 12):  # the evaluation names
        ids = torch.tensor([tok(p.text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            logits = plain(input_ids=ids).logits[0, -1]
        io, s = (tok(" " + n, add_special_tokens=False)["input_ids"][0] for n in (p.io, p.s))
        diffs.append(float(logits[io] - logits[s]))
    assert metric.n_prompts == 12
    assert metric.evaluate(tiny) == pytest.approx(sum(diffs) / len(diffs), abs=1e-5)
    # importance is scored on the other names
    imp = IoiMetric.build(tiny, n=12, part="importance")
    seen = {int(t) for ids, _, _ in metric.batches for t in ids.flatten()}
    assert not {int(t) for _, io, s in imp.batches for t in (*io, *s)} & seen


@pytest.mark.parametrize(
    "remove",
    [{0: [0, 1], 1: [2, 3]}, {0: [0, 2], 1: [1, 3]}],
    ids=["whole KV groups", "one query head per group"],
)
def test_pruned_tiny_llama_generates_like_the_masked_model(
    tiny: LoadedModel, tmp_path: Path, remove: dict[int, list[int]]
) -> None:
    ids = torch.tensor([tiny.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]])
    kv_before = tiny.layout.kv_heads_per_layer
    _check_in_transformers(tiny, remove, tmp_path / "out", ids)
    small = load(tmp_path / "out", with_lm_head=True)
    groups = remove[0] == [0, 1]  # a whole group goes with its KV head; else the KV heads stay
    assert small.layout.kv_heads_per_layer == tuple(k - groups for k in kv_before)


def test_prune_cli_on_a_decoder_by_ioi(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoModelForCausalLM

    src = build("llama", tmp_path / "src", lm_head=True)
    out = tmp_path / "small"
    args = ["prune", "--model", str(src), "--metric", "ioi", "--limit", "16"]
    assert main([*args, "--fraction", "0.5", "--uniform", "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["metric"], res["unit"], res["loads_with"]) == (
        "ioi",
        "logit difference",
        ["headlab", "transformers"],
    )
    first, last = res["curve"][0], res["curve"][-1]
    # 2 layers x 2 KV heads x (K and V) x 8 dims x 4 bytes, halved; at the context of 128
    assert (first["kv_bytes_per_token"], last["kv_bytes_per_token"]) == (256, 128)
    assert res["kv_context"] == 128 and last["kv_bytes_at_context"] == 128 * 128
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4).shape == (1, 7)
    # the curve alone, by perplexity on the bundled sample (no --text), as CSV
    assert main(["prune", "--model", str(src), "--curve", "--step", "0.25", "--csv"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.endswith("kv_bytes_per_token,kv_bytes_at_context") and len(rows) == 3


def test_decoder_metrics_refuse_bad_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    encoder = build("bert", tmp_path / "bert")
    assert main(["prune", "--model", str(encoder), "--curve", "--metric", "ioi"]) == 1
    assert "needs a causal language model" in capsys.readouterr().err
    base = build("llama", tmp_path / "base")  # the decoder without its head
    assert main(["prune", "--model", str(base), "--curve", "--metric", "ioi"]) == 1
    err = capsys.readouterr().err
    assert "language-model head" in err and len(err.strip().splitlines()) == 1


# --- SmolLM2-135M: 30 layers, 9 query heads in 3 KV groups of 3 ----------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_folder: Path) -> LoadedModel:
    return load(smollm2_folder, with_lm_head=True)


@pytest.mark.slow
def test_smollm2_solves_ioi(smollm2: LoadedModel) -> None:
    metric = IoiMetric.build(smollm2, n=16)
    assert metric.evaluate(smollm2) > 3.0  # prefers the indirect object by e^3 or more
    # removing a third of the heads of every layer costs some of it
    worse = {layer: [0, 1, 2] for layer in range(smollm2.n_layers)}
    assert metric.evaluate(smollm2, worse) < metric.evaluate(smollm2)


@pytest.mark.slow
def test_smollm2_pruned_groups_and_query_heads_load_in_transformers(
    smollm2: LoadedModel, tmp_path: Path
) -> None:
    lm = wrap(copy.deepcopy(smollm2.model), smollm2.tokenizer, name=smollm2.name, path=smollm2.path)
    # in every layer one whole KV group (its 3 query heads and its KV head) and one query head
    # of each of the two groups left: 9 -> 4 query heads, 3 -> 2 KV heads
    remove = {}
    for layer in range(lm.n_layers):
        gone = layer % 3
        others = [3 * g + (layer + 1) % 3 for g in range(3) if g != gone]
        remove[layer] = sorted([3 * gone, 3 * gone + 1, 3 * gone + 2, *others])
    ids = torch.tensor([lm.tokenizer(PROMPT)["input_ids"]])
    text = _check_in_transformers(lm, remove, tmp_path / "out", ids)
    assert text.strip()
    again = load(tmp_path / "out", with_lm_head=True)
    assert again.layout.heads_per_layer == (4,) * 30
    assert again.layout.kv_heads_per_layer == (2,) * 30
