"""One pruning workflow: ``headlab prune`` and ``headlab report --prune`` give the same curve in
the same JSON schema, and the report reads that schema back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.models.tiny import build

from headlab.cli import main
from headlab.errors import DataFormatError, PruningError
from headlab.models import load
from headlab.pruning.workflow import SCHEMA, PruneOptions, read_pruning_json, run_pruning


def test_prune_and_report_give_the_same_curve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import headlab.datasets
    from headlab.report.full import measure_extras

    # both commands default to the bundled STS-B sample: its first 45 pairs keep this quick
    sample = headlab.datasets.sample_path
    short = tmp_path / "stsb.tsv"
    short.write_text("".join(sample("stsb").read_text().splitlines(keepends=True)[:45]))
    monkeypatch.setattr(
        headlab.datasets, "sample_path", lambda name: short if name == "stsb" else sample(name)
    )
    model = build("bert", tmp_path / "bert")
    assert main(["prune", "--model", str(model), "--curve", "--json"]) == 0
    from_prune = json.loads(capsys.readouterr().out)
    # what headlab report --prune measures (the full curve; nothing else asked for)
    extras = measure_extras(load(model), given=frozenset({"cost", "experiment"}))
    from_report = extras["pruning"]
    assert from_prune["schema"] == from_report["schema"] == SCHEMA
    assert from_prune == from_report
    assert len(from_prune["curve"]) > 2 and from_prune["curve"][0]["heads_removed"] == 0
    # the report reads the JSON it and prune write
    assert read_pruning_json(from_prune, "prune.json")["curve"] == from_prune["curve"]


def test_the_result_of_a_pruned_model_has_the_documented_keys(tmp_path: Path) -> None:
    model = build("bert", tmp_path / "bert")
    options = PruneOptions(fraction=0.25, step=0.25, out=tmp_path / "small", limit=30)
    result = run_pruning(load(model), options).to_json()
    for key in (
        "heads_before",
        "heads_after",
        "params_before",
        "params_after",
        "metric_before",
        "metric_after",
        "time_before_ms",
        "time_after_ms",
        "bytes_before",
        "bytes_after",
        "curve",
        "removed",
    ):
        assert key in result, key
    assert (result["heads_before"], result["heads_after"]) == (8, 6)
    saved = json.loads((tmp_path / "small" / "pruning.json").read_text())
    assert saved["curve"] == result["curve"] and saved["removed"] == result["removed"]
    assert sum(load(tmp_path / "small").layout.heads_per_layer) == 6


def test_options_and_output_are_checked_before_any_work(tmp_path: Path) -> None:
    from headlab.errors import InputError, OutputExistsError

    with pytest.raises(InputError, match="--step must be in"):
        PruneOptions(step=0).check()
    with pytest.raises(InputError, match="needs --out"):
        PruneOptions(fraction=0.5).check()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match="not written by headlab"):
            PruneOptions(fraction=0.5, out=mine, overwrite=overwrite).check()
    assert (mine / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "got a JSON list"),
        ({"model": "m", "metric": "stsb", "unit": "x", "importance": "gradient"}, "'curve'"),
        ({"model": 3, "curve": []}, "'model' must be a string"),
        (
            {
                "model": "m",
                "metric": "stsb",
                "unit": "x",
                "importance": "gradient",
                "curve": [{"heads_removed": 0, "fraction": "0", "metric": 1.0, "loss": 0.0}],
            },
            r"curve\[0\].fraction must be a number",
        ),
    ],
)
def test_a_malformed_pruning_json_is_a_one_line_error(data: object, message: str) -> None:
    with pytest.raises(DataFormatError, match=message) as info:
        read_pruning_json(data, "p.json")
    assert "\n" not in str(info.value)


def test_transformers_compatible_refuses_counts_transformers_cannot_express(
    tmp_path: Path,
) -> None:
    """#25 item 5: Llama-3.2-1B's proportions (32 heads, 8 KV groups, width 32 D): one group per
    layer leaves 28 heads, which transformers refuses; refused before the search."""
    from tests.pruning.test_physical import _llama_1b_shape

    lm = load(_llama_1b_shape(tmp_path / "src"))
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat. " * 200)
    options = PruneOptions(
        fraction=0.3, out=tmp_path / "o", text=text, transformers_compatible=True
    )
    with pytest.raises(PruningError, match=r"no uniform head count .* \(28, 24 per layer\)"):
        run_pruning(lm, options)
    assert not (tmp_path / "o").exists()
