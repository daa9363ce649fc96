"""The table of patch methods (:mod:`headlab.causal.methods`): a method registered in-process is a
choice of ``headlab patch``, checked by its request and run with its JSON printed; and the
sources of activation patching (``mean``, ``resample``) are ablations of one mechanism, the
same as :class:`~headlab.models.capture.HeadCapture`'s."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.causal.test_patching import _random_task
from tests.models.tiny import build

from headlab.causal.methods import PatchMethod, method, names, register, unregister
from headlab.causal.patching import activation_patching, logit_difference
from headlab.causal.request import PatchRequest
from headlab.causal.tasks import Batch, Task
from headlab.cli import main
from headlab.errors import InputError
from headlab.models.capture import HeadCapture
from headlab.models.hooks import Swap
from headlab.models.loading import LoadedModel, load
from headlab.models.patching import HeadOutputs, HeadPatch
from headlab.models.runner import last_logits


@dataclass(frozen=True)
class _Count:
    n_prompts: int
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"method": "toy", "n_prompts": self.n_prompts, "source": self.source}


def _toy(lm: LoadedModel, task: Task, request: PatchRequest, progress: Any) -> _Count:
    return _Count(task.n_prompts, request.source)


@pytest.fixture
def toy() -> Iterator[PatchMethod]:
    added = register(
        PatchMethod(name="toy", help="toy (counts the prompts)", run=_toy, heads=False,
                    sources=("corrupt", "mean"))
    )  # fmt: skip
    try:
        yield added
    finally:
        unregister("toy")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("llama", tmp_path_factory.mktemp("llama"), lm_head=True, seed=5)


def test_a_registered_method_is_a_choice_checked_and_run(
    toy: PatchMethod, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert names()[-1] == "toy" and method("toy") is toy
    # the CLI offers it, with its help
    assert main(["patch", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "toy (counts the prompts)" in shown and "dla,toy}" in shown
    # the request checks it by its table entry: no heads, so no figure; a source it takes
    with pytest.raises(InputError, match="--method toy gives a table or --json"):
        PatchRequest(model=str(folder), method="toy", figure=str(tmp_path / "x.png"))
    with pytest.raises(InputError, match="--source resample is patched by --method activation"):
        PatchRequest(model=str(folder), method="toy", source="resample")
    with pytest.raises(InputError, match="--component k is patched by --method activation only"):
        PatchRequest(model=str(folder), method="toy", component="k")
    # and the command runs it, its JSON printed as it gives it
    argv = ["-q", "patch", "--model", str(folder), "--task", "ioi", "--n", "3", "--json"]
    assert main([*argv, "--method", "toy", "--source", "mean"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "method": "toy",
        "n_prompts": 3,
        "source": "mean",
    }


def test_an_unregistered_method_is_gone(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "toy" not in names()
    assert main(["patch", "--model", str(folder), "--method", "toy"]) == 2
    assert "invalid choice: 'toy'" in capsys.readouterr().err
    with pytest.raises(InputError, match="--method must be one of activation, attribution"):
        PatchRequest(model=str(folder), method="toy")
    with pytest.raises(InputError, match="registered already"):
        register(PatchMethod(name="dla", help="dla", run=_toy))


@pytest.fixture(scope="module")
def tiny(folder: Path) -> LoadedModel:
    lm = load(folder, with_lm_head=True)
    lm.model.double()
    return lm


def _ablated_ld(lm: LoadedModel, task: Task, **ablation: Any) -> float:
    """The task's mean logit difference with ``HeadCapture(**ablation)``, one whole pass."""
    total = 0.0
    for batch in task.batches:
        with torch.inference_mode(), HeadCapture(lm, record_queries_keys=False, **ablation):
            logits = last_logits(lm, batch.clean)
        total += float(logit_difference(logits, batch.answer, batch.distractor).sum())
    return total / task.n_prompts


def test_mean_source_is_headcaptures_mean_ablation(tiny: LoadedModel) -> None:
    task, _ = _random_task(tiny, 3, 9, seed=2)
    got = activation_patching(tiny, task, source="mean")
    assert got.to_json()["source"] == "mean"
    # the means over every position of the clean prompts, recorded by hand
    with torch.inference_mode(), HeadOutputs(tiny, detach=True) as run:
        last_logits(tiny, task.batches[0].clean)
    for layer, head in [(0, 1), (1, 3)]:
        means = {layer: run.outputs[layer].mean(dim=(0, 1))}  # (H, D)
        expected = _ablated_ld(tiny, task, ablate={layer: [head]}, ablation="mean", means=means)
        assert float(got.patched[layer, head]) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_resample_source_is_headcaptures_resample_ablation(tiny: LoadedModel) -> None:
    """Each prompt's head takes the previous prompt's clean outputs (of the same length), as
    ``HeadCapture(ablation="resample")`` with that prompt's outputs does, prompt by prompt."""
    task, _ = _random_task(tiny, 3, 9, seed=4)
    got = activation_patching(tiny, task, source="resample")
    assert got.to_json()["source"] == "resample"
    batch = task.batches[0]
    with torch.inference_mode(), HeadOutputs(tiny, detach=True) as run:
        last_logits(tiny, batch.clean)
    for layer, head in [(0, 2), (1, 0)]:
        total = 0.0
        for i in range(batch.clean.shape[0]):
            one = Task(
                name="one",
                prompts=task.prompts[i : i + 1],
                batches=(
                    Batch(
                        clean=batch.clean[i : i + 1],
                        corrupt=batch.corrupt[i : i + 1],
                        answer=batch.answer[i : i + 1],
                        distractor=batch.distractor[i : i + 1],
                        index=(i,),
                    ),
                ),
            )
            previous = {layer: run.outputs[layer][i - 1]}  # (T, H, D)
            total += _ablated_ld(
                tiny, one, ablate={layer: [head]}, ablation="resample", resampled=previous
            )
        expected = total / batch.clean.shape[0]
        assert float(got.patched[layer, head]) == pytest.approx(expected, rel=1e-9, abs=1e-9)
    lone = _random_task(tiny, 1, 9, seed=4)[0]
    with pytest.raises(InputError, match="the only one of 9 tokens"):
        activation_patching(tiny, lone, source="resample")


