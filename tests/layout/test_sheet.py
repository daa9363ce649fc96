"""What ``headlab spec`` shows a person (:mod:`headlab.layout.sheet`): the rows and numbers of
each table, built from the same JSON ``--json`` prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headlab.errors import InputError
from headlab.layout.sheet import (
    SpecOptions,
    catalog_json,
    catalog_text,
    plan_json,
    plan_text,
    spec_json,
    spec_notes,
    spec_text,
)
from headlab.models.names import named_config
from headlab.text import TextTable


def _table(parts: list) -> TextTable:  # type: ignore[type-arg]
    (only,) = parts
    assert isinstance(only, TextTable)
    return only


def _cells(t: TextTable) -> dict[str, tuple[str, ...]]:
    return {row[0]: row[1:] for row in t.rows}


def test_one_model_a_row_per_quantity() -> None:
    data = spec_json(["gpt2"], SpecOptions(), resolve=named_config)
    t = _table(spec_text(data))
    assert t.title == "gpt2: heads in numbers" and t.columns == ("", "")
    cells = _cells(t)
    assert cells["layers x heads"] == ("12 x 12",)
    assert cells["KV heads"] == ("12  (MHA)",)
    assert cells["KV cache per token"] == ("36,864 B (36.0 KiB, bf16)",)  # 2 x 12 x 768 x 2 B
    assert cells["KV cache at 1,024 tokens"] == ("36.0 MiB",)  # gpt2 takes 1,024: the default
    assert cells["longest context (config)"] == ("1,024",)
    assert "latent ranks (MLA)" not in cells  # no model here has latent attention
    assert spec_notes(data) == []


def test_compared_models_a_column_each_latent_ranks_where_one_has_them() -> None:
    data = spec_json(["gpt2", "DeepSeek-V3"], SpecOptions(compare=True), resolve=named_config)
    t = _table(spec_text(data))
    assert t.title is None and t.columns == ("", "gpt2", "DeepSeek-V3")
    assert _cells(t)["latent ranks (MLA)"] == ("-", "kv 512, q 1536, rope 64")
    assert _cells(t)["KV cache at 1,024 tokens"][0] == "36.0 MiB"


def test_a_context_past_a_models_limit_gets_a_note() -> None:
    data = spec_json(["gpt2"], SpecOptions(context=32768), resolve=named_config)
    assert spec_notes(data) == [
        "gpt2 takes at most 1,024 tokens; the numbers at 32,768 are what the arithmetic gives, "
        "not what it can run"
    ]


def test_an_encoder_decoder_a_column_per_head_set_and_their_total(tmp_path: Path) -> None:
    from tests.models.architectures import config

    config("t5").save_pretrained(tmp_path)
    options = SpecOptions(context=8, dtype="fp32")
    t = _table(spec_text(spec_json([str(tmp_path)], options, resolve=named_config)))
    assert t.columns == ("", "encoder", "decoder (self)", "cross", "total")
    assert t.caption and "a source and a target of 8 tokens each" in t.caption
    cells = _cells(t)
    per_token = 2 * 2 * 4 * 8 * 4  # keys and values, 2 layers, 4 heads of 8, float32
    assert cells["KV cache per token"] == (
        "0 B (0 B, fp32)",
        f"{per_token} B ({per_token} B, fp32)",
        f"{per_token} B ({per_token} B, fp32)",
        "1.0 KiB",
    )
    assert cells["patterns per forward"] == ("8", "8", "8", "24")
    assert cells["layers x heads"][3] == ""  # no total where none adds up
    with pytest.raises(InputError, match="not in --compare"):
        spec_json(["gpt2", str(tmp_path)], SpecOptions(compare=True), resolve=named_config)


def test_the_catalog_lists_kind_and_heads() -> None:
    t = _table(catalog_text(catalog_json()))
    assert t.columns == ("name", "kind", "layers x heads", "source")
    rows = {row[0]: row for row in t.rows}
    assert rows["DeepSeek-V3"][1:3] == ("MLA", "61 x 128")
    assert rows["Llama-3.1-8B"][1] == "GQA (G=4)"


def test_the_plan_lists_each_part_and_each_peak_with_the_weights(tmp_path: Path) -> None:
    from tests.layout.test_plan import BERT

    (tmp_path / "config.json").write_text(json.dumps(BERT))
    options = SpecOptions(plan="roles", context=8, batch=2)
    data = plan_json(named_config(str(tmp_path), full=True), options)
    t = _table(plan_text(data))
    assert t.title == f"{tmp_path.name}: memory of one forward over 2 x 8 tokens (fp32)"
    assert t.columns == ("", "bytes") and t.right == frozenset({1})
    names = [row[0] for row in t.rows]
    assert names[0] == "weights"
    parts = data["roles_streaming"]["parts"]
    assert [n for n in names if n.startswith("  roles")] == [
        f"  roles (streaming): {n}" for n in parts
    ]
    assert names.count("roles (streaming): peak + weights") == 1
    assert names[-1] == "eager capture: peak + weights"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"plan": "roles"}, "--plan needs --context T"),
        ({"plan": "roles", "context": 8, "compare": True}, "--plan takes one model"),
        ({"batch": 2}, "--batch and --model-dtype go with --plan roles"),
    ],
)
def test_options_that_do_not_go_together(options: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InputError, match=message):
        SpecOptions(**options)
