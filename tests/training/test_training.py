"""Training on headlab's own attention: export parity, determinism, the schedule, checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from headlab.cli import main
from headlab.datasets import sample_path
from headlab.models import HeadCapture, load
from headlab.training import (
    ModelConfig,
    TinyTransformer,
    TrainConfig,
    load_checkpoint,
    save_checkpoint,
    to_gpt2,
)
from headlab.training.tasks import BindingTask, lm_loss
from headlab.training.trainer import lr_at, seed_everything, train


def _random_model(seed: int = 0) -> TinyTransformer:
    torch.manual_seed(seed)
    model = TinyTransformer(
        ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, max_len=16)
    )
    with torch.no_grad():  # move every weight off its initial value, biases included
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def test_export_to_gpt2_computes_the_same_logits() -> None:
    model = _random_model()
    hf = to_gpt2(model)
    ids = torch.randint(0, 50, (3, 16))
    with torch.no_grad():
        assert torch.allclose(model(ids), hf(input_ids=ids).logits, atol=1e-5)


def test_same_seed_same_model_other_seed_other_model() -> None:
    task = BindingTask(n_content=8, length=12)

    def run(seed: int) -> dict[str, torch.Tensor]:
        gen = seed_everything(seed)
        model = TinyTransformer(ModelConfig(vocab_size=50, d_model=32, n_heads=2, max_len=32))
        ids = torch.randint(0, 50, (2000,), generator=torch.Generator().manual_seed(5))
        train(model, lm_loss(ids, 16, 8), TrainConfig(steps=15, warmup=3, seed=seed), gen)
        return model.state_dict()

    a, b, c = run(0), run(0), run(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert task.vocab_size == 11


def test_warmup_then_cosine() -> None:
    cfg = TrainConfig(steps=100, lr=1.0, warmup=10)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(55, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(100, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 100))


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    model = _random_model(3)
    save_checkpoint(model, tmp_path / "ck", {"note": "x"})
    again = load_checkpoint(tmp_path / "ck")
    ids = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(ids), again(ids))


def test_binding_task_puts_markers_before_their_answers() -> None:
    task = BindingTask()
    ids, targets, where = task.batch(500, torch.Generator().manual_seed(0))
    s_tok, o_tok, q_tok = task.markers
    rows = torch.arange(500)
    assert torch.equal(ids[rows, where[:, 0] - 1], torch.full((500,), s_tok))
    assert torch.equal(ids[rows, where[:, 1] - 1], torch.full((500,), o_tok))
    assert torch.equal(ids[rows, where[:, 0]], targets[:, 0])
    assert torch.equal(ids[rows, where[:, 1]], targets[:, 1])
    assert bool((ids[:, -1] == q_tok).all()) and bool(
        ((where[:, 0] - where[:, 1]).abs() >= 2).all()
    )


def test_train_command_writes_a_model_headlab_and_transformers_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM

    text = tmp_path / "text.txt"
    words = [
        line.split("\t")[1]
        for line in sample_path("treebank").read_text().splitlines()
        if line and line[0].isdigit() and "\t" in line
    ]
    text.write_text(" ".join(words))
    out = tmp_path / "lm"
    argv = [
        "train",
        "--text",
        str(text),
        "--out",
        str(out),
        "--d-model",
        "32",
        "--layers",
        "2",
        "--heads",
        "2",
        "--context",
        "32",
        "--vocab",
        "300",
        "--steps",
        "20",
        "--json",
    ]
    assert main(argv) == 0
    info = json.loads(capsys.readouterr().out)
    assert math.isfinite(info["held_out_perplexity"]) and info["recipe"]["seed"] == 0
    assert json.loads((out / "RECIPE.json").read_text())["recipe"]["steps"] == 20
    lm = load(out)
    assert (lm.n_layers, lm.n_heads) == (2, 2) and lm.causal
    native = load_checkpoint(out / "headlab")
    ids = torch.tensor([lm.tokenizer("the cat sat on the mat")["input_ids"]])
    hf = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    with torch.no_grad():
        assert torch.allclose(native(ids), hf(input_ids=ids).logits, atol=1e-5)
        with HeadCapture(lm) as cap:
            lm.model(input_ids=ids)
        x = native.wte(ids) + native.wpe(torch.arange(ids.shape[1]))
        first = native.layers[0]
        ref = first.attn.inspect(first.ln_1(x), is_causal=True).weights
    assert torch.allclose(cap.pattern(0), ref, atol=1e-5)  # the heads headlab sees are ours
    assert main(argv) == 1  # the folder now exists


def test_quick_experiment_multi_head_beats_one_head(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "one-vs-many", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["task"] == "binding"
    runs = out["runs"]
    assert {(r["n_heads"], r["metric"]) for r in runs} == {(1, "accuracy"), (4, "accuracy")}
    acc = {r["n_heads"]: r["value"] for r in runs}
    assert acc[4] > acc[1] + 0.2
    # same width, same parameters: heads split the width
    assert len({r["params"] for r in runs}) == 1
    one = next(r for r in runs if r["n_heads"] == 1)["diagnostic"]["heads"]
    assert len(one) == 1 and one[0]["mass_on_subject"] + one[0]["mass_on_object"] <= 1.0 + 1e-6


def test_bundled_causal_model_opens_offline_for_causal_analysis() -> None:
    from headlab.datasets import read_conllu
    from headlab.roles import RoleOptions, measure_roles

    lm = load("tiny-shakespeare")
    recipe = json.loads((lm.path / "RECIPE.json").read_text())
    assert recipe["trained_by"] == "headlab train" and recipe["recipe"]["seed"] == 0
    assert lm.causal and (lm.n_layers, lm.n_heads) == (4, 4)
    assert sum(f.stat().st_size for f in lm.path.iterdir()) < 6_000_000  # a few MB
    report = measure_roles(
        lm,
        read_conllu(sample_path("treebank"), limit=20),
        options=RoleOptions(replicates=5, induction_sequences=8, induction_length=20),
    )
    for head in report.heads:
        assert 0.0 <= head.scores["induction"] <= 1.0
        assert 0.0 <= head.scores["previous"] <= 1.0


def test_summary_gives_no_spread_for_a_single_seed() -> None:
    """One seed has no standard deviation (not a spread of 0); several get the sample one."""
    import statistics

    from headlab.experiments.one_vs_many import summarise

    runs = [
        {"task": "binding", "n_heads": 1, "metric": "accuracy", "value": v} for v in (0.2, 0.4, 0.3)
    ] + [{"task": "binding", "n_heads": 4, "metric": "accuracy", "value": 1.0}]
    one, four = summarise(runs)
    assert one["n_heads"] == 1 and one["seeds"] == 3
    assert one["mean"] == pytest.approx(0.3)
    assert one["std"] == pytest.approx(statistics.stdev([0.2, 0.4, 0.3]))
    assert four["seeds"] == 1 and four["std"] is None


# -- the large setting (character-level language model), run here on a tiny scale ---------------


def _corpus(tmp_path: Path) -> Path:
    """A data folder holding a small corpus/tinyshakespeare/input.txt (the bundled treebank's
    sentences: real English, a few dozen distinct characters)."""
    from headlab.datasets import read_conllu

    lines = [" ".join(s.words) for s in read_conllu(sample_path("treebank"), limit=200)]
    folder = tmp_path / "data"
    (folder / "corpus" / "tinyshakespeare").mkdir(parents=True)
    (folder / "corpus" / "tinyshakespeare" / "input.txt").write_text("\n".join(lines) * 3)
    return folder


def _tiny_large(**kw: object) -> object:
    from headlab.experiments.one_vs_many import GridConfig

    tiny = dict(
        d_model=16,
        n_layers=1,
        d_ff=32,
        heads=(1, 4),
        seeds=(0,),
        lm_steps=4,
        lm_window=16,
        lm_batch=4,
        eval_windows=4,
    )
    return GridConfig.large(quick=True, **(tiny | kw))  # type: ignore[arg-type]


def test_char_tokens_round_trip_and_held_out_unknowns() -> None:
    from headlab.training.tasks import prepare_chars, split_text

    text = "abcab" * 4 + "abz!"  # 24 characters: 21 for training, "bz!" held out
    vocab, ids, held = prepare_chars(text)
    train_part, held_part = split_text(text)
    assert vocab == ["a", "b", "c", "<unk>"]
    assert "".join(vocab[i] for i in ids.tolist()) == train_part
    # characters the training part never showed get the one unknown id
    assert [vocab[i] for i in held.tolist()] == [c if c in "abc" else "<unk>" for c in held_part]


def test_large_setting_is_deterministic_under_a_seed(tmp_path: Path) -> None:
    from headlab.experiments.one_vs_many import one_vs_many

    data = _corpus(tmp_path)
    first = one_vs_many(_tiny_large(heads=(4,)), data=data)  # type: ignore[arg-type]
    again = one_vs_many(_tiny_large(heads=(4,)), data=data)  # type: ignore[arg-type]
    other = one_vs_many(_tiny_large(heads=(4,), seeds=(1,)), data=data)  # type: ignore[arg-type]
    values = [(r["n_heads"], r["value"], r["final_train_loss"]) for r in first["runs"]]
    assert values == [(r["n_heads"], r["value"], r["final_train_loss"]) for r in again["runs"]]
    assert values != [(r["n_heads"], r["value"], r["final_train_loss"]) for r in other["runs"]]


def test_large_setting_json_fields(tmp_path: Path) -> None:
    from headlab.experiments.one_vs_many import one_vs_many
    from headlab.training.tasks import prepare_chars, shakespeare_text

    data = _corpus(tmp_path)
    out = one_vs_many(_tiny_large(seeds=(0, 1)), data=data)  # type: ignore[arg-type]
    assert (out["setting"], out["device"], out["task"]) == ("large", "cpu", "language-model")
    assert out["config"]["tokenizer"] == "char" and out["config"]["d_model"] == 16
    runs = out["runs"]
    assert [(r["n_heads"], r["seed"]) for r in runs] == [(1, 0), (1, 1), (4, 0), (4, 1)]
    vocab, _, _ = prepare_chars(shakespeare_text(data))
    for r in runs:
        assert r["metric"] == "perplexity" and r["bits_per_token"] == pytest.approx(
            math.log2(r["value"])
        )
        # barely trained: no better than a uniform guess over the characters, and no worse than
        # a few times it
        assert 1.0 < r["value"] < 4 * len(vocab)
    assert len({r["params"] for r in runs}) == 1  # heads split the width
    for cell in out["summary"]:
        values = [r["value"] for r in runs if r["n_heads"] == cell["n_heads"]]
        assert cell["seeds"] == 2 and cell["mean"] == pytest.approx(sum(values) / 2)
        assert cell["std"] == pytest.approx(abs(values[0] - values[1]) / math.sqrt(2))


def test_large_setting_from_the_cli_on_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from headlab.experiments.one_vs_many import GridConfig

    real = GridConfig.large.__func__  # type: ignore[attr-defined]
    seen: list[dict[str, object]] = []

    def tiny(cls: type, *, quick: bool = False, **kw: object) -> object:
        seen.append({"quick": quick, **kw})
        return real(
            cls,
            quick=quick,
            d_model=16,
            n_layers=1,
            d_ff=32,
            heads=(1, 2),
            seeds=(0,),
            lm_steps=2,
            lm_window=8,
            lm_batch=2,
            eval_windows=2,
            **kw,
        )

    monkeypatch.setattr(GridConfig, "large", classmethod(tiny))
    data = _corpus(tmp_path)
    argv = ["experiment", "one-vs-many", "--setting", "large", "--quick", "--device", "cpu"]
    assert main([*argv, "--data", str(data), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert seen == [{"quick": True, "device": "cpu"}]
    assert out["setting"] == "large" and out["device"] == "cpu"
    assert [r["n_heads"] for r in out["summary"]] == [1, 2]


@pytest.mark.parametrize("device", ["bogus", "cuda:7"])
def test_one_vs_many_bad_device_is_one_line(
    device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    code = main(["experiment", "one-vs-many", "--setting", "large", "--device", device])
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("headlab: error: --device") and err.count("\n") == 1
