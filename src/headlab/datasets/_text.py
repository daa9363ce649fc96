"""Reading a data file's lines, with errors that name the file and what was expected."""

from __future__ import annotations

from pathlib import Path

from headlab.errors import DataFormatError, InputError


def split_lines(text: str) -> list[str]:
    r"""Lines ended by ``\n`` (a ``\r`` before it dropped) and nothing else: a U+2028 LINE
    SEPARATOR or a form feed inside a field stays part of its row, as in the tools that wrote it.

    Example:
        >>> split_lines("a\u2028b\tc\r\nd\n")
        ['a\u2028b\tc', 'd']
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_lines(path: Path, what: str) -> list[str]:
    r"""The lines of a UTF-8 text file (split on ``\n`` only, see :func:`split_lines`);
    ``what`` names the expected file in errors."""
    try:
        return split_lines(path.read_text(encoding="utf-8-sig"))
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise DataFormatError(f"{path}: not UTF-8 text ({exc.reason})") from None
