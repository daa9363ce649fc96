"""The architecture matrix: every model type of :mod:`tests.models.architectures`, discovered
(no hand adapter), against independent oracles.

For each type, on a tiny random model built in-process: recomputed patterns against HF eager
``output_attentions`` (<= 1e-5, float32); head outputs against pattern @ values; zero- and
mean-ablation against weight surgery on an independent copy (the head's columns of the output
projection zeroed; the mean moved into its bias); outputs bit-identical to the model's default
attention with capture on; physical pruning against zero-ablation, saved and loaded back (with
headlab, and with transformers where its config can express the result), or a one-line error
saying why not. ``HEADLAB_COVERAGE_OUT=file.json`` collects what passed per type for
``benchmarks/coverage.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.models.architectures import ARCHITECTURES, NOT_INTERFACE, build_model, inputs

from headlab.errors import PruningError, UnsupportedModelError
from headlab.models import HeadCapture, LoadedModel, wrap
from headlab.roles.classify import ROLES, UNCLASSIFIED

TYPES = sorted(ARCHITECTURES)
RESULTS: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module", autouse=True)
def _coverage_out() -> Iterator[None]:
    yield
    out = os.environ.get("HEADLAB_COVERAGE_OUT")
    if out:
        Path(out).write_text(json.dumps(RESULTS, indent=1, sort_keys=True) + "\n")


def _note(model_type: str, column: str, value: Any) -> None:
    RESULTS.setdefault(model_type, {})[column] = value


@pytest.fixture(scope="module", params=TYPES)
def arch(request: pytest.FixtureRequest) -> tuple[str, LoadedModel, dict[str, torch.Tensor]]:
    model_type = request.param
    lm = wrap(build_model(model_type), None, name=model_type)
    return model_type, lm, inputs(lm.model)


def _main(output: Any) -> torch.Tensor:
    if isinstance(output, tuple):
        return output[0]
    if output.get("last_hidden_state") is None and output.get("text_embeds") is not None:
        return torch.cat([output.text_embeds, output.image_embeds], -1)  # CLIP: both towers
    return output.last_hidden_state


def _real_rows(lm: LoadedModel, layer: int, batch: dict[str, torch.Tensor], n: int) -> torch.Tensor:
    """``(B, T)`` True where a query row is a real token (padding only in self/encoder layers)."""
    mask = batch.get("attention_mask")
    if lm.layers[layer].kind in ("self", "encoder") and mask is not None and mask.shape[1] == n:
        return mask.bool()
    return torch.ones(next(iter(batch.values())).shape[0], n, dtype=torch.bool)


def _eager_maps(model_type: str, batch: dict[str, torch.Tensor], lm: LoadedModel) -> list[Any]:
    eager = build_model(model_type, attn_implementation="eager")
    with torch.no_grad():
        out = eager(**batch, output_attentions=True)
    if out.get("attentions") is None and out.get("vision_model_output") is not None:  # CLIP
        towers = {"vision_model": out.vision_model_output, "text_model": out.text_model_output}
        maps, seen = [], dict.fromkeys(towers, 0)
        for h in lm.layers:
            tower = next(k for k in towers if k in h.path)
            maps.append(towers[tower].attentions[seen[tower]])
            seen[tower] += 1
        return maps
    stacks = {
        "self": out.get("attentions"),
        "encoder": out.get("encoder_attentions"),
        "decoder": out.get("decoder_attentions"),
        "cross": out.get("cross_attentions"),
    }
    return [stacks[h.kind][h.block] for h in lm.layers]


def test_discovery_finds_every_layer(arch: tuple[str, LoadedModel, Any]) -> None:
    model_type, lm, batch = arch
    _note(model_type, "text", "input_ids" in batch)
    _note(model_type, "input", getattr(lm.model, "main_input_name", "input_ids"))
    kinds = [h.kind for h in lm.layers]
    if getattr(lm.model.config, "is_encoder_decoder", False):
        assert sorted(kinds) == ["cross", "cross", "decoder", "decoder", "encoder", "encoder"]
    else:
        towers = 2 if getattr(lm.model.config, "vision_config", None) is not None else 1
        assert kinds == ["self", "self"] * towers
    assert len({id(h.out_proj) for h in lm.layers}) == len(
        set(map(id, (h.attention for h in lm.layers)))
    )
    _note(model_type, "layers", [h.name for h in lm.layers])
    _note(model_type, "qkv", sorted({h.qkv.layout if h.qkv else "-" for h in lm.layers}))


def test_patterns_equal_eager_attentions(arch: tuple[str, LoadedModel, Any]) -> None:
    model_type, lm, batch = arch
    maps = _eager_maps(model_type, batch, lm)
    with torch.no_grad(), HeadCapture(lm) as cap:
        lm.model(**batch)
    for layer, theirs in enumerate(maps):
        ours = cap.pattern(layer)
        assert ours.shape == theirs.shape, (layer, ours.shape, theirs.shape)
        real = _real_rows(lm, layer, batch, ours.shape[2])
        diff = (ours - theirs).abs()[real[:, None, :, None].expand_as(ours)]
        assert diff.max() <= 1e-5, f"{model_type} {lm.layers[layer].name}: {diff.max()}"
    _note(model_type, "capture", True)


def test_head_outputs_equal_pattern_times_values(arch: tuple[str, LoadedModel, Any]) -> None:
    _, lm, batch = arch
    with torch.no_grad(), HeadCapture(lm) as cap:
        lm.model(**batch)
    for layer in range(lm.n_layers):
        rec = cap.records[layer]
        pattern = cap.pattern(layer)
        values = rec.v.repeat_interleave(pattern.shape[1] // rec.v.shape[1], dim=1)
        got = cap.head_output(layer)
        real = _real_rows(lm, layer, batch, got.shape[2])[:, None, :, None].expand_as(got)
        torch.testing.assert_close(got[real], (pattern @ values)[real], atol=1e-5, rtol=1e-4)


def test_capture_leaves_outputs_bit_identical(arch: tuple[str, LoadedModel, Any]) -> None:
    model_type, lm, batch = arch
    reference = build_model(model_type)  # the model's default attention, no headlab
    with torch.no_grad():
        expected = _main(reference(**batch))
        with HeadCapture(lm) as cap:
            hooked = _main(lm.model(**batch))
    assert cap.records and torch.equal(hooked, expected)
    _note(model_type, "bit_identical", True)


def _ablation(lm: LoadedModel) -> dict[int, list[int]]:
    if len({id(h.out_proj) for h in lm.layers}) < lm.n_layers:
        # ALBERT: one module serves every layer, so surgery on it ablates the same heads in all
        return {layer: [1, 2] for layer in range(lm.n_layers)}
    last = lm.n_layers - 1
    return {0: [1], last // 2 + 1: [3], last: [0, 2]} if last > 1 else {0: [1], last: [0, 2]}


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_equals_weight_surgery(arch: tuple[str, LoadedModel, Any], mode: str) -> None:
    """Independent oracle: removing heads from the output projection's input is zeroing their
    columns of the projection (zero), or moving ``W_h @ mean_h`` into its bias (mean)."""
    model_type, lm, batch = arch
    ablate = _ablation(lm)
    gen = torch.Generator().manual_seed(2)
    mean = torch.randn(lm.n_heads, lm.head_dim, generator=gen)
    means = {layer: mean + layer for layer in ablate}
    shared = len({id(h.out_proj) for h in lm.layers}) < lm.n_layers
    if shared:  # one projection serves every layer: one mean for all
        means = {layer: mean for layer in ablate}
    with torch.no_grad(), HeadCapture(lm, ablate=ablate, ablation=mode, means=means):
        ablated = _main(lm.model(**batch))
    other = wrap(build_model(model_type), None)
    d = lm.head_dim
    with torch.no_grad():
        for layer, heads in ablate.items():
            if shared and layer > 0:
                continue  # the first layer's surgery already changed the shared projection
            proj = other.layers[layer].out_proj
            weight = other.adapter.out_proj_weight(proj)  # (E, H*D), a view
            shift = torch.zeros(weight.shape[0])
            for h in heads:
                cols = slice(h * d, (h + 1) * d)
                shift += weight[:, cols] @ means[layer][h]
                weight[:, cols] = 0
            if mode == "mean":
                if proj.bias is None:
                    proj.bias = torch.nn.Parameter(shift)
                else:
                    proj.bias += shift
        expected = _main(other.model(**batch))
        plain = _main(lm.model(**batch))
    torch.testing.assert_close(ablated, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ablated, plain, atol=1e-4)
    _note(model_type, f"ablation_{mode}", True)


def _removal(lm: LoadedModel) -> dict[int, list[int]]:
    n, kv = lm.layout.heads_per_layer[0], lm.layout.kv_heads_per_layer[0]
    group = n // kv
    first = list(range(group)) if kv > 1 and group > 1 else [1]  # a whole KV group, or one head
    return {0: first, lm.n_layers - 1: [n - 1] if kv == n else list(range(n - group, n))}


def test_physical_pruning_equals_zero_ablation_and_reloads(
    arch: tuple[str, LoadedModel, Any], tmp_path: Path
) -> None:
    from tests.models.tiny import tokenizer_path
    from transformers import AutoModel, AutoTokenizer

    from headlab.models import load
    from headlab.pruning.physical import prune_model, save_pruned

    model_type, lm, batch = arch
    remove = _removal(lm)
    if lm.layout.kv_heads_per_layer[0] == 1:  # MQA: only query heads of the one group
        remove = {0: [1], lm.n_layers - 1: [0, 2]}
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True)
    pruned = wrap(build_model(model_type), tokenizer, name=model_type)
    try:
        pruned = prune_model(pruned, remove)
    except PruningError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 300
        _note(model_type, "pruning", message)
        pytest.skip(f"{model_type}: {message}")
    with torch.no_grad(), HeadCapture(lm, ablate=remove):
        expected = _main(lm.model(**batch))
    with torch.no_grad():
        got = _main(pruned.model(**batch))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert [len(ids) for ids in pruned.head_ids()] == list(pruned.layout.heads_per_layer)
    _note(model_type, "pruning", True)
    if "input_ids" not in batch:  # headlab loads text models from folders
        return
    folder = save_pruned(pruned, tmp_path / "pruned")
    again = load(folder)
    with torch.no_grad():
        torch.testing.assert_close(_main(again.model(**batch)), got, atol=1e-6, rtol=1e-6)
    _note(model_type, "reload_headlab", True)
    native = json.loads((folder / "config.json").read_text())["headlab_pruned"]["native"]
    if native:
        plain = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
        with torch.no_grad():
            torch.testing.assert_close(_main(plain(**batch)), got, atol=1e-5, rtol=1e-5)
    _note(model_type, "reload_transformers", bool(native))


def test_mqa_with_per_head_norms_prunes_query_heads() -> None:
    """Gemma 3 with one KV head (Gemma 3 270M's layout): its q_norm and k_norm are one head
    wide, as wide as all KV heads together, yet normalise each head alone; pruning query heads
    equals zero-ablating them."""
    from headlab.pruning.physical import prune_model

    model = build_model("gemma3_text", num_key_value_heads=1)
    lm = wrap(model, None, name="gemma3-mqa")
    assert lm.layout.kv_heads_per_layer[0] == 1
    remove = {0: [1], lm.n_layers - 1: [0, 2]}
    batch = inputs(model)
    pruned = prune_model(wrap(build_model("gemma3_text", num_key_value_heads=1), None), remove)
    with torch.no_grad(), HeadCapture(lm, ablate=remove):
        expected = _main(lm.model(**batch))
    with torch.no_grad():
        got = _main(pruned.model(**batch))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert pruned.layout.heads_per_layer == (3, 2) and pruned.layout.kv_heads_per_layer == (1, 1)


@pytest.mark.parametrize("model_type", sorted(NOT_INTERFACE))
def test_families_outside_the_interface_get_one_line(model_type: str) -> None:
    model = build_model(model_type)
    with pytest.raises(UnsupportedModelError) as info:
        wrap(model, None)
    message = str(info.value)
    assert message == (
        f"attention in {type(model).__name__} does not go through transformers' attention interface"
    )
    _note(model_type, "refused", message)


def test_the_matrix_covers_at_least_forty_types() -> None:
    assert len(TYPES) >= 40


#: every type that reads text runs through the CLI end to end (encoder-decoders: the encoder's
#: heads; their decoder and cross-attention views in test_seq2seq.py; Whisper hears audio and
#: the vision towers see images: their own tests)
CLI_TYPES = [t for t in TYPES if t not in ("whisper", "vit", "clip_vision_model")]


@pytest.mark.parametrize("model_type", CLI_TYPES)
def test_heads_and_roles_cli_on_a_tiny_folder(
    model_type: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``headlab heads`` and ``headlab roles --model DIR`` on a saved tiny random folder: every
    head of every layer listed, with weights that sum to at most 1."""
    from tests.models.tiny import tokenizer_path
    from transformers import AutoTokenizer

    from headlab.cli import main

    folder = tmp_path / model_type
    longer = {"max_position_embeddings": 130}  # the induction measure needs 96 tokens
    build_model(model_type, **longer).save_pretrained(folder, safe_serialization=True)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True)
    tok.save_pretrained(folder)
    lm = wrap(build_model(model_type), None)
    reads = [  # the layers that read the sentence (CLIP: its text tower alone)
        i
        for i, h in enumerate(lm.layers)
        if h.kind in ("self", "encoder") and "vision_model" not in h.path
    ]
    n_heads = sum(lm.layout.heads_per_layer[i] for i in reads)
    assert main(["heads", "The cat sat on the mat.", "--model", str(folder), "--json"]) == 0
    heads = json.loads(capsys.readouterr().out)["heads"]
    assert len(heads) == n_heads
    for h in heads:
        assert 1 <= len(h["top"]) <= 3  # a causal row sees only the words before it
        assert 0.0 < sum(t["weight"] for t in h["top"]) + h["special"] <= 1.0 + 1e-3
    args = ["roles", "--model", str(folder), "--no-gap", "--replicates", "0", "--limit", "20"]
    assert main([*args, "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert len(table["heads"]) == n_heads
    assert {h["role"] for h in table["heads"]} <= {*ROLES, UNCLASSIFIED}
    _note(model_type, "roles_cli", True)
