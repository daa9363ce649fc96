"""GAP coreference (Webster et al. 2018): a pronoun, two candidate names, which one it refers to.

Rows are tab-separated with a header; offsets are character offsets into the text. Rows whose
offsets do not match their text, where neither or both names are the referent, or where the
pronoun's span is a name's span (the answer would be read off the pronoun itself), are skipped
and counted, never guessed. Rows end at ``\n`` only: a U+2028 inside a text stays in its row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headlab.datasets._text import read_lines
from headlab.errors import DataFormatError

_COLUMNS = (
    "ID",
    "Text",
    "Pronoun",
    "Pronoun-offset",
    "A",
    "A-offset",
    "A-coref",
    "B",
    "B-offset",
    "B-coref",
)


@dataclass(frozen=True, kw_only=True)
class GapExample:
    """One GAP row with exactly one correct candidate.

    Attributes:
        id: the row's ID.
        text: the paragraph.
        pronoun: ``(start, end)`` characters of the pronoun.
        candidates: ``((start, end), (start, end))`` of names A and B.
        answer: 0 when A is the referent, 1 when B is.
        source: the page the text comes from (the ``URL`` column; the ID when there is none).
            Folds of ``headlab roles --reliability`` keep a page's rows together.
    """

    id: str
    text: str
    pronoun: tuple[int, int]
    candidates: tuple[tuple[int, int], tuple[int, int]]
    answer: int
    source: str = ""


@dataclass(frozen=True, kw_only=True)
class GapData:
    """The usable examples and the counts of rows left out, by reason."""

    examples: list[GapExample]
    skipped: dict[str, int]


def _span(text: str, value: str, offset: str) -> tuple[int, int] | None:
    if not offset.isdigit():
        return None
    start = int(offset)
    if text[start : start + len(value)] != value or not value:
        return None
    return start, start + len(value)


def read_gap(path: str | Path, *, limit: int | None = None) -> GapData:
    """Read a GAP TSV file (at most ``limit`` usable examples)."""
    path = Path(path)
    lines = read_lines(path, "GAP file")
    if not lines:
        raise DataFormatError(f"{path}: empty file (expected a GAP TSV with a header)")
    header = lines[0].split("\t")
    if tuple(header[: len(_COLUMNS)]) != _COLUMNS:
        raise DataFormatError(
            f"{path}:1: expected a GAP header starting {' '.join(_COLUMNS[:4])}..., "
            f"found {' '.join(header[:4])}"
        )
    url = len(header) > len(_COLUMNS) and header[len(_COLUMNS)].strip() == "URL"
    examples: list[GapExample] = []
    skipped = {
        "offsets do not match the text": 0,
        "no single referent": 0,
        "pronoun span is a candidate's": 0,
    }
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < len(_COLUMNS):
            raise DataFormatError(
                f"{path}:{number}: expected {len(_COLUMNS)}+ tab-separated columns, found {len(cols)}"
            )
        row = dict(zip(_COLUMNS, cols, strict=False))
        text = row["Text"]
        spans = [
            _span(text, row["Pronoun"], row["Pronoun-offset"]),
            _span(text, row["A"], row["A-offset"]),
            _span(text, row["B"], row["B-offset"]),
        ]
        flags = [row["A-coref"].upper() == "TRUE", row["B-coref"].upper() == "TRUE"]
        pronoun, a, b = spans
        if pronoun is None or a is None or b is None:
            skipped["offsets do not match the text"] += 1
            continue
        if sum(flags) != 1:
            skipped["no single referent"] += 1
            continue
        if pronoun in (a, b):
            skipped["pronoun span is a candidate's"] += 1
            continue
        examples.append(
            GapExample(
                id=row["ID"],
                text=text,
                pronoun=pronoun,
                candidates=(a, b),
                answer=0 if flags[0] else 1,
                source=(cols[len(_COLUMNS)].strip() if url and len(cols) > len(_COLUMNS) else "")
                or row["ID"],
            )
        )
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        raise DataFormatError(f"{path}: no usable GAP rows")
    return GapData(examples=examples, skipped=skipped)
