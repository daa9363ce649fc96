"""``headlab spec --plan roles``: the plan's numbers against a hand computation and against
torch's own parameter counts; bad input is a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from headlab.cli import main
from headlab.errors import ConfigError
from headlab.layout.plan import parameters, plan_memory

#: a tiny BERT: E 32, 2 layers of 4 heads of 8, MLP 64, vocabulary 100, 16 positions
BERT = {
    "model_type": "bert",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "vocab_size": 100,
    "max_position_embeddings": 16,
    "type_vocab_size": 2,
}
LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 100,
    "max_position_embeddings": 64,
}


def test_plan_of_a_tiny_bert_by_hand() -> None:
    plan = plan_memory(BERT, context=8, batch=2, block_elements=64)
    # parameters: word, position and type embeddings and their LayerNorm; per layer q, k, v, o
    # with biases, the MLP's two matrices with biases, two LayerNorms; the pooler
    per_layer = 4 * (32 * 32 + 32) + (32 * 64 + 64) + (64 * 32 + 32) + 2 * 2 * 32
    n_params = 100 * 32 + 16 * 32 + 2 * 32 + 2 * 32 + 2 * per_layer + (32 * 32 + 32)
    assert plan.parameters == n_params
    assert plan.weights == 4 * n_params
    n = 2 * 8  # tokens
    # attention: the layer's input (E, post-norm), q, k, v, the engine's keys, values and
    # output (6 E, no GQA) per token, float32; no rotary
    attention = n * (32 + 6 * 32) * 4
    mlp = n * (2 * 32 + 2 * 64) * 4  # input, attention output, the MLP's two activations
    # one block: B H T = 64 weights per query row, at most 16 x 64 weights: 16 rows (all 8)
    block = 8 * 2 * 4 * 8
    assert plan.streaming == {
        "layer (attention or MLP, the larger)": max(attention, mlp),
        "embeddings' output (held by the model's forward)": n * 32 * 4,
        "attention mask (B, 1, T, T) booleans": 2 * 8 * 8,
        "engine's block of weights (reused by every layer)": block * 4,
        "word geometry": 3 * 2 * 8 * 8 * 4,  # to_words, from_words, owners: B T W floats
        # the probes' 3 columns per token, B H T float sums and B H W indices of the argmax
        "probe columns and word-argmax state": (2 * 8 * 3 + 2 * 4 * 8) * 4 + 2 * 4 * 8 * 8,
    }
    assert plan.eager == {
        "patterns of every layer": 2 * (2 * 4 * 8 * 8) * 4,
        "one layer's scores during its softmax": 2 * 4 * 8 * 8 * 4,
        "layer (attention or MLP, the larger)": max(n * (32 + 4 * 32) * 4, mlp),
        "embeddings' output (held by the model's forward)": n * 32 * 4,
        "key/value cache of every layer": 0,
        "attention mask (B, 1, T, T) booleans": 2 * 8 * 8,
    }
    assert plan.streaming_peak == sum(plan.streaming.values())
    half = plan_memory(BERT, context=8, batch=2, block_elements=64, dtype="bf16")
    assert half.weights == plan.weights // 2
    assert half.eager["patterns of every layer"] == plan.eager["patterns of every layer"] // 2


def test_plan_of_a_tiny_llama_by_hand() -> None:
    """A pre-norm, gated, rotary decoder with GQA: the rotation of q and the normed input; the
    eager forward's key/value cache of every layer (transformers' default use_cache), none in
    the streaming forward, which turns it off."""
    plan = plan_memory(LLAMA, context=8, batch=2)
    n, e, q, k, mlp_width = 2 * 8, 32, 32, 16, 64  # 2 of 4 heads of 8 for keys and values
    inputs = 2 * e  # the layer's input and its normed copy
    # the rotation of q (q, rotate_half(q), q cos, rotate_half(q) sin) beside k and v is larger
    # than the engine's step (q, k, v, keys and values laid out, output: 2Q + 4K)
    attention = n * (inputs + 4 * q + 2 * k) * 4
    mlp = n * (inputs + e + 3 * mlp_width) * 4  # + the attention's output; gate, up, product
    parts = plan.streaming
    assert parts["layer (attention or MLP, the larger)"] == max(attention, mlp)
    assert not any("cache" in part for part in parts)
    assert plan.eager["key/value cache of every layer"] == 2 * 2 * n * k * 4
    no_cache = plan_memory({**LLAMA, "use_cache": False}, context=8, batch=2)
    assert no_cache.eager["key/value cache of every layer"] == 0


def test_the_plan_cuts_blocks_as_the_engine_does() -> None:
    from headlab.attention.blocks.stream import block_rows as engine_rows
    from headlab.layout.plan import block_rows

    for shape in [(1, 1, 1, 1), (2, 12, 1023, 1 << 20), (8, 12, 512, 1 << 20), (4, 4, 64, 1)]:
        assert block_rows(*shape) == engine_rows(*shape)


def test_a_long_row_is_one_block() -> None:
    """A block holds at least one query row of every head and sequence: B H T weights."""
    plan = plan_memory(LLAMA, context=64, batch=4, block_elements=1)
    assert plan.streaming["engine's block of weights (reused by every layer)"] == 4 * 4 * 64 * 4


@pytest.mark.parametrize("config", [BERT, LLAMA], ids=["bert", "llama"])
def test_parameters_match_torch(config: dict[str, object]) -> None:
    from transformers import AutoConfig, AutoModel

    from headlab.layout.attention import layout_from_config

    fields = {k: v for k, v in config.items() if k != "model_type"}
    model = AutoModel.from_config(AutoConfig.for_model(str(config["model_type"]), **fields))
    expected = sum(p.numel() for p in model.parameters())
    assert parameters(config, layout_from_config(config)) == expected


def test_gpt2_parameters_match_torch() -> None:
    from transformers import AutoConfig, AutoModel

    from headlab.layout.attention import layout_from_config

    config = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 16}
    config |= {"vocab_size": 100}
    fields = {k: v for k, v in config.items() if k != "model_type"}
    model = AutoModel.from_config(AutoConfig.for_model("gpt2", **fields))
    expected = sum(p.numel() for p in model.parameters())
    assert parameters(config, layout_from_config(config)) == expected


def test_the_command_prints_the_plan_without_torch(tmp_path) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(BERT))
    code = (
        "import sys; from headlab.cli import main; "
        f"rc = main(['spec', {str(folder)!r}, '--plan', 'roles', '--context', '8', "
        "'--batch', '2', '--json']); print('torch' in sys.modules, file=sys.stderr); "
        "sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "False"
    data = json.loads(done.stdout)
    plan = plan_memory(BERT, context=8, batch=2)
    assert data["roles_streaming"]["peak_bytes"] == plan.streaming_peak
    assert data["eager_capture"]["peak_bytes"] == plan.eager_peak
    assert data["roles_total_bytes"] == plan.weights + plan.streaming_peak


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--plan", "roles"], "--plan needs --context T"),
        (["Llama-3.1-8B", "--plan", "roles", "--context", "64"], "needs the config's vocab_size"),
        (["--plan", "roles", "--context", "4096"], "longer than the 512 positions"),
        (["--batch", "4"], "--batch and --model-dtype go with --plan roles"),
        (["--plan", "roles", "--context", "8", "--model-dtype", "fp7"], "unknown dtype 'fp7'"),
        (["--plan", "roles", "--context", "8", "--compare", "gpt2"], "--plan takes one model"),
    ],
)
def test_bad_plans_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["spec", *argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err


def test_plan_rejects_nonsense_sizes() -> None:
    for bad in ({"context": 0}, {"batch": -1}, {"block_elements": 0}, {"context": True}):
        kwargs = {"context": 8, "batch": 1, **bad}
        with pytest.raises(ConfigError, match="positive whole number"):
            plan_memory(BERT, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("model_type", ["bart", "t5"])
def test_the_plan_says_it_plans_one_stack(
    model_type: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An encoder-decoder's config is not planned as one stack (T5's would read as its
    encoder alone) nor refused for a missing field (BART's): one line says what it plans."""
    from tests.models.architectures import config

    config(model_type).save_pretrained(tmp_path)
    assert main(["spec", str(tmp_path), "--plan", "roles", "--context", "8"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"is an encoder-decoder ({model_type}" in err and "one stack of layers" in err
