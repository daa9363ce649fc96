"""Progress of long commands: stderr only, a rich bar on a terminal, plain stage lines
elsewhere, nothing with ``--quiet`` or on torchrun ranks other than 0.

The commands run for real on tiny random models and the bundled samples; the oracle of each
count is the run's own result (sentences used, steps asked for), never the reporter."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.models.tiny import build

from headlab.cli import main
from headlab.datasets import read_gap, read_treebank, sample_path
from headlab.models import load
from headlab.progress import NO_PROGRESS, PlainProgress, Progress

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 24
#: a stage's closing line: ``headlab roles: treebank: 24 sentences, 1.2 s (19.6 sentences/s)``
STAGE = re.compile(r"^(headlab [\w ]+): ([\w .-]+): ([\d,]+)(?:/[\d,]+)? (\w+), [\d.]+ s")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("progress")
    return {
        "bert": build("bert", folder / "bert"),
        "gpt2": build("gpt2", folder / "gpt2", lm_head=True),
    }


class Recorder:
    """A :class:`Progress` that keeps every call."""

    def __init__(self) -> None:
        self.stages: list[dict[str, Any]] = []

    def start(self, name: str, total: int | None = None, unit: str = "items") -> None:
        self.stages.append({"name": name, "total": total, "unit": unit, "steps": [], "ended": 0})

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        self.stages[-1]["steps"].append(n)

    def end(self) -> None:
        self.stages[-1]["ended"] += 1


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "FORCE_COLOR", "TTY_COMPATIBLE")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    return {**env, "HEADLAB_NATIVE": env.get("HEADLAB_NATIVE", "0"), **extra}


def _headlab(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headlab", *argv],
        capture_output=True,
        text=True,
        env=_env(**env),
        cwd=ROOT,
        timeout=600,
    )


def _stage_lines(err: str) -> list[tuple[str, ...]]:
    return [m.groups() for line in err.splitlines() if (m := STAGE.match(line))]


def test_the_recorder_and_the_default_are_progress() -> None:
    assert isinstance(Recorder(), Progress) and isinstance(NO_PROGRESS, Progress)


def test_roles_reports_each_pass_once_per_batch(tiny: dict[str, Path]) -> None:
    """The treebank and GAP passes of an encoder, the induction pass of a decoder: each one
    stage whose count is the sentences the result says it used, advanced per batch."""
    from headlab.roles import RoleOptions, measure_roles

    gold = read_treebank(sample_path("treebank"), limit=LIMIT)
    gap = read_gap(sample_path("gap"), limit=LIMIT)
    options = RoleOptions(replicates=0, batch_tokens=512)
    rec = Recorder()
    report = measure_roles(load(tiny["bert"]), gold, gap=gap, options=options, progress=rec)
    assert [s["name"] for s in rec.stages] == ["treebank", "GAP"]
    treebank, coref = rec.stages
    assert treebank["total"] == sum(treebank["steps"]) == report.data["treebank"]["used"]
    assert coref["total"] == sum(coref["steps"]) == LIMIT - sum(gap.skipped.values())
    assert all(s["ended"] == 1 for s in rec.stages)
    assert (treebank["unit"], coref["unit"]) == ("sentences", "passages")  # GAP: passages
    # per batch, not per sentence: a few calls for the whole pass
    assert 1 < len(treebank["steps"]) < LIMIT

    rec = Recorder()
    measure_roles(load(tiny["gpt2"]), gold, options=options, progress=rec)
    assert [s["name"] for s in rec.stages] == ["treebank", "induction"]
    induction = rec.stages[1]
    assert induction["total"] == sum(induction["steps"]) == options.induction_sequences


def test_a_failed_stage_is_not_ended(tiny: dict[str, Path]) -> None:
    """A stage an error cut short gets no end (its plain line would claim it finished)."""
    from headlab.errors import InputError
    from headlab.models import stream_corpus

    lm = load(tiny["bert"])
    rec = Recorder()

    def boom(batch: Any) -> Any:
        raise InputError("stop")

    with pytest.raises(InputError):
        stream_corpus(lm, ["a b c", "d e f"], boom, progress=rec, stage="corpus")
    assert rec.stages[0]["name"] == "corpus" and rec.stages[0]["ended"] == 0


def test_a_share_of_the_batches_counts_only_its_sentences(tiny: dict[str, Path]) -> None:
    """Under torchrun each rank streams its share of the batches (and a resumed run skips those
    done): the stage counts the sentences this call runs, as its consumer sees them, and
    advances once per batch, each after the checkpoint's ``after_batch``."""
    from headlab.models import stream_corpus

    lm = load(tiny["bert"])
    words = [s.words for s in read_treebank(sample_path("treebank"), limit=LIMIT).sentences]

    class Nothing:  # a BlockConsumer that keeps nothing
        def columns(self, layer: int) -> None:
            return None

        def block(self, *args: Any) -> None:
            pass

        def layer_done(self, layer: int) -> None:
            pass

    def run(part: tuple[int, int], skip: int) -> tuple[Recorder, list[int], list[str]]:
        rec, seen, order = Recorder(), [], []

        def consumer(batch: Any) -> Any:
            seen.extend(batch.indices)
            order.append("batch")
            return Nothing()

        def after_batch() -> None:
            order.append(f"after {len(rec.stages[0]['steps'])}")

        stream_corpus(
            lm, words, consumer, batch_tokens=256, progress=rec, stage="treebank",
            part=part, skip=skip, after_batch=after_batch,
        )  # fmt: skip
        return rec, seen, order

    shares = [run((rank, 2), 0) for rank in (0, 1)]
    for rec, seen, order in shares:
        (stage,) = rec.stages
        assert stage["total"] == sum(stage["steps"]) == len(seen) and stage["ended"] == 1
        n = len(stage["steps"])
        assert n >= 2  # so that skipping the first batch leaves some
        assert order == [x for i in range(n) for x in ("batch", f"after {i}")]
    assert sorted(shares[0][1] + shares[1][1]) == sorted(set(shares[0][1] + shares[1][1]))
    rec, seen, _ = run((0, 2), 1)
    assert (
        rec.stages[0]["total"]
        == len(seen)
        == len(shares[0][1]) - shares[0][0].stages[0]["steps"][0]
    )


