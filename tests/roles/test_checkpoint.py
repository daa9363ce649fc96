"""roles --checkpoint: a run killed mid-corpus resumes to the JSON of an uninterrupted run;
a checkpoint from other arguments is refused with one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.models.tiny import build

from headlab.cli import main

SRC = Path(__file__).resolve().parents[2] / "src"

#: runs the CLI and SIGKILLs itself after the KILL_AFTER-th batch (between checkpoints)
KILLED = """
import os, signal, sys
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
        if seen == int(os.environ["KILL_AFTER"]):
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


Checkpoint.after_batch = after_batch
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_uninterrupted_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = build("gpt2", tmp_path / "gpt2")
    ckpt = tmp_path / "roles.ckpt"
    args = ["roles", "--model", str(folder), "--limit", "30", "--replicates", "5", "--json"]
    args += ["--batch-tokens", "300"]
    assert main(args) == 0
    whole = capsys.readouterr().out
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    env["KILL_AFTER"] = "7"  # the treebank's batches, then into the GAP pass
    command = [sys.executable, str(script), *args, "--checkpoint", str(ckpt)]
    killed = subprocess.run(
        [*command, "--checkpoint-every", "3"], capture_output=True, text=True, env=env, timeout=600
    )
    assert killed.returncode == -signal.SIGKILL
    assert killed.stdout == "" and ckpt.exists()  # saved after batch 6: 6 done, 1 lost
    state = torch.load(ckpt, weights_only=True)
    assert sum(stage["done"] for stage in state["stages"].values()) == 6
    assert state["stages"]["treebank"]["values"]  # the resumed run starts from these sums
    assert main([*args, "--checkpoint", str(ckpt), "--checkpoint-every", "3"]) == 0
    assert capsys.readouterr().out == whole  # the same bytes
    assert not ckpt.exists()  # the result is out: the checkpoint is gone


def test_a_checkpoint_of_other_arguments_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from headlab.datasets import read_conllu, sample_path
    from headlab.models import load
    from headlab.roles import RoleOptions, measure_roles
    from headlab.roles.checkpoint import Checkpoint

    folder = build("bert", tmp_path / "bert")
    ckpt = tmp_path / "roles.ckpt"
    lm = load(folder)
    tb = read_conllu(sample_path("treebank"), limit=8)
    cp = Checkpoint(ckpt, every=1)
    measure_roles(lm, tb, options=RoleOptions(replicates=2, batch_tokens=200), checkpoint=cp)
    assert ckpt.exists()  # the library keeps it; the CLI deletes it once the result is out
    args = ["roles", "--model", str(folder), "--limit", "8", "--no-gap", "--replicates", "3"]
    capsys.readouterr()  # what building the folder printed (transformers' shard bar)
    assert main([*args, "--checkpoint", str(ckpt)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "other arguments, model or data" in err, err
    ckpt.write_bytes(b"not a checkpoint")
    assert main([*args, "--checkpoint", str(ckpt)]) == 1
    assert "cannot be read" in capsys.readouterr().err
