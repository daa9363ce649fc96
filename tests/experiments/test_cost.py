"""``headlab experiment cost``: same parameters and FLOPs across head counts, FLOPs by part as
``headlab spec`` counts them, the loop over heads equal to the batched module, the CLI's JSON and
figure, and the request writing the figure itself. No timing assertions: speed is measured, not
tested."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from headlab.attention import MultiHeadAttention
from headlab.errors import ConfigError, InputError
from headlab.experiments.cost import (
    CostOptions,
    count_params,
    flops_by_part,
    loop_over_heads,
    spec_flops,
)
from headlab.experiments.cost_figure import cost_figure
from headlab.experiments.cost_request import CostRequest
from headlab.experiments.peak import _without_profiler_log, peak_bytes


def test_parameters_are_identical_across_head_counts() -> None:
    """At width 96 every head count that divides it has 4 E^2 + 4 E parameters, in headlab's
    module and in torch's."""
    e = 96
    counts = set()
    for h in (1, 2, 3, 4, 8, 12, 32, 96):
        counts.add(count_params(MultiHeadAttention(d_model=e, n_heads=h)))
        counts.add(count_params(nn.MultiheadAttention(e, h, batch_first=True)))
    assert counts == {4 * e * e + 4 * e}


def test_flops_by_part_sum_to_spec_total_and_match_by_hand() -> None:
    e, h, t, b = 768, 12, 512, 2
    d = e // h
    parts = flops_by_part(e, h, t, b)
    tokens = b * t
    assert parts["projections"] == tokens * 2 * 3 * e * e
    assert parts["scores"] == tokens * 2 * h * d * t
    assert parts["values"] == tokens * 2 * h * d * t
    assert parts["output"] == tokens * 2 * e * e
    assert parts["softmax"] == tokens * 5 * h * t
    matmuls = sum(parts[k] for k in ("projections", "scores", "values", "output"))
    assert parts["matmuls"] == matmuls == spec_flops(e, h, t, b)
    assert parts["total"] == matmuls + parts["softmax"]
    # the matrix products do not depend on how the width is cut into heads
    assert {flops_by_part(e, n, t)["matmuls"] for n in (1, 4, 64)} == {
        flops_by_part(e, 1, t)["matmuls"]
    }


