"""Role statistics, heads, report and prune wherever the model is (cpu always, cuda when
present) and in any dtype: the same results as float32 on the CPU, end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.models.tiny import build

from headlab.cli import main
from headlab.datasets import read_conllu, read_frequencies, read_gap, sample_path
from headlab.models import load
from headlab.roles import RoleOptions, RoleReport, measure_roles
from headlab.roles.bootstrap import Sums

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

#: what ``headlab roles --limit 16 --replicates 4`` measures
OPTIONS = RoleOptions(replicates=4)
LIMIT = 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tiny")
    return {family: build(family, folder / family) for family in ("bert", "llama")}


@pytest.fixture(scope="module")
def data() -> tuple[Any, Any, Any]:
    return (
        read_conllu(sample_path("treebank"), limit=LIMIT),
        read_gap(sample_path("gap"), limit=LIMIT),
        read_frequencies(sample_path("frequencies")),
    )


@pytest.fixture(scope="module")
def reference(tiny: dict[str, Path], data: tuple[Any, Any, Any]) -> dict[str, RoleReport]:
    """float32 on the CPU, the native kernels where they are built: what every device and
    dtype is compared with."""
    tb, gap, freq = data
    return {
        f: measure_roles(load(path), tb, gap=gap, frequencies=freq, options=OPTIONS)
        for f, path in tiny.items()
    }


def _largest_differences(a: RoleReport, b: RoleReport) -> dict[str, float]:
    out: dict[str, float] = {}
    for x, y in zip(a.heads, b.heads, strict=True):
        for key, value in x.scores.items():
            other = y.scores[key]
            assert (value is None) == (other is None), key
            if value is not None and other is not None:
                out[key] = max(out.get(key, 0.0), abs(value - other))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["bert", "llama"])
def test_float32_statistics_on_any_device_match_the_cpu(
    tiny: dict[str, Path],
    data: tuple[Any, Any, Any],
    reference: dict[str, RoleReport],
    family: str,
    device: str,
) -> None:
    """On the model's device (torch's ops there, the native kernels on the CPU), every score,
    role, stability, relation and the coreference result match float32 on the CPU."""
    tb, gap, freq = data
    lm = load(tiny[family], device=device)
    assert lm.device.type == device
    report = measure_roles(lm, tb, gap=gap, frequencies=freq, options=OPTIONS)
    ref = reference[family]
    assert [h.role for h in report.heads] == [h.role for h in ref.heads]
    assert [h.stability for h in report.heads] == [h.stability for h in ref.heads]
    for key, diff in _largest_differences(ref, report).items():
        assert diff < 1e-4, key
    assert [(r.relation, r.layer, r.head, r.count) for r in report.relations] == [
        (r.relation, r.layer, r.head, r.count) for r in ref.relations
    ]
    assert report.data["device"].split(":")[0] == device.split(":")[0]
    assert report.data["dtype"] == ref.data["dtype"] == "float32"
    drop = ("device", "dtype")
    assert {k: v for k, v in report.data.items() if k not in drop} == {
        k: v for k, v in ref.data.items() if k not in drop
    }
    assert report.coreference is not None and ref.coreference is not None
    assert report.coreference.accuracy == pytest.approx(ref.coreference.accuracy, abs=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["bert", "llama"])
def test_roles_command_in_bfloat16_end_to_end(
    tiny: dict[str, Path],
    reference: dict[str, RoleReport],
    family: str,
    device: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``headlab roles --device D --dtype bfloat16``: a full JSON result whose scores stay
    near float32's (measured on these tiny models on the CPU: at most 0.0034 on the positional
    and rare-token shares, 0 to 1e-4 on the weight sums, one pronoun of 14 on coreference)."""
    argv = ["roles", "--model", str(tiny[family]), "--limit", str(LIMIT), "--replicates", "4"]
    assert main([*argv, "--device", device, "--dtype", "bfloat16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = reference[family].to_json()
    assert out["heads_in_layer"] == ref["heads_in_layer"]
    assert out["data"]["treebank"] == ref["data"]["treebank"]
    diffs: dict[str, float] = {}
    for a, b in zip(ref["heads"], out["heads"], strict=True):
        for key, value in a["scores"].items():
            if value is not None:
                diffs[key] = max(diffs.get(key, 0.0), abs(b["scores"][key] - value))
        assert b["stability"] is not None and 0.0 <= b["stability"] <= 1.0
    # weight sums and argmax shares over hundreds of rows move by well under 0.01; on a random
    # model's near-uniform weights, one of the 14 pronouns' two-way comparisons may flip
    pronouns = out["data"]["gap"]["used"]
    assert pronouns == ref["data"]["gap"]["used"] > 0
    for key, diff in diffs.items():
        assert diff <= (1 / pronouns + 1e-3 if key == "coreference" else 0.01), key


@pytest.mark.parametrize("device", DEVICES)
def test_heads_command_in_bfloat16_matches_float32(
    tiny: dict[str, Path], device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = []
    for dtype in ("float32", "bfloat16"):
        argv = ["heads", "--model", str(tiny["llama"]), "--device", device, "--dtype", dtype]
        assert main([*argv, "--json"]) == 0
        runs.append(json.loads(capsys.readouterr().out)["heads"])
    full, half = runs
    assert len(full) == len(half) == 8
    for a, b in zip(full, half, strict=True):
        assert b["special"] == pytest.approx(a["special"], abs=0.02)
        for x, y in zip(a["top"], b["top"], strict=True):
            assert y["weight"] == pytest.approx(x["weight"], abs=0.02)


@pytest.mark.parametrize("device", DEVICES)
def test_report_and_prune_commands_in_bfloat16(
    tiny: dict[str, Path], device: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(tiny["bert"])
    report = ["report", "--model", model, "--device", device, "--dtype", "bfloat16", "--roles-only"]
    report += ["--limit", "6", "--replicates", "0", "--no-gap", "--out", str(tmp_path / "r")]
    assert main(report) == 0
    assert (tmp_path / "r" / "index.html").is_file()
    prune = ["prune", "--model", model, "--device", device, "--dtype", "bfloat16"]
    prune += ["--limit", "24", "--fraction", "0.5", "--out", str(tmp_path / "p"), "--json"]
    capsys.readouterr()
    assert main(prune) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["heads_after"] < result["heads_before"]
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"  # saved as it ran
    assert sum(load(tmp_path / "p").layout.heads_per_layer) == result["heads_after"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dtype", "fp64"], "--dtype must be one of float32, bfloat16, float16, got 'fp64'"),
        (["--device", "tpu"], "--device must be cpu, cuda, cuda:N or mps, got 'tpu'"),
        (["--device", "cuda:99"], "--device cuda:99: "),
        (["--bf16", "--dtype", "float16"], "--bf16 is --dtype bfloat16"),
    ],
)
def test_bad_device_or_dtype_is_a_one_line_error(
    tiny: dict[str, Path], flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["roles"], ["heads"], ["report"], ["prune", "--curve"]):
        if "--bf16" in flags and command != ["roles"]:
            continue
        assert main([*command, "--model", str(tiny["bert"]), *flags]) == 1
        err = capsys.readouterr().err
        assert err.startswith("headlab: error: ") and err.count("\n") == 1, command
        assert message in err, command


@pytest.mark.parametrize("device", DEVICES)
def test_sums_accumulate_in_float64_on_the_device_and_come_to_the_cpu(device: str) -> None:
    sums = Sums(5, 3, seed=1, device=device)
    values = torch.arange(10, dtype=torch.float32, device=device).view(5, 2) / 3
    sums.add("x", range(5), values)
    sums.add_layer("y", 1, 2, [0, 2], values[[0, 2], None], n_heads=3)
    assert sums.get("x").device.type == device and sums.get("x").dtype == torch.float64
    same = Sums(5, 3, seed=1)  # the replicates do not depend on the device
    same.add("x", range(5), values.cpu())
    assert sums.cpu() is sums and sums.device.type == "cpu"
    assert torch.equal(sums.get("x"), same.get("x"))
    assert sums.get("y").shape == (4, 2, 3, 2) and sums.get("y")[:, 0].abs().sum() == 0
