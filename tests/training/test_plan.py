"""#58 item 3: ``headlab train`` plans its memory before it trains. The plan is an upper bound
of the peak torch's CPU allocator measures over a whole run, not a loose one, and sizes beyond
it are refused in one line naming the flag and the most that fits, before the tokenizer or the
model is built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from headlab.attention.memory import MEMORY_SHARE
from headlab.cli import main
from headlab.datasets.bundled import sample_path
from headlab.errors import InputError
from headlab.experiments.peak import peak_bytes
from headlab.training import plan
from headlab.training.language_model import LMRecipe, train_language_model
from headlab.training.model import ModelConfig, TinyTransformer


def _text() -> str:
    return sample_path("shakespeare").read_text(encoding="utf-8") * 3  # 29,355 characters


def test_the_parameters_counted_are_the_model_s() -> None:
    for e, layers, ff, t, v in ((32, 2, 128, 64, 300), (48, 3, 100, 16, 1000)):
        model = TinyTransformer(
            ModelConfig(vocab_size=v, d_model=e, n_layers=layers, n_heads=4, d_ff=ff, max_len=t)
        )
        counted = sum(p.numel() for p in model.parameters())
        assert plan.parameters(e, layers, ff, t, v) == counted


@pytest.mark.parametrize(
    "sizes",
    [
        {"d_model": 32, "n_layers": 2, "n_heads": 2, "context": 64, "vocab_size": 300},
        {"d_model": 64, "n_layers": 1, "n_heads": 16, "context": 256, "vocab_size": 300},
        {"d_model": 32, "n_layers": 1, "n_heads": 1, "context": 32, "vocab_size": 2000},
    ],
    ids=["default-shape", "long-context-many-heads", "large-vocabulary"],
)
def test_the_planned_peak_bounds_a_measured_training_run(
    sizes: dict[str, int], tmp_path: Path
) -> None:
    """The whole of ``train_language_model`` (tokenizer, steps, held-out perplexity, export),
    measured by torch's CPU allocator (the profiler of ``experiment cost``), stays under the
    plan, and the plan is within 2x of it."""
    recipe = LMRecipe(**sizes, d_ff=4 * sizes["d_model"], steps=3, batch_size=32)
    text = _text()

    def run() -> None:
        train_language_model(text, tmp_path / "m", recipe, source="t", overwrite=True)

    measured = peak_bytes(run, torch.device("cpu"))
    planned = plan.planned_peak(
        d_model=recipe.d_model,
        n_layers=recipe.n_layers,
        d_ff=recipe.d_ff,
        context=recipe.context,
        vocab=recipe.vocab_size,
        batch=recipe.batch_size,
    )
    print(f"{sizes}: measured {measured:,} B, planned {planned:,} B")
    assert measured <= planned <= 2 * measured, (measured, planned)


def _refused(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> str:
    """``headlab train ARGV`` with 2 GiB available: its one line; nothing trained or written."""
    import headlab.training.language_model as lm_module

    def no_work(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the tokenizer was trained before the sizes were checked")

    monkeypatch.setattr(lm_module, "available_bytes", lambda device: 2 << 30)
    monkeypatch.setattr(lm_module, "prepare_text", no_work)
    text = tmp_path / "text.txt"
    text.write_text(_text())
    out = tmp_path / "m"
    assert main(["train", "--text", str(text), "--out", str(out), *argv]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert not out.exists()
    return line


def test_a_context_beyond_memory_names_the_flag_and_the_longest_that_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    line = _refused(["--context", "4096", "--vocab", "65536"], tmp_path, monkeypatch, capsys)
    budget = int(MEMORY_SHARE * (2 << 30))
    sizes = {"d_model": 128, "n_layers": 4, "d_ff": 512, "vocab": 65536, "batch": 32}
    assert line.startswith("headlab: error: --context 4096: a batch of 32 windows")
    longest = int(line.rsplit("the longest that fits is ", 1)[1].split()[0].replace(",", ""))
    assert plan.planned_peak(**sizes, context=longest) <= budget
    assert plan.planned_peak(**sizes, context=longest + 1) > budget
    assert "more than 80% of the 2.0 GiB available here" in line


def test_a_model_too_wide_for_any_context_names_d_model_and_the_widest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    argv = ["--d-model", "4096", "--layers", "64", "--heads", "32", "--context", "64"]
    line = _refused(argv, tmp_path, monkeypatch, capsys)
    assert line.startswith("headlab: error: --d-model 4096: 64 layers of this width")
    widest = int(line.rsplit("the widest that fits at --context 64 is ", 1)[1].replace(",", ""))
    assert widest % 32 == 0
    budget = int(MEMORY_SHARE * (2 << 30))

    def peak(e: int) -> int:
        return plan.planned_peak(
            d_model=e, n_layers=64, d_ff=4 * e, context=64, vocab=1024, batch=32
        )

    assert peak(widest) <= budget < peak(widest + 32)


def test_sizes_that_fit_are_not_refused() -> None:
    recipe = LMRecipe()  # the command's defaults
    recipe.check_memory(1 << 30)  # 1 GiB: about 294 MiB planned
    recipe.check_memory(None)  # not known: no check
    with pytest.raises(InputError, match=r"^--context 128: .* the longest that fits is "):
        recipe.check_memory(100 << 20)
    with pytest.raises(InputError, match=r"^--d-model 128: .* none with --heads 4 fits"):
        recipe.check_memory(1 << 20)
