"""Universal Dependencies treebanks (CoNLL-U) as words, gold heads and relations.

Parsing is done by the ``conllu`` library; headlab adds what a probe needs to trust the data: every
token line has the 10 columns, heads point inside the sentence, and an error names the file and
line. Multiword-token lines (``3-4``) and empty nodes (``5.1``) are skipped: the syntactic words
are what the trees connect. A sentence whose heads do not form one tree (no root or two roots, a
word that is its own head, a cycle) is left out and counted by reason (:func:`read_treebank`):
probes would otherwise score arcs that no parser could produce.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from headlab.datasets._text import split_lines
from headlab.errors import DataFormatError, InputError

logger = logging.getLogger(__name__)

_WORD_ID = re.compile(r"^[1-9][0-9]*$")
_SKIPPED_ID = re.compile(r"^[0-9]+(-[0-9]+|\.[0-9]+)$")
_COUNT = re.compile(r"^[0-9]{1,18}$")


@dataclass(frozen=True, kw_only=True)
class TreebankSentence:
    """One gold sentence.

    Attributes:
        sent_id: the ``# sent_id`` comment (or ``file:line``).
        words: syntactic words (FORM column), in order.
        heads: 0-based index of each word's head word, ``-1`` for the root.
        relations: each word's full UD relation to its head (``nsubj``, ``nmod:poss``...).
        upos: universal part-of-speech tags.
        doc_id: the document the sentence belongs to: the last ``# newdoc id`` above it, else its
            ``sent_id`` without the trailing sentence number (``doc-0003`` is in ``doc``). Folds
            of ``headlab roles --reliability`` never split a document.
    """

    sent_id: str
    words: tuple[str, ...]
    heads: tuple[int, ...]
    relations: tuple[str, ...]
    upos: tuple[str, ...]
    doc_id: str = ""


_SENTENCE_NUMBER = re.compile(r"[-_.#][0-9]+$")


def document_of(sent_id: str) -> str:
    """The document part of a sentence id: ``sent_id`` without its trailing sentence number.

    Example:
        >>> document_of("weblog-juancole.com_juancole_20051126063000_ENG_20051126_063000-0001")
        'weblog-juancole.com_juancole_20051126063000_ENG_20051126_063000'
        >>> document_of("s12"), document_of("en.conllu:41")  # no separator: its own document
        ('s12', 'en.conllu:41')
    """
    return _SENTENCE_NUMBER.sub("", sent_id) or sent_id


def _blocks(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(first line number, lines) of each blank-line separated block."""
    try:
        handle = path.open(encoding="utf-8-sig")
    except OSError as exc:
        raise InputError(f"cannot read treebank {path}: {exc.strerror}") from None
    with handle:
        block: list[str] = []
        start = 1
        try:
            for number, line in enumerate(handle, start=1):
                line = line.rstrip("\n").rstrip("\r")
                if line.strip():
                    if not block:
                        start = number
                    block.append(line)
                elif block:
                    yield start, block
                    block = []
        except UnicodeDecodeError as exc:
            raise DataFormatError(f"{path}: not UTF-8 text ({exc.reason})") from None
        if block:
            yield start, block


def _parse_block(
    path: Path, start: int, lines: list[str], newdoc: list[str]
) -> TreebankSentence | None:
    """One sentence; ``newdoc`` holds the current ``# newdoc id`` (updated in place)."""
    from conllu.exceptions import ParseException
    from conllu.parser import DEFAULT_FIELDS, parse_line

    sent_id = f"{path.name}:{start}"
    words: list[str] = []
    heads: list[int] = []
    relations: list[str] = []
    upos: list[str] = []
    head_lines: list[int] = []
    for offset, line in enumerate(lines):
        number = start + offset
        if line.startswith("#"):
            if line.startswith("# sent_id"):
                sent_id = line.split("=", 1)[-1].strip()
            elif line.startswith("# newdoc"):
                newdoc[0] = (
                    line.split("=", 1)[-1].strip() if "=" in line else f"{path.name}:{start}"
                )
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise DataFormatError(
                f"{path}:{number}: expected 10 tab-separated CoNLL-U columns, found {len(cols)}"
            )
        if _SKIPPED_ID.match(cols[0]):
            continue
        try:
            token = parse_line(line, fields=DEFAULT_FIELDS)
        except ParseException as exc:
            raise DataFormatError(f"{path}:{number}: {exc}") from None
        if not _WORD_ID.match(cols[0]) or int(cols[0]) != len(words) + 1:
            raise DataFormatError(
                f"{path}:{number}: expected word id {len(words) + 1}, found {cols[0]!r}"
            )
        if not isinstance(token["head"], int):
            raise DataFormatError(f"{path}:{number}: HEAD must be a number, found {cols[6]!r}")
        if not token["form"] or any(c.isspace() for c in token["form"]):
            raise DataFormatError(f"{path}:{number}: empty FORM or FORM with spaces")
        words.append(token["form"])
        heads.append(token["head"] - 1)
        relations.append(str(token["deprel"]))
        upos.append(str(token["upos"]))
        head_lines.append(number)
    if not words:
        return None
    for head, number in zip(heads, head_lines, strict=True):
        if not -1 <= head < len(words):
            raise DataFormatError(
                f"{path}:{number}: HEAD {head + 1} points outside the sentence of {len(words)} words"
            )
    return TreebankSentence(
        sent_id=sent_id,
        words=tuple(words),
        heads=tuple(heads),
        relations=tuple(relations),
        upos=tuple(upos),
        doc_id=newdoc[0] or document_of(sent_id),
    )