@pytest.mark.parametrize(("heads", "bias"), [(1, True), (4, True), (16, False)])
def test_loop_over_heads_equals_the_batched_module(heads: int, bias: bool) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=64, n_heads=heads, bias=bias).eval()
    if bias:
        with torch.no_grad():
            mha.in_proj.bias.normal_()
            mha.out_proj.bias.normal_()
    x = torch.randn(2, 37, 64)
    with torch.no_grad():
        expected = mha(x)
        got = loop_over_heads(mha, x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_loop_over_heads_refuses_grouped_heads() -> None:
    with pytest.raises(ConfigError, match="n_kv_heads"):
        loop_over_heads(
            MultiHeadAttention(d_model=32, n_heads=4, n_kv_heads=2), torch.randn(1, 3, 32)
        )


def test_peak_bytes_sees_a_known_allocation() -> None:
    """A call that allocates one 4 MiB tensor peaks at least there (CPU profiler method)."""
    peak = peak_bytes(lambda: torch.ones(1 << 20), torch.device("cpu"))
    assert peak >= 4 << 20


def test_options_refuse_heads_that_do_not_divide() -> None:
    with pytest.raises(ConfigError, match=r"^--heads 3: each head count must divide the width 256"):
        CostOptions.quick(heads=(3,))
    with pytest.raises(ConfigError, match=r"^--rounds"):
        CostOptions(rounds=1)


KEYS = {"options", "device", "paths", "memory_method", "timing_method", "wall_s", "rows"}
ROW_KEYS = {
    "heads",
    "head_dim",
    "length",
    "params",
    "flops",
    "spec_flops",
    "weights_bytes",
    "forward_s",
    "forward_backward_s",
    "ratios",
    "ratio_spread",
    "memory_forward",
    "memory_forward_backward",
    "loop_max_abs_diff",
}


def test_cli_quick_json_and_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from headlab.cli import main

    figure = tmp_path / "out" / "cost.png"
    argv = ["experiment", "cost", "--quick", "--heads", "1,8", "--lengths", "32", "--json"]
    assert main([*argv, "--figure", str(figure)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == KEYS
    assert data["device"] == "cpu"
    assert [(r["heads"], r["length"]) for r in data["rows"]] == [(1, 32), (8, 32)]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS
        assert row["params"]["headlab"] == row["params"]["torch"] == 4 * 256 * 256 + 4 * 256
        assert set(row["forward_s"]) == {"torch", "fused", "torch_weights", "weights", "loop"}
        assert set(row["ratios"]) == {
            "fused_vs_torch",
            "weights_vs_torch",
            "loop_vs_fused",
            "fused_vs_torch_fb",
            "weights_vs_torch_fb",
        }
        assert row["flops"]["matmuls"] == row["spec_flops"]
        # heads one at a time through their slices of W_O, summed: the module's output
        assert 0.0 <= row["loop_max_abs_diff"] <= 1e-5
        # the kept weights are in the weights path's peak, not in the fused path's
        assert row["memory_forward"]["weights"] >= row["weights_bytes"]
    eight = data["rows"][1]
    assert eight["memory_forward"]["fused"] < eight["memory_forward"]["weights"]
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in figure.parent.iterdir() if p.name.startswith(".")]


def test_the_request_writes_the_figure_of_its_json(tmp_path: Path) -> None:
    """``CostRequest.run`` writes the figure itself (no CLI), the PNG the figure function draws
    from the JSON it returns; a figure path that cannot be written is refused before anything
    is measured."""
    figure = tmp_path / "cost.png"
    asked = CostRequest(width=32, heads=(1, 4), lengths=(8, 16), rounds=2, figure=str(figure))
    data = asked.run().to_json()
    assert [(r["heads"], r["length"]) for r in data["rows"]] == [(1, 8), (4, 8), (1, 16), (4, 16)]
    drawn = cost_figure(data, tmp_path / "drawn.png")
    assert figure.read_bytes() == drawn.read_bytes()
    (tmp_path / "file").write_text("")
    for bad, says in (
        (tmp_path, "expected a .png file"),
        (tmp_path / "file" / "cost.png", "not a folder"),
    ):
        with pytest.raises(InputError, match=f"--figure {bad}: .*{says}"):
            CostRequest(quick=True, figure=str(bad))
    with pytest.raises(ConfigError, match="--heads 3"):
        CostRequest(width=32, heads=(3,))


def test_cli_table(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from headlab.cli import main

    monkeypatch.setenv("COLUMNS", "240")  # one line per row, whatever the terminal

    argv = ["experiment", "cost", "--quick", "--heads", "4", "--lengths", "16", "--no-backward"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "FLOPs by part" in out and "peak memory" in out and "loop / fused" in out


def test_cuda_without_a_gpu_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from headlab.experiments.cost import run_cost

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="no CUDA device"):
        run_cost(CostOptions.quick(device="cuda"))


def test_default_heads_follow_the_width() -> None:
    assert CostOptions.default_heads(768) == (1, 2, 4, 8, 12, 16, 32, 64)
    assert CostOptions.default_heads(256) == (1, 2, 4, 8, 16, 32, 64)


def test_cli_model_takes_its_width_and_adds_its_head_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--model`` measures heads at that model's width, its own head count among them."""
    from headlab.cli import main

    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 96,
                "num_hidden_layers": 2,
                "num_attention_heads": 6,
                "num_key_value_heads": 2,
            }
        ),
        encoding="utf-8",
    )
    argv = ["experiment", "cost", "--quick", "--model", str(config), "--lengths", "16"]
    assert main([*argv, "--rounds", "2", "--no-backward", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["options"]["width"] == 96
    assert [r["heads"] for r in data["rows"]] == [1, 4, 6, 16]
    assert main(["experiment", "cost", "--model", str(config), "--width", "64"]) == 1
    assert "not both" in capsys.readouterr().err


def test_the_reports_cost_stage_writes_only_headlabs_lines_to_stderr() -> None:
    """The cost stage of ``headlab report`` (``CostOptions.quick``, measured as the report
    measures it, in a fresh process where the profiler's C++ log is set up at torch's import)
    leaves nothing on stderr but headlab's own lines: torch 2.13's profiler wrote two
    ``USDT: ... profiler_start/stop`` lines per measured call, 54 in all."""
    script = (
        "from headlab.experiments.cost import CostOptions, run_cost\n"
        "from headlab.progress import PlainProgress\n"
        "import sys\n"
        "run_cost(CostOptions.quick(rounds=2), progress=PlainProgress('headlab report', sys.stderr))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    lines = done.stderr.splitlines()
    assert lines, "the stage reports its progress"
    assert [line for line in lines if not line.startswith("headlab report")] == []


def test_profiler_quieting_passes_other_stderr_lines_on(capfd: pytest.CaptureFixture[str]) -> None:
    """What is written to stderr while the profiler starts or stops, other than its own log
    lines, still reaches stderr."""
    with _without_profiler_log():
        os.write(2, b"USDT:2026-12-07 16:34:04 6757:6757 SyncActivityProfilerHandler.cpp:52] x\n")
        os.write(2, b"a warning worth seeing\n")
    assert capfd.readouterr().err == "a warning worth seeing\n"


# --- #58 item 3: a grid that cannot fit in memory is refused before it runs ----------------------


def test_the_planned_peak_bounds_every_measured_peak() -> None:
    """The plan the refusal rests on is an upper bound of what each path measures (forward and
    forward + backward, CPU profiler), and not a loose one (within 4x of the largest)."""
    from headlab.experiments.cost import planned_peak, run_cost

    opts = CostOptions(width=64, heads=(1, 4), lengths=(256, 512), rounds=2)
    for row in run_cost(opts).rows:
        measured = [*row.memory_forward.values(), *row.memory_forward_backward.values()]
        largest = max(m for m in measured if m is not None)
        plan = planned_peak(opts, row.heads, row.length)
        assert largest <= plan <= 4 * largest, (row.heads, row.length, largest, plan)


def test_a_grid_beyond_memory_names_the_flag_and_the_longest_that_fits() -> None:
    """The longest length said to fit is the one a closed-form solution of the plan's
    quadratic gives; one token beyond it does not fit."""
    import math

    from headlab.errors import InputError
    from headlab.experiments.cost import (
        ACTIVATIONS_PER_TOKEN,
        MEMORY_SHARE,
        PEAK_PER_WEIGHT,
        check_memory,
    )

    available = 16 << 30
    opts = CostOptions(lengths=(512, 1_000_000), batch=2)
    with pytest.raises(InputError) as info:
        check_memory(opts, available)
    line = str(info.value)
    assert line.startswith("--lengths 1000000: 64 heads, --batch 2 at --width 768 would take")
    # the oracle: a T^2 + b T + c <= budget
    budget = int(MEMORY_SHARE * available)
    a = 2 * 64 * PEAK_PER_WEIGHT["backward"]
    b = ACTIVATIONS_PER_TOKEN * 2 * 768 * 4
    c = 2 * 2 * (4 * 768 * 768 + 4 * 768) * 4
    fits = (-b + math.isqrt(b * b + 4 * a * (budget - c))) // (2 * a)
    while a * (fits + 1) ** 2 + b * (fits + 1) + c <= budget:
        fits += 1
    while a * fits**2 + b * fits + c > budget:
        fits -= 1
    assert line.endswith(f"the longest that fits is {fits:,} tokens")
    check_memory(CostOptions(lengths=(fits,), batch=2), available)  # it does fit
    check_memory(opts, None)  # memory not known: no refusal
    with pytest.raises(InputError, match=r"^--width 10000000: its weights"):
        check_memory(CostOptions(width=10_000_000, heads=(1,), lengths=(1,)), available)


def test_experiment_cost_lengths_of_a_million_end_in_one_line_at_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``headlab experiment cost --lengths 1000000`` ran until memory ran out; now one line,
    before any grid point is measured."""
    import headlab.experiments.cost as cost
    from headlab.cli import main

    def measured(*args: object, **kwargs: object) -> None:
        raise AssertionError("a grid point was measured")

    monkeypatch.setattr(cost, "measure_point", measured)
    monkeypatch.setattr(cost, "available_bytes", lambda device: 64 << 30)
    assert main(["experiment", "cost", "--lengths", "1000000"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("headlab: error: --lengths 1000000: 64 heads at --width 768")
    assert "of the 64.0 GiB available here; the longest that fits is" in line
