"""Output folders under faults: kill -9 at random points, leftovers, foreign folders, bad disks.

The kill test runs ``headlab prune`` and ``headlab report`` in forked children of one helper
process (so torch is imported once), kills each with SIGKILL at a random point of its write, and
checks that the output folder is the old one or the new one, whole, and that the next run leaves
no hidden leftovers. The write's renames are slowed a little so that kills land between them.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from headlab.errors import OutputError, OutputExistsError
from headlab.outputs import MARKER, atomic_folder, check_output, output_kind, tidy

ROOT = Path(__file__).resolve().parents[1]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_leftovers_of_dead_runs_are_removed_and_a_lost_folder_comes_back(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with atomic_folder(out) as tmp:
        (tmp / "a.txt").write_text("old")
    dead = _dead_pid()
    # a run killed between the two renames of a replacement: out absent, old copy aside
    os.rename(out, tmp_path / f".out.old-{dead}")
    (tmp_path / f".out.tmp-{dead}-abcd1234").mkdir()
    (tmp_path / f".out.tmp-{dead}-abcd1234" / "a.txt").write_text("half")
    check_output(out, overwrite=True)
    assert (out / "a.txt").read_text() == "old" and output_kind(out) == "output"
    assert _hidden(tmp_path) == []
    # leftovers of a live process are not touched; an earlier version's old ones are
    (tmp_path / f".out.tmp-{os.getppid()}-live0001").mkdir()
    legacy = tmp_path / ".out.k2j4h5g6.tmp"
    legacy.mkdir()
    os.utime(legacy, (0, 0))
    (tmp_path / f".other.old-{dead}").mkdir()  # another folder's: not ours to judge
    tidy(out)
    assert _hidden(tmp_path) == [f".other.old-{dead}", f".out.tmp-{os.getppid()}-live0001"]


@pytest.mark.parametrize("exchange", ["1", "0"])
def test_replacement_with_and_without_rename_exchange(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: str
) -> None:
    monkeypatch.setenv("HEADLAB_RENAME_EXCHANGE", exchange)
    out = tmp_path / "out"
    for text in ("first", "second"):
        with atomic_folder(out, overwrite=True, kind="test") as tmp:
            (tmp / "a.txt").write_text(text)
        assert (out / "a.txt").read_text() == text and output_kind(out) == "test"
    assert _hidden(tmp_path) == []


def test_overwrite_replaces_only_folders_headlab_wrote(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match="not written by headlab") as info:
            check_output(mine, overwrite=overwrite)
        assert "\n" not in str(info.value)
    assert (mine / "thesis.tex").read_text() == "keep me"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(OutputExistsError, match="is not a folder"):
        check_output(a_file, overwrite=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(OutputExistsError, match="pass --overwrite"):
        check_output(empty)
    with atomic_folder(empty, overwrite=True) as tmp:  # an empty folder holds nothing to lose
        (tmp / "a.txt").write_text("new")
    assert (empty / MARKER).is_file()
    # outputs of earlier versions, which wrote no marker, are recognised
    old_pruned = tmp_path / "old-pruned"
    old_pruned.mkdir()
    (old_pruned / "pruning.json").write_text("{}")
    (old_pruned / "config.json").write_text('{"headlab_pruned": {}}')
    assert output_kind(old_pruned) == "pruned-model"
    check_output(old_pruned, overwrite=True)
    (old_pruned / "config.json").write_text("{}")  # a pruning.json alone is not enough
    with pytest.raises(OutputExistsError, match="not written by headlab"):
        check_output(old_pruned, overwrite=True)
    # a report replaces a report without --overwrite, but not another kind of output
    with atomic_folder(tmp_path / "r", kind="report") as tmp:
        pass
    check_output(tmp_path / "r", kind="report", replace_kind=True)
    with pytest.raises(OutputExistsError, match="pass --overwrite"):
        check_output(empty, kind="report", replace_kind=True)


def test_unwritable_locations_and_write_errors_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="is not a folder"):
        check_output(tmp_path / "file" / "out")
    import tempfile

    def read_only(*args: Any, **kwargs: Any) -> str:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path))

    with monkeypatch.context() as m:
        m.setattr(tempfile, "mkdtemp", read_only)
        with pytest.raises(OutputError, match="Read-only file system"):
            check_output(tmp_path / "out")
    with (
        pytest.raises(OutputError, match="No space left on device") as info,
        atomic_folder(tmp_path / "out") as tmp,
    ):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / "model.safetensors"))
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_save_errors_after_pruning_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors import SafetensorError
    from tests.models.tiny import build

    from headlab.models import load
    from headlab.pruning import prune_model, save_pruned

    small = prune_model(load(build("bert", tmp_path / "src")), {0: [0]})

    def full(*args: Any, **kwargs: Any) -> None:
        raise SafetensorError("Error while serializing: IoError(No space left on device)")

    monkeypatch.setattr(small.model, "save_pretrained", full)
    with pytest.raises(OutputError, match=r"cannot write .*No space left") as info:
        save_pruned(small, tmp_path / "out")
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


# --- SIGKILL at random points ------------------------------------------------------------------


def _snapshot(out: Path) -> dict[str, Any]:
    files = (
        {str(p.relative_to(out)): p.stat().st_size for p in out.rglob("*") if p.is_file()}
        if out.is_dir()
        else None
    )
    return {"files": files, "hidden": _hidden(out.parent)}


def _child(run: dict[str, Any], signal_fd: int) -> None:
    """A forked child: slow the renames a little, tell the parent when the write starts, run."""
    import shutil
    import time

    import headlab.outputs
    from headlab.cli import main

    code = 99
    try:
        os.environ["HEADLAB_RENAME_EXCHANGE"] = "1" if run["exchange"] else "0"
        real_chmod = os.chmod

        def chmod(path: Any, mode: int, *args: Any, **kwargs: Any) -> None:
            if ".tmp-" in os.fspath(path):  # atomic_folder made its temporary folder
                os.write(signal_fd, b"w")
            real_chmod(path, mode, *args, **kwargs)

        def slow(function: Any) -> Any:
            def slowed(*args: Any, **kwargs: Any) -> Any:
                time.sleep(0.04)
                return function(*args, **kwargs)

            return slowed

        os.chmod = chmod  # type: ignore[assignment]
        os.replace = slow(os.replace)  # type: ignore[assignment]
        os.rename = slow(os.rename)  # type: ignore[assignment]
        shutil.rmtree = slow(shutil.rmtree)  # type: ignore[assignment]
        headlab.outputs._exchange = slow(headlab.outputs._exchange)  # type: ignore[method-assign]
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        code = main(run["argv"])
    finally:
        os._exit(code)


def _drive(config_json: str) -> None:
    """The helper process: fork one child per run, kill it, print a JSON line per run."""
    import select
    import signal
    import time

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import headlab.cli.prune
    import headlab.cli.report
    import headlab.pruning.workflow
    import headlab.report.folder  # noqa: F401

    config = json.loads(config_json)
    window: dict[str, float] = {}  # seconds from the start of a write to the end of a run
    for run in config["runs"]:
        out = Path(run["out"])
        # A kill that comes after the run ended by itself tests nothing: under load a run can
        # be faster or slower than the complete run that set the window, so a missed kill is
        # tried again (the run writes the folder again) with half the delay, up to 3 times.
        share = random.Random(run["kill"]).uniform(0.0, 0.7) if run["kill"] is not None else 0.0
        for _attempt in range(3):
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                _child(run, write_fd)
            os.close(write_fd)
            ready, _, _ = select.select([read_fd], [], [], 300)
            started = time.monotonic()
            missed = False
            if ready and os.read(read_fd, 1) and run["kill"] is not None:
                time.sleep(share * window.get(run["out"], 0.5))
                ended, status = os.waitpid(pid, os.WNOHANG)
                missed = ended == pid
                if not missed:
                    os.kill(pid, signal.SIGKILL)
            if not missed:
                _, status = os.waitpid(pid, 0)
            os.close(read_fd)
            if not missed:
                break
            share /= 2
        if run["kill"] is None:
            window[run["out"]] = time.monotonic() - started
        raw = _snapshot(out)
        tidy(out)  # what the next run does first
        code = os.waitstatus_to_exitcode(status)
        line = {"run": run, "code": code, "raw": raw, "tidied": _snapshot(out)}
        print(json.dumps(line), flush=True)


def _whole(snapshot: dict[str, Any], reference: dict[str, int]) -> bool:
    files = snapshot["files"]
    return files is not None and set(files) == set(reference) and all(files.values())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the kill test forks children")
def test_sigkill_during_prune_and_report_never_loses_the_folder(tmp_path: Path) -> None:
    from tests.models.tiny import build

    from headlab.datasets import sample_path

    model = build("bert", tmp_path / "bert")
    stsb = tmp_path / "stsb.tsv"
    stsb.write_text("".join(sample_path("stsb").read_text().splitlines(keepends=True)[:24]))
    commands = {
        "prune": [
            *("prune", "--model", str(model), "--stsb", str(stsb), "--fraction", "0.25"),
            *("--step", "0.25", "--overwrite", "--out"),
        ],
        "report": [
            *("report", "--model", str(model), "--limit", "2", "--replicates", "0", "--roles-only"),
            *("--no-gap", "--out"),
        ],
    }
    runs = []
    for name, argv in commands.items():
        out = tmp_path / "outs" / name
        full = {"argv": [*argv, str(out)], "out": str(out), "kill": None, "exchange": True}
        runs.append(full)  # the old folder
        for seed, exchange in ((1, True), (2, True), (3, False)):
            runs.append({**full, "kill": 1000 * len(runs) + seed, "exchange": exchange})
        runs.append({**full, "exchange": False})  # the next run, to the end
    code = "import sys; from tests.test_faults import _drive; _drive(sys.argv[1])"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps({"runs": runs})],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == len(runs)
    if os.environ.get("HEADLAB_FAULTS_LOG"):
        Path(os.environ["HEADLAB_FAULTS_LOG"]).write_text(done.stdout)
    kills = 0
    reference: dict[str, int] = {}
    for line in lines:
        run = line["run"]
        if run["kill"] is None:  # a complete run: exit 0, whole, nothing hidden left
            assert line["code"] == 0, run
            reference = line["raw"]["files"]
            assert reference and MARKER in reference and line["raw"]["hidden"] == []
            continue
        kills += line["code"] == -9
        # old or new, whole: at once with the name exchange, after the next run's tidy without
        seen = line["raw"] if run["exchange"] else line["tidied"]
        assert _whole(seen, reference), line
        assert line["tidied"]["hidden"] == [], line
    assert kills >= 4, "most kills should land inside the write"


def test_an_atomically_written_file_follows_the_umask(tmp_path: Path) -> None:
    """A written file is readable as any other the user makes (mkstemp alone gives 0600: a
    report folder served by a web server, or shared with a group, would be unreadable)."""
    from headlab.outputs import write_bytes_atomic

    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"x")
    made = write_bytes_atomic(tmp_path / "atomic.txt", b"x")
    assert made.read_bytes() == b"x"
    assert (made.stat().st_mode & 0o777) == (plain.stat().st_mode & 0o777)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["patch", "--figure", "{dir}/heat.png"], "--figure"),
        (["patch", "--csv-out", "{dir}/effects.csv"], "--csv-out"),
        (["patch", "--write", "{dir}/prompts.jsonl"], "--write"),
        (["compose", "--receivers", "3.0", "--figure", "{dir}/k.png"], "--figure"),
        (["circuit", "--html", "{dir}/circuit.html"], "--html"),
    ],
    ids=["patch-figure", "patch-csv", "patch-write", "compose", "circuit"],
)
def test_a_file_that_cannot_be_written_is_refused_before_the_model_loads(
    argv: list[str],
    flag: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """#58: a read-only folder is found before minutes of computing, in one line naming the
    flag, and the model is never loaded."""
    import tempfile

    from headlab.cli import _model, main

    def read_only(*args: Any, **kwargs: Any) -> str:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path))

    def no_load(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    monkeypatch.setattr(_model, "load_model", no_load)
    code = main([*(a.format(dir=tmp_path) for a in argv), "--model", "tiny-shakespeare"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and line.startswith(f"headlab: error: {flag} ")
    assert "Read-only file system" in line


def test_a_write_that_fails_leaves_nothing_and_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headlab.outputs import write_text_atomic

    real = os.fdopen

    def full(fd: int, *args: Any, **kwargs: Any) -> Any:
        handle = real(fd, *args, **kwargs)

        def fail(data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        handle.write = fail
        return handle

    monkeypatch.setattr(os, "fdopen", full)
    with pytest.raises(OutputError) as info:
        write_text_atomic(tmp_path / "effects.csv", "layer,head\n")
    assert str(info.value) == f"cannot write {tmp_path / 'effects.csv'}: No space left on device"
    assert list(tmp_path.iterdir()) == []  # no half-written file, no temporary one


def test_output_to_a_full_disk_is_one_line() -> None:
    """``headlab spec smollm2 --json > /dev/full``: one line, exit 1, no traceback."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "headlab", "spec", "smollm2", "--json"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1
    assert done.stderr == "headlab: error: cannot write the output: No space left on device\n"


