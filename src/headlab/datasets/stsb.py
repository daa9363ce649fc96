"""STS Benchmark (Cer et al. 2017): sentence pairs with gold similarity scores from 0 to 5.

Tab-separated, no header, no quoting; 7 columns (9 on some lines). The score is column 5.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from headlab.datasets._text import read_lines
from headlab.errors import DataFormatError

#: STS-B sources whose sentences are CC BY-SA (the only ones headlab ships)
CC_BY_SA_SOURCES = frozenset({"images", "track5.en-en", "answers-forums", "answer-answer"})


@dataclass(frozen=True, kw_only=True)
class StsPair:
    """One scored pair: ``score`` in [0, 5]; ``source`` is column 2 (``images``, ``MSRvid``...)."""

    source: str
    score: float
    first: str
    second: str


def read_stsb(
    path: str | Path, *, sources: Collection[str] | None = None, limit: int | None = None
) -> list[StsPair]:
    """Read STS-B pairs (optionally only from ``sources``; at most ``limit``)."""
    path = Path(path)
    lines = read_lines(path, "STS-B file")
    pairs: list[StsPair] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 7:
            raise DataFormatError(
                f"{path}:{number}: expected 7 tab-separated STS-B columns, found {len(cols)}"
            )
        try:
            score = float(cols[4])
        except ValueError:
            raise DataFormatError(
                f"{path}:{number}: the score (column 5) must be a number, found {cols[4]!r}"
            ) from None
        if not 0.0 <= score <= 5.0:
            raise DataFormatError(f"{path}:{number}: score {score} outside 0..5")
        first, second = cols[5].strip(), cols[6].strip()
        if not first or not second:
            raise DataFormatError(f"{path}:{number}: an empty sentence")
        if sources is not None and cols[1] not in sources:
            continue
        pairs.append(StsPair(source=cols[1], score=score, first=first, second=second))
        if limit is not None and len(pairs) >= limit:
            break
    if len(pairs) < 2:
        raise DataFormatError(f"{path}: fewer than 2 usable STS-B pairs")
    return pairs
