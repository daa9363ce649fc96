"""Lists and shares on the command line: checked while parsing, one line naming the flag, what it
expects and what came; good values reach the library as numbers."""

from __future__ import annotations

import argparse

import pytest

from headlab.cli import main
from headlab.cli._args import integer, listed, share


@pytest.mark.parametrize(
    ("argv", "flag", "said"),
    [
        (["experiment", "cost", "--heads", "0"], "--heads", "got 0"),
        (["experiment", "cost", "--heads", "1,x"], "--heads", "got 'x'"),
        (["experiment", "cost", "--lengths", ","], "--lengths", "got ','"),
        (["heads", "--patch", "3"], "--patch", "got '3'"),
        (["heads", "--patch", "1,2,3"], "--patch", "got '1,2,3'"),
        (["heads", "--patch", "1,-2"], "--patch", "got -2"),
        (["prune", "--recover-at", "0.5,1"], "--recover-at", "got '1'"),
        (["circuit", "--sizes", "10,-1"], "--sizes", "got -1"),
        (["circuit", "--sizes", "10,,20"], "--sizes", "got '10,,20'"),
        (["experiment", "cost", "--heads", "4,"], "--heads", "got '4,'"),
        (["circuit", "--target", "0"], "--target", "got '0'"),
        (["circuit", "--target", "nan"], "--target", "got 'nan'"),
    ],
)
def test_a_bad_list_or_share_is_one_line_naming_the_flag(
    argv: list[str], flag: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"argument {flag}: expected" in err and said in err


def test_lists_parse_to_numbers_in_their_order() -> None:
    counts = listed(integer(1, 100), "whole numbers separated by commas", "1,4,16")
    assert counts("16, 1 4") == (16, 1, 4)  # commas or spaces, as typed
    pair = listed(integer(0, 100), "ROW,COL", "3,4", count=2)
    assert pair("3,4") == (3, 4)
    with pytest.raises(argparse.ArgumentTypeError, match="like 3,4"):
        pair("3")


def test_a_share_is_open_or_closed_at_one() -> None:
    assert share(one=True)("1") == 1.0
    with pytest.raises(argparse.ArgumentTypeError, match=r"\(0, 1\)"):
        share(one=False)("1")
    for bad in ("0", "-0.1", "1.5", "inf", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            share(one=True)(bad)
