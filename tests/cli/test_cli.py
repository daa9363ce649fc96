"""The CLI's contract: exit codes, one-line errors, --version, and the spec command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from headlab import __version__
from headlab.cli import main


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out
    assert main(["--help"]) == 0
    assert "spec" in capsys.readouterr().out


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "--context", "many"]) == 2
    err = capsys.readouterr().err
    assert "argument --context: expected an integer" in err
    assert err.count("\n") == 1 and err.startswith("headlab spec: error: ")  # one line
    assert "(see headlab spec --help)" in err
    assert main(["spec", "--bogus"]) == 2  # an unknown flag is named by its command
    assert capsys.readouterr().err.startswith(
        "headlab spec: error: unrecognized arguments: --bogus"
    )
    assert main(["experiment", "one-vs-many", "--width", "7"]) == 1  # cost's flag, not run
    assert "--width: for `headlab experiment cost` only" in capsys.readouterr().err
    assert main(["spec", "gpt2", "-v", "--json"]) == 0  # -v after the command, as -q
    capsys.readouterr()
    assert main([]) == 2


def test_headlab_error_is_one_line_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "no-such-model"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("headlab: error: ") and err.count("\n") == 1
    assert "Traceback" not in err


def test_verbose_shows_the_traceback() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "headlab", "-v", "spec", "no-such-model"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "InputError" in out.stderr


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys; from headlab.cli import main; main(['--help']); "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_spec_compare_and_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "--compare", "gpt2", "Llama-3.1-8B", "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert [d["model"] for d in both] == ["gpt2", "Llama-3.1-8B"]
    assert main(["spec", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "DeepSeek-V3" in listing and "MLA" in listing
    assert main(["spec", "gpt2", "--dtype", "fp64"]) == 1
    assert "unknown dtype 'fp64'" in capsys.readouterr().err


def test_heads_on_a_causal_model_defaults_to_the_last_word(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A decoder's last word predicts the next token and sees the whole sentence: it is the
    default there (its third occurrence named as such)."""
    text = "John met Mary and then John thanked John."
    assert main(["heads", text, "--model", "tiny-shakespeare", "--json", "-q"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["word"] == "John#3"
    assert len(data["heads"]) == 4 * 4  # tiny-shakespeare: 4 layers x 4 heads
    assert main(["heads", "The cat sat on the mat.", "--model", "tiny-shakespeare", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["word"] == "mat"


def test_heads_word_is_matched_as_written_first(capsys: pytest.CaptureFixture[str]) -> None:
    """#58: ``--word the`` on the lesson's sentence is its lowercase "the" (the 7th word), not
    "The" that opens it; ``--word THE`` could be either and is refused, naming both."""
    from headlab.datasets.lesson import LESSON_SENTENCE

    words = LESSON_SENTENCE.split()
    assert words[0] == "The" and "the" in words
    argv = ["heads", "--model", "tiny-shakespeare", "--json", "-q"]

    def seen(word: str) -> set[str]:  # the words any head's top attends to, from ``word``
        assert main([*argv, "--word", word]) == 0
        heads = json.loads(capsys.readouterr().out)["heads"]
        return {t["word"] for h in heads for t in h["top"]}

    # a decoder's first word sees itself alone; the 7th sees "prepared" before it
    assert seen("The") == {"The"}
    assert "prepared" in seen("the")
    assert main([*argv, "--word", "THE"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "only in another case, as 'The' and 'the'" in line


def test_a_typo_gets_a_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reprot"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "did you mean 'report'?" in err
    assert main(["patch", "--method", "dlaa"]) == 2
    assert "did you mean 'dla'?" in capsys.readouterr().err
    assert main(["xyz"]) == 2  # nothing close: no guess
    assert "did you mean" not in capsys.readouterr().err