#: reasons a sentence is left out of a treebank, in the order they are checked
TREE_PROBLEMS = ("no root", "two or more roots", "a word is its own head", "a cycle")


def tree_problem(heads: tuple[int, ...] | list[int]) -> str | None:
    """Why 0-based ``heads`` (``-1`` for the root) are not one tree, or ``None`` when they are.

    Example:
        >>> tree_problem([-1, 0, 1]), tree_problem([1, 2, 0]), tree_problem([-1, 1])
        (None, 'no root', 'a word is its own head')
    """
    roots = sum(1 for h in heads if h == -1)
    if roots == 0:
        return TREE_PROBLEMS[0]
    if roots > 1:
        return TREE_PROBLEMS[1]
    if any(h == i for i, h in enumerate(heads)):
        return TREE_PROBLEMS[2]
    reaches_root = [False] * len(heads)
    for start in range(len(heads)):
        path: list[int] = []
        on_path: set[int] = set()
        word = start
        while word != -1 and not reaches_root[word]:
            if word in on_path:
                return TREE_PROBLEMS[3]
            on_path.add(word)
            path.append(word)
            word = heads[word]
        for w in path:
            reaches_root[w] = True
    return None


@dataclass(frozen=True, kw_only=True)
class TreebankData:
    """The usable sentences of a CoNLL-U file and the counts of those left out, by reason."""

    sentences: list[TreebankSentence]
    skipped: dict[str, int]


def read_treebank(path: str | Path, *, limit: int | None = None) -> TreebankData:
    """Read the sentences of a CoNLL-U file (at most ``limit`` usable ones), leaving out and
    counting those whose heads are not one tree (see :data:`TREE_PROBLEMS`).

    Raises:
        InputError: the file cannot be read.
        DataFormatError: a malformed line (the message gives ``file:line``), or no usable
            sentence.
    """
    path = Path(path)
    out: list[TreebankSentence] = []
    skipped = dict.fromkeys(TREE_PROBLEMS, 0)
    newdoc = [""]
    for start, lines in _blocks(path):
        sentence = _parse_block(path, start, lines, newdoc)
        if sentence is None:
            continue
        problem = tree_problem(sentence.heads)
        if problem is not None:
            skipped[problem] += 1
            continue
        out.append(sentence)
        if limit is not None and len(out) >= limit:
            break
    if not out:
        left_out = sum(skipped.values())
        detail = f" ({left_out} left out: not one tree)" if left_out else ""
        raise DataFormatError(f"{path}: no usable CoNLL-U sentences found{detail}")
    return TreebankData(sentences=out, skipped=skipped)


def read_conllu(path: str | Path, *, limit: int | None = None) -> list[TreebankSentence]:
    """Read the sentences of a CoNLL-U file (at most ``limit``); sentences that are not one
    tree are left out and their count logged as a warning (:func:`read_treebank` returns it).

    Raises:
        InputError: the file cannot be read.
        DataFormatError: a malformed line (the message gives ``file:line``), or no sentences.
    """
    data = read_treebank(path, limit=limit)
    left_out = {k: v for k, v in data.skipped.items() if v}
    if left_out:
        logger.warning(
            "%s: left out %d sentence(s) that are not one tree: %s",
            path,
            sum(left_out.values()),
            ", ".join(f"{v} {k}" for k, v in left_out.items()),
        )
    return data.sentences


def word_frequencies(sentences: Iterable[TreebankSentence]) -> Counter[str]:
    """Lower-cased word counts of a treebank (the rare-token probe's frequency table)."""
    counts: Counter[str] = Counter()
    for sentence in sentences:
        counts.update(w.lower() for w in sentence.words)
    return counts


def read_frequencies(path: str | Path) -> Counter[str]:
    """A frequency table: a ``word<TAB>count`` TSV (counts in ASCII digits), or a CoNLL-U file
    to count.

    Raises:
        InputError: the file cannot be read.
        DataFormatError: not UTF-8, a line that is not ``word<TAB>count``, or no word at all.
    """
    path = Path(path)
    if path.suffix == ".conllu":
        return word_frequencies(read_conllu(path))
    counts: Counter[str] = Counter()
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise InputError(f"cannot read frequency table {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise DataFormatError(f"{path}: not UTF-8 text ({exc.reason})") from None
    for number, line in enumerate(split_lines(text), start=1):
        if not line or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0] or not _COUNT.match(parts[1]):
            shown = line if len(line) <= 60 else line[:60] + "..."
            raise DataFormatError(
                f"{path}:{number}: expected 'word<TAB>count' (count in digits 0-9), found {shown!r}"
            )
        counts[parts[0]] += int(parts[1])
    if not counts:
        raise DataFormatError(f"{path}: no 'word<TAB>count' lines (an empty frequency table)")
    return counts
