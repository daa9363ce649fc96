"""L0 head gates and recovery, against independent computations (NumPy, sampling, HeadCapture)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.models.tiny import build

from headlab.cli import main
from headlab.datasets import read_stsb, sample_path
from headlab.errors import DataFormatError, InputError
from headlab.models import HeadCapture, encode, load
from headlab.models.gates import deterministic_gates, expected_l0, sample_gates
from headlab.pruning import prune_model
from headlab.pruning.l0 import GateResult, L0Config, train_gates
from headlab.pruning.metrics import FidelityMetric, HeadGates, PerplexityMetric
from headlab.pruning.recovery import RecoveryConfig, mean_loss, recover
from headlab.pruning.workflow import PruneOptions, run_pruning


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("bert", tmp_path_factory.mktemp("bert") / "m")


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    pairs = read_stsb(sample_path("stsb"), limit=40)
    return list(dict.fromkeys(s for p in pairs for s in (p.first, p.second)))


def test_expected_l0_and_gates_match_numpy_and_sampling() -> None:
    log_alpha = torch.tensor([-4.0, -1.5, 0.0, 0.7, 3.0], dtype=torch.float64)
    beta, lo, hi = 2 / 3, -0.1, 1.1
    a = log_alpha.numpy()
    p_open = 1 / (1 + np.exp(-(a - beta * np.log(-lo / hi))))
    assert np.allclose(expected_l0(log_alpha).numpy(), p_open, atol=1e-12)
    det = np.clip(1 / (1 + np.exp(-a)) * (hi - lo) + lo, 0, 1)
    assert np.allclose(deterministic_gates(log_alpha).numpy(), det, atol=1e-12)
    assert deterministic_gates(log_alpha)[0] == 0.0  # closed exactly
    # the share of draws that are not exactly 0 is P(z != 0); draws stay in [0, 1]
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_gates(log_alpha, gen) for _ in range(20000)])
    assert float(draws.min()) >= 0.0 and float(draws.max()) <= 1.0
    share = (draws > 0).double().mean(0).numpy()
    assert np.allclose(share, p_open, atol=0.015)


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_a_gate_at_zero_is_the_zero_ablation_of_that_head(
    family: str, bert_folder: Path, tmp_path: Path
) -> None:
    """A gate at zero is that head's zero ablation; on ALBERT, whose one attention module
    serves every layer, each layer's call gets its own layer's gates (one hook on the shared
    output projection would apply both layers' gates at every call)."""
    if family == "bert":
        lm = load(bert_folder, dtype=torch.float64)
        batch = encode(lm, ["The chef prepared the fish.", "A dog ran."])
    else:
        from tests.models.architectures import build_model, inputs

        from headlab.models.loading import wrap

        lm = wrap(build_model("albert").double(), None, name="albert")
        batch = inputs(lm.model)
        assert lm.layers[0].out_proj is lm.layers[1].out_proj  # one module, both layers
    with torch.no_grad(), HeadCapture(lm, ablate={0: [1], 1: [3]}, record_queries_keys=False):
        ablated = lm.model(**batch).last_hidden_state
    gates = torch.ones(2, 4, dtype=torch.float64)
    gates[0, 1] = gates[1, 3] = 0.0
    with torch.no_grad(), HeadGates(lm, lambda: gates):
        gated = lm.model(**batch).last_hidden_state
    with torch.no_grad():
        plain = lm.model(**batch).last_hidden_state
    assert torch.equal(gated, ablated)
    assert not torch.allclose(plain, ablated)


def test_gate_training_is_deterministic_and_leaves_the_weights(
    bert_folder: Path, sentences: list[str]
) -> None:
    lm = load(bert_folder)
    data = FidelityMetric.build(lm, sentences)
    data.batch = 16
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    config = L0Config(weight=0.05, steps=15, seed=3)
    first = train_gates(lm, data, config)
    again = train_gates(lm, data, config)
    other = train_gates(lm, data, L0Config(weight=0.05, steps=15, seed=4))
    assert first.log_alpha == again.log_alpha and first.task_loss == again.task_loss
    assert first.log_alpha != other.log_alpha
    for key, value in lm.model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert all(p.requires_grad for p in lm.model.parameters())
    # the penalty pulls every gate down from its start; a heavy weight closes gates
    assert max(first.log_alpha) < 3.0
    heavy = train_gates(lm, data, L0Config(weight=50.0, steps=40, lr=0.2))
    assert len(heavy.closed_units()) > 0
    p = torch.tensor(heavy.p_open, dtype=torch.float64)
    assert torch.allclose(p, expected_l0(torch.tensor(heavy.log_alpha, dtype=torch.float64)))


def test_a_layer_whose_gates_all_close_keeps_its_most_open_head() -> None:
    units = [(0, [0]), (0, [1]), (0, [2]), (1, [0]), (1, [1])]
    alphas = [-6.0, -4.0, -5.0, -6.0, 2.0]
    gates = GateResult(
        config=L0Config(weight=2.0),
        units=units,
        log_alpha=alphas,
        p_open=[float(expected_l0(torch.tensor(a))) for a in alphas],
        gate=[float(deterministic_gates(torch.tensor(a))) for a in alphas],
        task_loss=[0.0],
        seconds=0.0,
    )
    removed, notes = gates.kept_set(2)
    assert removed == {0: [0, 2], 1: [0]}
    assert len(notes) == 1 and notes[0].startswith("layer 0: L0 weight 2 closes every gate")
    assert "keeping head 1" in notes[0]


def test_gqa_gates_are_kv_groups(tmp_path: Path) -> None:
    lm = load(build("llama", tmp_path / "m", lm_head=True), with_lm_head=True)
    text = sample_path("treebank").read_text()[:30000].replace("\t", " ")
    data = PerplexityMetric.from_text(lm, text, window=32, max_windows=16)
    gates = train_gates(lm, data, L0Config(steps=5))
    # 4 query heads in 2 KV groups per layer: one gate per group, with both its heads
    assert gates.units == [(0, [0, 1]), (0, [2, 3]), (1, [0, 1]), (1, [2, 3])]
    scores = gates.scores(lm)
    assert scores[0, 0] == scores[0, 1] and scores[1, 2] == scores[1, 3]


def test_recovery_lowers_the_distillation_loss(bert_folder: Path, sentences: list[str]) -> None:
    teacher = load(bert_folder)
    data = FidelityMetric.build(teacher, sentences)
    data.batch = 16
    small = prune_model(load(bert_folder), {0: [0, 1, 2], 1: [1, 2]})
    before = mean_loss(small, data)
    assert before > 1e-4
    done = recover(small, data, RecoveryConfig(steps=30, lr=1e-3))
    after = mean_loss(small, data)
    assert after < 0.5 * before
    assert done.steps == 30 and done.seconds > 0
    # the teacher's embeddings, fixed before pruning, did not move
    assert torch.allclose(FidelityMetric.build(teacher, sentences).reference, data.reference)


def test_too_short_text_for_recovery_is_a_one_line_error_before_the_search(
    bert_folder: Path,
) -> None:
    steps: list[object] = []
    options = PruneOptions(recover=5, limit=30)  # 10 importance pairs: 20 sentences < 32
    with pytest.raises(InputError, match=r"needs text for at least one batch of 32; got 20 "):
        run_pruning(load(bert_folder), options, on_step=steps.append)
    assert steps == []
    lm = load(bert_folder)
    short = FidelityMetric.build(lm, ["one sentence.", "two sentences."])
    with pytest.raises(InputError, match="recovery needs text for at least one batch"):
        recover(lm, short, RecoveryConfig(steps=3))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--curve", "--importance", "l0", "--l0-weight", "0"], "--l0-weight must be a positive"),
        (["--curve", "--compare", "--fraction", "0.5"], "either --fraction"),
        (["--fraction", "0.5", "--compare", "--out", "x"], "--compare goes with --curve"),
        (["--curve", "--figure", "f.png"], "--figure goes with --curve --compare"),
        (["--curve", "--recover", "0"], "--recover"),
        (["--curve", "--compare", "--x", "kv-bytes"], "needs a causal model"),
    ],
)
def test_bad_options_are_one_line_errors(
    bert_folder: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["prune", "--model", str(bert_folder), *args]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    # one line (argparse's own errors come after its usage lines)
    assert message in err[-1] and (len(err) == 1 or err[0].startswith("usage:"))


def test_compare_runs_the_three_methods_with_recovery(
    bert_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figure = tmp_path / "compare.png"
    args = ["prune", "--model", str(bert_folder), "--curve", "--compare", "--limit", "120"]
    args += ["--recover", "3", "--recover-at", "0.5", "--l0-steps", "10", "--step", "0.25"]
    assert main([*args, "--json", "--figure", str(figure)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "headlab.prune-compare/1"
    assert [m["importance"] for m in data["methods"]] == ["gradient", "ablation", "l0"]
    for m in data["methods"]:
        assert m["curve"][0]["metric"] == data["metric_before"]  # the same evaluation data
        (rec,) = m["recovered"]
        assert rec["heads_removed"] == 4 and rec["steps"] == 3
        point = next(p for p in m["curve"] if p["step"] == rec["step"])
        assert rec["metric_before"] == point["metric"]
        assert rec["seconds"] > 0 and math.isfinite(rec["metric_after"])
    assert "l0" in data["methods"][2] and len(data["methods"][2]["l0"]["p_open"]) == 8
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from headlab.pruning.workflow import read_pruning_json

    assert read_pruning_json(data, "compare.json")["methods"][0]["curve"]


def test_a_figure_that_cannot_be_written_after_the_work_is_one_line(
    bert_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """#58: a disk that fills up after the checks: the compare figure's write fails in one line
    naming the file, no traceback, nothing half-written and no JSON printed as if it were."""
    import errno
    import os
    import tempfile

    real = tempfile.mkstemp

    def full(*args: Any, dir: Any = None, **kwargs: Any) -> Any:
        if dir is not None and Path(dir) == tmp_path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", full)
    figure = tmp_path / "compare.png"
    args = ["prune", "--model", str(bert_folder), "--curve", "--compare", "--limit", "120"]
    args += ["--l0-steps", "2", "--step", "0.5", "--json", "--figure", str(figure)]
    assert main(["-q", *args]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"headlab: error: cannot write {figure}: No space left on device\n"
    assert captured.out == "" and list(tmp_path.iterdir()) == []


def test_the_gates_decide_and_recovery_is_saved(
    bert_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "small"
    args = ["prune", "--model", str(bert_folder), "--importance", "l0", "--out", str(out)]
    args += ["--l0-weight", "50", "--l0-steps", "80", "--recover", "3", "--limit", "120"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    closed = data["l0"]["closed"]
    assert closed > 0
    kept_note = [n for n in data["notes"] if "closes every gate" in n]
    assert data["heads_before"] - data["heads_after"] == closed - len(kept_note)
    assert all(h >= 1 for h in data["heads_per_layer"])
    rec = data["recovery"]
    assert rec["steps"] == 3 and rec["metric_before"] == pytest.approx(data["metric_after"])
    small = load(out)
    assert sum(small.layout.heads_per_layer) == data["heads_after"]


def test_kv_bytes_per_token_follow_the_kv_groups(tmp_path: Path) -> None:
    from headlab.pruning.methods import kv_bytes
    from headlab.pruning.progressive import progressive_prune

    lm = load(build("llama", tmp_path / "m", lm_head=True), with_lm_head=True)
    text = sample_path("treebank").read_text()[:30000].replace("\t", " ")
    ppl = PerplexityMetric.from_text(lm, text, window=32, max_windows=6)
    search = progressive_prune(lm, ppl, ppl, fraction=0.5, step=0.25)
    sizes = kv_bytes(lm, search)
    assert len(sizes) == len(search.points) >= 3
    for point, size in zip(search.points, sizes, strict=True):
        # 2 (K and V) x KV heads left x head width 8 x 4 bytes (float32), over the 2 layers
        kv_left = [2 - len(point.removed.get(layer, [])) // 2 for layer in range(2)]
        assert size == sum(2 * kv * 8 * 4 for kv in kv_left)
    assert sizes[0] == 2 * (2 * 2 * 8 * 4) and sizes[-1] < sizes[0]


def test_the_cli_defaults_are_the_library_defaults() -> None:
    from headlab.cli import prune as cli
    from headlab.pruning import workflow

    assert (cli.L0_WEIGHT, cli.L0_STEPS) == (workflow.L0_WEIGHT, workflow.L0_STEPS)
    assert PruneOptions().l0_config == L0Config(weight=cli.L0_WEIGHT, steps=cli.L0_STEPS)


def test_the_compare_figure_can_put_kv_bytes_on_the_x_axis(tmp_path: Path) -> None:
    from headlab.pruning.figure import pruning_compare
    from headlab.pruning.workflow import read_pruning_json

    def method(name: str) -> dict:
        curve = [
            {
                "step": i,
                "heads_removed": 2 * i,
                "fraction": i / 4,
                "metric": 10.0 + i,
                "loss": i,
                "kv_bytes_per_token": 128 - 32 * i,
            }
            for i in range(3)
        ]
        recovered = [
            {
                "step": 2,
                "heads_removed": 4,
                "fraction": 0.5,
                "steps": 5,
                "metric_before": 12.0,
                "metric_after": 11.0,
                "loss_after": 1.0,
            }
        ]
        return {
            "model": "m",
            "metric": "perplexity",
            "unit": "perplexity",
            "importance": name,
            "curve": curve,
            "recovered": recovered,
        }

    data = {
        "schema": "headlab.prune-compare/1",
        "model": "m",
        "metric": "perplexity",
        "unit": "perplexity",
        "higher_is_better": False,
        "metric_before": 10.0,
        "x": "kv-bytes",
        "methods": [method(m) for m in ("gradient", "ablation", "l0")],
    }
    checked = read_pruning_json(data, "compare.json")
    path = pruning_compare(checked, tmp_path / "kv.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    broken = {**data, "methods": [{**method("l0"), "curve": []}]}
    with pytest.raises(DataFormatError, match=r"methods\[0\]: .*'curve' must be a non-empty"):
        read_pruning_json(broken, "compare.json")