# --- #58 item 4: every writing command, a read-only folder and a full disk --------------------


@pytest.fixture
def read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A folder nothing can be created in: ``chmod 0555``, and where that does not bind (root
    passes permission checks) every file and folder headlab makes there refused with EROFS, as
    on a read-only mount."""
    import tempfile

    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        (folder / ".probe").mkdir()
        (folder / ".probe").rmdir()
        binds = False
    except PermissionError:
        binds = True
    if not binds:

        def refuse(real: Any) -> Any:
            def made(*args: Any, dir: Any = None, **kwargs: Any) -> Any:
                if dir is not None and Path(dir).resolve() == folder.resolve():
                    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(folder))
                return real(*args, dir=dir, **kwargs)

            return made

        monkeypatch.setattr(tempfile, "mkdtemp", refuse(tempfile.mkdtemp))
        monkeypatch.setattr(tempfile, "mkstemp", refuse(tempfile.mkstemp))
    yield folder
    folder.chmod(0o755)


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any model load, cost measurement or training fails the test: the refusal must come
    first."""
    import headlab.cli.prune
    import headlab.cli.report
    import headlab.experiments.cost
    import headlab.training.language_model
    from headlab.cli import _model

    def work(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the work started before the output was checked")

    monkeypatch.setattr(_model, "load_model", work)
    monkeypatch.setattr(headlab.cli.report, "load_model", work)
    monkeypatch.setattr(headlab.cli.prune, "load_model", work)
    monkeypatch.setattr(headlab.experiments.cost, "run_cost", work)
    monkeypatch.setattr(headlab.training.language_model, "train_language_model", work)


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["experiment", "cost", "--quick", "--figure", "{ro}/cost.png"], "--figure {ro}/cost.png"),
        (["train", "--text", "{text}", "--steps", "1", "--out", "{ro}/m"], "{ro}/m"),
        (["report", "--roles-only", "--out", "{ro}/r"], "{ro}/r"),
        (
            ["report", "--roles-only", "--out", "{tmp}/r", "--ledger-md", "{ro}/ledger.md"],
            "--ledger-md {ro}/ledger.md",
        ),
        (
            ["prune", "--curve", "--compare", "--figure", "{ro}/compare.png"],
            "--figure {ro}/compare.png",
        ),
        (["prune", "--fraction", "0.25", "--out", "{ro}/pruned"], "{ro}/pruned"),
    ],
    ids=[
        "experiment-figure",
        "train-out",
        "report-out",
        "report-ledger-md",
        "prune-figure",
        "prune-out",
    ],
)
def test_every_writing_command_refuses_a_read_only_folder_before_any_work(
    argv: list[str],
    names: str,
    read_only: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """#58: experiment's --figure, train's --out, report's --out and --ledger-md in a folder
    that cannot be written: one line naming the place, before a model loads or a measurement
    starts, and nothing written anywhere."""
    from headlab.cli import main

    text = tmp_path / "text.txt"
    text.write_text("To be or not to be, that is the question. " * 40)
    _no_work(monkeypatch)
    where = {"ro": str(read_only), "tmp": str(tmp_path), "text": str(text)}
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main([a.format(**where) for a in argv])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("headlab: error: ") and names.format(**where) in lines[0]
    assert "Read-only file system" in lines[0] or "Permission denied" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert list(read_only.iterdir()) == []


FULL = [
    ["spec", "smollm2", "--json"],
    ["heads", "--model", "tiny-shakespeare", "--json"],
    ["roles", "--model", "tiny-shakespeare", "--limit", "4", "--replicates", "0", "--no-gap"],
    ["experiment", "cost", "--width", "32", "--heads", "1,2", "--lengths", "8", "--rounds", "2"],
    ["train", "--text", "{text}", "--steps", "1", "--context", "16", "--d-model", "32", "--out"],
    ["report", "--model", "tiny-shakespeare", "--limit", "4", "--replicates", "0"],
    ["prune", "--model", "tiny-shakespeare", "--curve", "--step", "0.5", "--limit", "8", "--json"],
]


@pytest.mark.slow
@pytest.mark.parametrize("argv", FULL, ids=[a[0] for a in FULL])
def test_every_command_to_a_full_disk_is_one_line(argv: list[str], tmp_path: Path) -> None:
    """#58: ``headlab COMMAND > /dev/full``: exit 1 and one line on stderr, no traceback (each
    command in its own process, as a user runs it)."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    text = tmp_path / "text.txt"
    text.write_text("To be or not to be, that is the question. " * 300)  # 10,000 characters
    args = [a.format(text=text) for a in argv]
    if args[0] == "train":
        args.append(str(tmp_path / "m"))
    if args[0] == "report":
        args += ["--roles-only", "--no-gap", "--out", str(tmp_path / "r")]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "headlab", "-q", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=300,
        )
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr  # notes may come before, the error is one line
    assert errors == ["headlab: error: cannot write the output: No space left on device"], errors