def test_resample_at_the_last_position_crosses_lengths(tiny: LoadedModel) -> None:
    """At one position a head takes the previous prompt's output there (in the task's order,
    the first prompt the last one's), whatever its length: a full forward of each prompt with
    that one swap, by hand, gives the same logit differences."""
    short, _ = _random_task(tiny, 1, 7, seed=5)
    long, _ = _random_task(tiny, 2, 9, seed=6)
    second = dataclasses.replace(long.batches[0], index=(1, 2))
    task = Task(
        name="mixed", prompts=short.prompts + long.prompts, batches=(short.batches[0], second)
    )
    got = activation_patching(tiny, task, source="resample", position=-1)
    last: dict[int, dict[int, torch.Tensor]] = {}
    for batch in task.batches:
        with torch.inference_mode(), HeadOutputs(tiny, detach=True) as run:
            last_logits(tiny, batch.clean)
        for row, i in enumerate(batch.index):
            last[i] = {layer: z[row, -1] for layer, z in run.outputs.items()}  # (H, D)
    layer, head = 1, 2
    n_heads = tiny.layout.heads_per_layer[layer]
    select = torch.zeros(1, n_heads, dtype=torch.bool)
    select[0, head] = True
    total = 0.0
    for batch in task.batches:
        for row, i in enumerate(batch.index):
            ids = batch.clean[row : row + 1]
            where = torch.zeros(ids.shape[1], dtype=torch.bool)
            where[-1] = True
            swap = Swap(source=last[(i - 1) % 3][layer], select=select, positions=where)
            with torch.inference_mode(), HeadPatch(tiny, {layer: [swap]}):
                logits = last_logits(tiny, ids)
            pair = batch.answer[row : row + 1], batch.distractor[row : row + 1]
            total += float(logit_difference(logits, *pair).sum())
    assert float(got.patched[layer, head]) == pytest.approx(total / 3, rel=1e-9, abs=1e-9)


def test_resample_at_one_position_keeps_only_each_prompts_outputs_there(
    tiny: LoadedModel,
) -> None:
    """#58: each prompt's source at one position is its (H, D) head outputs there, not a view
    that keeps its batch's whole (B, T, H, D) run alive: with --n in the thousands the views
    held every clean run of the task at once."""
    from headlab.causal.activation import _previous_at

    task, _ = _random_task(tiny, 3, 9, seed=4)
    sources = _previous_at(tiny, task, -1)
    assert sources is not None and sorted(sources) == [0, 1, 2]
    for per_layer in sources.values():
        for layer, z in per_layer.items():
            width = tiny.layout.heads_per_layer[layer]
            assert z.shape[0] == width and z.dim() == 2  # (H, D)
            assert z.untyped_storage().nbytes() == z.numel() * z.element_size()


def test_resample_sources_are_planned_and_refused_beyond_memory(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#58: the sources kept for --source resample at one position grow with --n; their plan
    bounds the bytes they hold (each tensor's storage, plus a tensor's bookkeeping), and a task
    whose sources would not fit is refused in one line naming --n and the most prompts that
    fit, before any source is computed."""
    from headlab.attention.memory import MEMORY_SHARE
    from headlab.causal import activation

    task, _ = _random_task(tiny, 6, 9, seed=4)
    sources = _previous_at_storages(tiny, task)
    planned = activation.resample_bytes(tiny, task.n_prompts)
    tensors = task.n_prompts * tiny.n_layers
    assert sources <= planned <= sources + tensors * activation.TENSOR_OVERHEAD

    def no_sources(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the sources were computed before their memory was checked")

    available = int(activation.resample_bytes(tiny, 4) / MEMORY_SHARE) + 1  # 4 prompts fit
    monkeypatch.setattr(activation, "available_bytes", lambda device: available)
    with monkeypatch.context() as m:
        m.setattr(activation, "_previous_at", no_sources)
        with pytest.raises(InputError) as info:
            activation_patching(tiny, task, source="resample", position=-1)
    line = str(info.value)
    assert line.startswith("--n/--prompts: --source resample at one position keeps")
    assert "\n" not in line and line.endswith("at most 4 prompts fit")
    # at every position the source is the batch's own clean run, which --n does not grow
    activation_patching(tiny, task, source="resample", position=None, layers=[0])


def _previous_at_storages(tiny: LoadedModel, task: Task) -> int:
    """The bytes of every distinct storage :func:`_previous_at` keeps."""
    from headlab.causal.activation import _previous_at

    sources = _previous_at(tiny, task, -1)
    assert sources is not None
    seen = {
        z.untyped_storage().data_ptr(): z.untyped_storage().nbytes()
        for per_layer in sources.values()
        for z in per_layer.values()
    }
    return sum(seen.values())