def test_plain_lines_count_time_and_rate() -> None:
    now = [0.0]
    out = io.StringIO()
    plain = PlainProgress("headlab x", out, interval=10.0, clock=lambda: now[0])
    plain.start("pass", 100, "sentences")
    for _ in range(4):  # 20 sentences every 5 s: one line at 10 s, 20 s stays quiet till 20
        now[0] += 5.0
        plain.advance(20, note="loss 1.5")
    now[0] += 5.0
    plain.advance(20)  # the last item: the end says it, no interim line
    plain.end()
    plain.start("other", None, "steps")
    plain.advance(3)
    plain.close()  # cut short: no line
    assert out.getvalue().splitlines() == [
        "headlab x: pass: 40/100 sentences, 10.0 s (4.0 sentences/s, about 15 s left in this "
        "stage); loss 1.5",
        "headlab x: pass: 80/100 sentences, 20.0 s (4.0 sentences/s, about 5 s left in this "
        "stage); loss 1.5",
        "headlab x: pass: 100 sentences, 25.0 s (4.0 sentences/s); loss 1.5",
    ]


@pytest.mark.slow
def test_roles_json_on_stdout_stage_lines_on_stderr(tiny: dict[str, Path]) -> None:
    run = _headlab("roles", "--model", str(tiny["bert"]), "--limit", str(LIMIT), "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)  # nothing but the JSON
    lines = _stage_lines(run.stderr)
    used = result["data"]["treebank"]["used"], result["data"]["gap"]["used"]
    assert [(p, n, u) for p, n, _, u in lines] == [
        ("headlab roles", "treebank", "sentences"),
        ("headlab roles", "GAP", "passages"),
    ]
    assert int(lines[0][2]) == used[0] and int(lines[1][2]) >= used[1]
    assert "\x1b[" not in run.stderr  # no terminal codes in a log


@pytest.mark.slow
def test_quiet_before_or_after_the_command(
    tiny: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run = _headlab("-q", "roles", "--model", str(tiny["bert"]), "--limit", "8", "--csv")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("layer,head,role")
    # nothing but notes (8 sentences: no folds, the bootstrap over sentences), no progress
    assert all(": note: " in line for line in run.stderr.splitlines())
    argv = ["roles", "--model", str(tiny["bert"]), "--limit", "8", "--no-gap", "--json"]
    assert main([*argv, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["model"] == "bert" and _stage_lines(captured.err) == []
    assert main(["--quiet", *argv]) == 0  # the command's default leaves the global flag be
    assert _stage_lines(capsys.readouterr().err) == []


def test_only_rank_zero_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun (``RANK`` set), ranks other than 0 get the reporter that shows nothing."""
    import argparse

    from headlab.cli._progress import progress_for

    args = argparse.Namespace(quiet=False)
    for rank, kind in (("1", type(NO_PROGRESS)), ("7", type(NO_PROGRESS)), ("0", PlainProgress)):
        monkeypatch.setenv("RANK", rank)
        with progress_for(args, "headlab roles") as progress:
            assert type(progress) is kind, rank
    monkeypatch.delenv("RANK")
    with progress_for(args, "headlab roles") as progress:
        assert isinstance(progress, PlainProgress)  # stderr here is not a terminal
    with progress_for(argparse.Namespace(quiet=True), "headlab roles") as progress:
        assert progress is NO_PROGRESS


@pytest.mark.slow
def test_the_time_left_follows_the_stages_recent_speed() -> None:
    """Items that slow down late in a stage (the longest sentences last) move the estimate: it
    is the recent speed's, not the average since the stage began (#46, item 6)."""
    now = [0.0]
    out = io.StringIO()
    plain = PlainProgress("headlab x", out, interval=10.0, clock=lambda: now[0])
    plain.start("pass", 100, "sentences")
    now[0] += 10.0
    plain.advance(50)  # 5/s
    now[0] += 10.0
    plain.advance(10)  # then 1/s: 40 left take 40 s, not 40 / 3 s
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("about 10 s left in this stage)")
    assert lines[1] == (
        "headlab x: pass: 60/100 sentences, 20.0 s (3.0 sentences/s, about 40 s left in this stage)"
    )


def test_rich_bar_on_a_terminal_shows_rate_and_time_left(tiny: dict[str, Path]) -> None:
    """stderr on a pseudo-terminal: rich's bar, with a rate and the time left; stdout (a
    pipe) still holds only the JSON."""
    import pty

    leader, follower = pty.openpty()
    argv = ["roles", "--model", str(tiny["bert"]), "--limit", str(LIMIT), "--no-gap", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "headlab", *argv],
        stdout=subprocess.PIPE,
        stderr=follower,
        env=_env(COLUMNS="150", TERM="xterm"),
        cwd=ROOT,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    out, _ = proc.communicate(timeout=600)
    os.close(leader)
    assert proc.returncode == 0
    used = json.loads(out)["data"]["treebank"]["used"]
    frames = ANSI.sub("", b"".join(chunks).decode()).replace("\r", "\n").splitlines()
    last = [f for f in frames if f.startswith("treebank")][-1]
    assert f"{used}/{used} sentences" in last
    assert re.search(r"\d[\d,]*\.\d sentences/s", last), last
    assert re.search(r"\d+:\d\d:\d\d elapsed • \d+:\d\d:\d\d left in this stage", last), last


def test_prune_train_report_and_cost_report_stages(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every long command: its result on stdout untouched, one line per stage on stderr."""
    argv = ["prune", "--model", str(tiny["bert"]), "--curve", "--limit", "18", "--step", "0.25"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    curve = json.loads(captured.out)["curve"]
    (line,) = _stage_lines(captured.err)
    assert line[:2] == ("headlab prune", "pruning search") and int(line[2]) == len(curve)
    shown = float(captured.err.rstrip().rsplit("stsb ", 1)[1])
    assert shown == pytest.approx(curve[-1]["metric"], abs=1e-3)

    text = tmp_path / "text.txt"
    words = [
        line.split("\t")[1]
        for line in sample_path("treebank").read_text().splitlines()
        if line and line[0].isdigit() and "\t" in line
    ]
    text.write_text(" ".join(words))
    argv = ["train", "--text", str(text), "--out", str(tmp_path / "lm"), "--d-model", "32"]
    argv += ["--layers", "1", "--heads", "2", "--context", "16", "--vocab", "300", "--steps", "6"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    info = json.loads(captured.out)
    assert _stage_lines(captured.err) == [("headlab train", "train", "6", "steps")]
    assert captured.err.rstrip().endswith(f"loss {info['final_train_loss']:.3f}")

    argv = ["report", "--model", str(tiny["bert"]), "--limit", "6", "--replicates", "0"]
    argv.append("--roles-only")
    assert main([*argv, "--no-gap", "--out", str(tmp_path / "report")]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"wrote {tmp_path / 'report' / 'index.html'}\n"
    names = [(n, u) for _, n, _, u in _stage_lines(captured.err)]
    assert names == [
        ("treebank", "sentences"),
        ("viewer patterns", "sentences"),
        ("figures and page", "files"),
    ]
    files = 1 + len(list((tmp_path / "report" / "figures").iterdir()))
    assert int(_stage_lines(captured.err)[-1][2]) == files

    argv = ["experiment", "cost", "--width", "16", "--heads", "1,2", "--lengths", "8,16"]
    assert main([*argv, "--rounds", "2", "--no-backward", "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)["rows"]
    assert _stage_lines(captured.err) == [
        ("headlab experiment cost", "grid points", str(len(rows)), "points")
    ]


def test_one_vs_many_reports_every_training_run() -> None:
    from headlab.experiments.one_vs_many import GridConfig, one_vs_many

    cfg = GridConfig(heads=(1, 2), seeds=(0,), binding_steps=3, tasks=("binding",))
    rec = Recorder()
    result = one_vs_many(cfg, data=Path("."), progress=rec)
    assert [s["name"] for s in rec.stages] == [
        f"binding h={r['n_heads']} seed={r['seed']}" for r in result["runs"]
    ]
    assert all(s["total"] == sum(s["steps"]) == 3 and s["unit"] == "steps" for s in rec.stages)
