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


@pytest.mark.parametrize(
    ("config", "causal"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, True),
        ({"architectures": ["LlamaForCausalLM"]}, True),
        ({"architectures": ["BertModel"]}, False),
        ("not json {", False),
    ],
)
def test_a_folder_is_causal_by_its_config(tmp_path: Path, config: object, causal: bool) -> None:
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
