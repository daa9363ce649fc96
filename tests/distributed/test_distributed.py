"""Corpora across processes: torchrun's ranks give the JSON of one process, rank 0 alone writes,
and a rank that fails stops every rank with one line and no output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.models.tiny import build

from headlab import distributed
from headlab.cli import main
from headlab.datasets import read_conllu, read_gap, sample_path
from headlab.datasets.treebank import word_frequencies
from headlab.models import load
from headlab.roles.bootstrap import Sums
from headlab.roles.options import RoleOptions
from headlab.roles.passes import Cursor, gap_pass, treebank_pass
from headlab.roles.repeated import induction_pass

SRC = Path(__file__).resolve().parents[2] / "src"
ROOT = SRC.parent


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(ROOT), env.get("PYTHONPATH", "")])
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    env.pop("WORLD_SIZE", None)
    return env


def torchrun(args: list[str], *, ranks: int = 2, **env: str) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node ranks ARGS`` (``-m headlab ...`` or a script)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={ranks}", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=600, env=_env(**env), check=False
    )


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Equal JSON values, floats within 1e-9 (float64 sums added in another order)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-9), where
    else:
        assert a == b, where


def test_shards_of_the_batches_add_up_to_the_whole(tmp_path: Path) -> None:
    """Whatever the number of ranks, the shards' sums (bootstrap replicates included) add up to
    one process's: the batches and each sentence's weights do not depend on the ranks."""
    lm = load(build("gpt2", tmp_path / "gpt2"))
    tb = read_conllu(sample_path("treebank"), limit=16)
    gap = read_gap(sample_path("gap"), limit=8)
    freq = word_frequencies(tb)
    relations = sorted({r for s in tb for r in s.relations} - {"root"})
    opts = RoleOptions(replicates=7, batch_tokens=160, induction_sequences=6, induction_length=8)

    def run(part: tuple[int, int]) -> tuple[list[Sums], Counter[str], int]:
        ran = 0

        def count() -> None:
            nonlocal ran
            ran += 1

        cursor = Cursor(part=part, after_batch=count)
        sums = [Sums(n, 7, opts.seed + k) for k, n in enumerate((len(tb), len(gap.examples), 6))]
        counts: Counter[str] = Counter()
        treebank_pass(lm, tb, freq, relations, sums[0], opts, cursor)
        gap_pass(lm, gap, sums[1], opts, cursor, counts=counts)
        induction_pass(lm, sums[2], opts, cursor)
        return sums, counts, ran

    whole, whole_counts, whole_batches = run((0, 1))
    assert whole_batches > 4  # enough batches that every rank gets some
    for world in (3,):  # two ranks: the torchrun test below
        shards = [run((rank, world)) for rank in range(world)]
        assert sum(s[2] for s in shards) == whole_batches
        assert sum((s[1] for s in shards), Counter()) == whole_counts
        for k, sums in enumerate(whole):
            names = set().union(*(shard[0][k].values for shard in shards))
            assert names == set(sums.values)
            for name, value in sums.values.items():
                total = sum(
                    shard[0][k].values.get(name, torch.zeros_like(value)) for shard in shards
                )
                torch.testing.assert_close(total, value, rtol=1e-12, atol=1e-12, msg=name)


def test_one_process_never_starts_torch_distributed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    folder = build("bert", tmp_path / "bert")
    started = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: started.append(1))
    args = ["roles", "--model", str(folder), "--limit", "6", "--no-gap", "--replicates", "2"]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]
    assert started == [] and not distributed.launched() and distributed.part() == (0, 1)


@pytest.mark.slow
def test_two_ranks_give_the_json_of_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """roles on a causal model (treebank, GAP and induction passes, bootstrap stability): two
    gloo ranks under torchrun print one JSON, the one a single process prints."""
    folder = build("gpt2", tmp_path / "gpt2")
    args = ["roles", "--model", str(folder), "--limit", "40", "--replicates", "10", "--json"]
    args += ["--batch-tokens", "300"]  # a dozen batches: each rank gets several
    assert main(["--verbose", *args]) == 0  # --verbose: no exit-code mapping of errors
    one = json.loads(capsys.readouterr().out)
    two = torchrun(["-m", "headlab", *args])
    assert two.returncode == 0, two.stderr
    assert_same(json.loads(two.stdout), one)  # one JSON document: rank 1 wrote nothing
    assert one["data"]["gap"]["used"] > 0 and one["heads"][0]["stability"] is not None


@pytest.mark.slow
def test_prune_importance_across_two_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """prune's gradient importance, shared by two ranks, picks the heads one process picks."""
    folder = build("bert", tmp_path / "bert")
    args = ["prune", "--model", str(folder), "--curve", "--limit", "40", "--step", "0.25"]
    assert main([*args, "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    two = torchrun(["-m", "headlab", *args, "--json"])
    assert two.returncode == 0, two.stderr
    assert_same(json.loads(two.stdout), one)


FAILING_RANK = """
import sys
import torch.distributed
from headlab.cli import main
from headlab.roles import passes

real = passes.GapBlocks.__init__


def fail(self, *args, **kwargs):
    if torch.distributed.get_rank() == 1:
        raise MemoryError("out of memory on this rank")
    real(self, *args, **kwargs)


passes.GapBlocks.__init__ = fail
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_failing_rank_stops_every_rank_and_nothing_is_written(tmp_path: Path) -> None:
    """Rank 1 fails in the GAP pass, after the treebank's: both ranks stop with one line that
    names it, and nothing reaches stdout."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING_RANK)
    folder = build("bert", tmp_path / "bert")
    args = ["roles", "--model", str(folder), "--limit", "30", "--replicates", "2", "--json"]
    args += ["--batch-tokens", "300"]
    result = torchrun([str(script), *args], HEADLAB_DIST_TIMEOUT="120")
    assert result.returncode != 0
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.startswith("headlab: error:")]
    assert lines, result.stderr
    expected = (
        "headlab: error: rank 1 of 2 failed during the role statistics: "
        "MemoryError: out of memory on this rank"
    )
    assert expected in lines


KILLED_RANK = """
import os, signal, sys
import torch.distributed
from headlab.cli import main
from headlab.roles.checkpoint import Checkpoint

real = Checkpoint.after_batch
seen = 0


def after_batch(self, stage):
    done = real(self, stage)

    def hook():
        global seen
        done()
        seen += 1
        if torch.distributed.get_rank() == 1 and seen == 3:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


Checkpoint.after_batch = after_batch
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_ranks_resume_from_their_own_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 1 is SIGKILLed after its 3rd batch: torchrun ends the run, nothing is written; the
    same command resumes each rank from its own file and prints one process's JSON."""
    folder = build("bert", tmp_path / "bert")
    ckpt = tmp_path / "roles.ckpt"
    args = ["roles", "--model", str(folder), "--limit", "30", "--replicates", "3", "--json"]
    args += ["--batch-tokens", "300"]
    assert main(args) == 0
    one = json.loads(capsys.readouterr().out)
    script = tmp_path / "killed.py"
    script.write_text(KILLED_RANK)
    resumable = [*args, "--checkpoint", str(ckpt), "--checkpoint-every", "2"]
    killed = torchrun([str(script), *resumable])
    assert killed.returncode != 0 and killed.stdout == ""
    files = {p.name for p in tmp_path.glob("roles.ckpt*")}
    assert "roles.ckpt.rank1-of-2" in files, files
    saved = torch.load(tmp_path / "roles.ckpt.rank1-of-2", weights_only=True)
    assert sum(stage["done"] for stage in saved["stages"].values()) == 2
    resumed = torchrun(["-m", "headlab", *resumable])
    assert resumed.returncode == 0, resumed.stderr
    assert_same(json.loads(resumed.stdout), one)
    assert not list(tmp_path.glob("roles.ckpt*"))
