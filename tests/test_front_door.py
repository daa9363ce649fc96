"""``import headlab``: the front door's few names, light to import, each the same call its command
makes on a tiny in-process model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.causal.test_patch_cli import PROMPTS, _jsonl
from tests.models.tiny import build

import headlab
from headlab.models.loading import LoadedModel, load

FRONT_DOOR = {
    "load",
    "LoadedModel",
    "capture",
    "measure_roles",
    "patch",
    "circuit",
    "cards",
    "prune",
    "spec",
}


def test_import_headlab_and_its_light_names_do_not_load_torch() -> None:
    code = (
        "import sys, headlab; "
        f"assert set(headlab.__all__) >= {FRONT_DOOR!r}, headlab.__all__; "
        "assert headlab.spec('gpt2')['kv_cache_bytes_per_token'] == 36864; "
        "assert 'torch' not in sys.modules; "
        "import headlab.experiments.circuit_request as c; assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


# ---------------------------------------------------------------- each equals the deep call


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("llama", tmp_path_factory.mktemp("llama"), lm_head=True, seed=5)


def _untimed(data: Any) -> Any:
    """``data`` without the keys that measure time (they differ from run to run)."""
    if isinstance(data, dict):
        return {
            k: _untimed(v)
            for k, v in data.items()
            if not any(t in k for t in ("seconds", "_ms", "time"))
        }
    if isinstance(data, list):
        return [_untimed(v) for v in data]
    return data


def test_load_and_capture_are_the_library_s_own() -> None:
    from headlab.explore.sentence import capture

    assert headlab.load is load and headlab.LoadedModel is LoadedModel
    assert headlab.capture is capture


def test_measure_roles_is_the_roles_request(folder: Path) -> None:
    from headlab.roles.workflow import RolesRequest

    options = {"limit": 12, "replicates": 3, "no_gap": True}
    front = headlab.measure_roles(str(folder), **options)
    deep = RolesRequest(**options).run(load(folder))
    assert front.to_json() == deep.to_json()


def test_patch_is_the_patch_request(folder: Path, tmp_path: Path) -> None:
    from headlab.causal.request import PatchRequest, patch_task, run_patch

    prompts = str(_jsonl(tmp_path / "p.jsonl", PROMPTS))
    lm = load(folder, with_lm_head=True)
    front = headlab.patch(lm, prompts=prompts, no_layers=True)
    request = PatchRequest(model=str(folder), prompts=prompts, no_layers=True)
    deep = run_patch(lm, patch_task(lm, request), request)
    assert _untimed(front.to_json()) == _untimed(deep.to_json())


def test_patch_writes_the_task_s_prompts(folder: Path, tmp_path: Path) -> None:
    """``write``: the built-in task's prompts written by the request's run (no CLI), the ones
    the patching would use, nothing patched."""
    from headlab.causal.request import PatchRequest, PromptsWritten, patch_task
    from headlab.causal.tasks import read_prompts

    out = tmp_path / "ioi.jsonl"
    lm = load(folder, with_lm_head=True)
    written = headlab.patch(lm, task="ioi", n=6, seed=3, write=str(out))
    assert isinstance(written, PromptsWritten)
    assert written.to_json() == {"path": str(out), "task": "ioi", "n_prompts": 6}
    drawn = patch_task(lm, PatchRequest(model=str(folder), task="ioi", n=6, seed=3)).prompts
    assert [p.to_json() for p in read_prompts(out)] == [p.to_json() for p in drawn]
    again = tmp_path / "again.jsonl"
    PatchRequest(model=str(folder), task="ioi", n=6, seed=3, write=str(again)).run(lm)
    assert again.read_bytes() == out.read_bytes()


def test_circuit_is_the_circuit_request(folder: Path, tmp_path: Path) -> None:
    from headlab.experiments.circuit_request import CircuitRequest
    from headlab.page.circuit import circuit_html

    prompts = str(_jsonl(tmp_path / "p.jsonl", PROMPTS))
    page = tmp_path / "circuit.html"
    options = {"prompts": prompts, "eval_prompts": prompts, "method": "eap", "sizes": (1, 5)}
    front = headlab.circuit(folder, html=str(page), **options)
    files = {"html": str(tmp_path / "deep.html"), "figure": str(tmp_path / "deep.png")}
    request = CircuitRequest(model=str(folder), **options, **files)
    deep = request.run(load(folder, with_lm_head=True))  # the run writes its page and figure
    assert _untimed(front.to_json()) == _untimed(deep.to_json())
    assert page.read_text(encoding="utf-8").lower().startswith("<!doctype html>")
    assert Path(files["html"]).read_text(encoding="utf-8") == circuit_html(deep.to_json())
    assert Path(files["figure"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cards_is_the_cards_request(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headlab.experiments.cards import CardsRequest

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    page = tmp_path / "atlas.html"
    options = {"tasks": ("induction",), "n": 4, "limit": 10, "no_importance": True}
    front = headlab.cards(folder, html=str(page), **options)
    deep = CardsRequest(model=str(folder), **options).run(load(folder, with_lm_head=True))
    assert front.to_json() == deep.to_json()
    assert page.read_text(encoding="utf-8").lower().startswith("<!doctype html>")


def test_prune_is_the_prune_request(folder: Path, tmp_path: Path) -> None:
    from headlab.pruning.results import PruneOptions
    from headlab.pruning.workflow import PruneRequest

    options = {"step": 0.5, "limit": 8}
    front = headlab.prune(folder, **options)
    request = PruneRequest(options=PruneOptions(**options), model=str(folder), curve=True)
    deep = request.run(request.ready(lambda head: load(folder, with_lm_head=head)))
    assert _untimed(front.to_json()) == _untimed(deep.to_json())
    out = tmp_path / "pruned"
    written = headlab.prune(folder, fraction=0.5, step=0.5, uniform=True, out=str(out))
    assert written.to_json()["heads_after"] < written.to_json()["heads_before"]
    assert (out / "config.json").is_file()


def test_prune_compare_writes_the_figure_of_its_json(folder: Path, tmp_path: Path) -> None:
    """The methods compared, their figure written by the library (the command only prints):
    the same PNG as the figure drawn from the JSON returned."""
    from headlab.pruning.figure import pruning_compare

    figure = tmp_path / "compare.png"
    options = {"compare": True, "step": 0.5, "limit": 8, "l0_steps": 2}
    compared = headlab.prune(folder, figure=str(figure), **options)
    assert compared.to_json()["schema"] == "headlab.prune-compare/1"
    drawn = pruning_compare(compared.to_json(), tmp_path / "drawn.png")
    assert figure.read_bytes() == drawn.read_bytes()


def test_spec_is_headlab_spec_json() -> None:
    from headlab.layout.sheet import SpecOptions, spec_json
    from headlab.models.names import named_config

    assert headlab.spec("gpt2", context=1024) == spec_json(
        ["gpt2"], SpecOptions(context=1024), resolve=named_config
    )
