"""headlab.roles.workflow: the gold inputs and the serve cache that ``headlab roles`` and
``headlab report`` share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headlab.cache import cached_roles_path
from headlab.cli._args import MAX_REPLICATES as CLI_MAX
from headlab.datasets import read_gap, read_treebank, sample_path
from headlab.errors import InputError
from headlab.explore.roles import RoleSources
from headlab.roles.folds import default_reliability
from headlab.roles.workflow import (
    MAX_REPLICATES,
    keep_roles,
    read_gold,
)


def test_the_bundled_samples_are_the_default_gold() -> None:
    gold = read_gold()
    treebank = read_treebank(sample_path("treebank"))
    gap = read_gap(sample_path("gap"))
    assert [s.words for s in gold.treebank.sentences] == [s.words for s in treebank.sentences]
    assert gold.gap is not None and len(gold.gap.examples) == len(gap.examples)
    assert gold.frequencies["the"] > 1000  # UD EWT train's counts
    assert gold.folds == default_reliability(treebank.sentences, gap.examples)


def test_limits_and_folds_are_checked_before_any_model(tmp_path: Path) -> None:
    small = read_gold(limit=7, no_gap=True, reliability=0)
    assert len(small.treebank.sentences) == 7 and small.gap is None and small.folds == 0
    with pytest.raises(InputError, match="at least 2 folds"):
        read_gold(reliability=1)
    with pytest.raises(InputError, match="--limit must be at least 1"):
        read_gold(limit=0)
    with pytest.raises(InputError, match="cannot read"):
        read_gold(treebank=tmp_path / "missing.conllu")


def test_the_cli_parses_replicates_with_the_library_limit() -> None:
    assert CLI_MAX == MAX_REPLICATES


def test_a_kept_run_is_what_the_explorer_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path))
    run = {
        "schema": "headlab.roles/2",
        "model": "org/some-model",
        "heads_in_layer": [2],
        "heads": [{"layer": 0, "head": h, "role": "broad", "score": 0.5} for h in range(2)],
    }
    assert keep_roles(run) is None
    path = cached_roles_path("org/some-model")
    assert path == tmp_path / "roles" / "org--some-model.json"
    assert json.loads(path.read_text(encoding="utf-8")) == run
    shown = RoleSources().for_model("org/some-model", [2])
    assert shown["source"] == f"the cache, {path}" and len(shown["heads"]) == 2


def test_an_unwritable_cache_costs_a_note_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HEADLAB_CACHE", str(blocker))
    note = keep_roles({"model": "m", "heads": []})
    assert note is not None and "cannot keep this run for headlab serve" in note


def test_a_run_of_the_older_schema_is_refused_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached run of headlab.roles/1 (whose "delimiter" counted the sink) is not shown as if
    it meant today's roles: the explorer says why, in one line."""
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path))
    path = cached_roles_path("org/some-model")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema": "headlab.roles/1", "model": "org/some-model"}))
    shown = RoleSources().for_model("org/some-model", [2])
    assert shown["source"] is None and shown["heads"] == []
    assert "older headlab" in shown["note"] and "sink" in shown["note"]
    assert "\n" not in shown["note"]
