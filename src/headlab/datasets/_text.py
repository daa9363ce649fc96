"""Reading a data file's lines, with errors that name the file and what was expected."""

from __future__ import annotations

from pathlib import Path

from headlab.errors import DataFormatError, InputError


def read_lines(path: Path, what: str) -> list[str]:
    """The lines of a UTF-8 text file; ``what`` names the expected file in errors."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise DataFormatError(f"{path}: not UTF-8 text ({exc.reason})") from None
