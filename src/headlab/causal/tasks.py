"""Tasks for causal head analysis: pairs of a clean and a corrupted prompt, and the metric.

A task is a list of :class:`Prompt` s. Each has a ``clean`` prompt, a ``corrupt`` one that differs
only where the behaviour's information sits (IOI: the names), and two strings whose *first
tokens* are compared: the ``answer`` the clean prompt calls for and the ``distractor`` the
corrupted one would. The metric is the logit difference ``logit(answer) - logit(distractor)`` at
the last position, averaged over the prompts (Wang et al. 2022; Heimersheim and Nanda 2024 on
why a logit difference rather than a probability).

On file a task is JSON Lines, one object a line::

    {"clean": "When Mary and John went to the store, John gave a drink to",
     "corrupt": "When Anna and Paul went to the store, Tom gave a drink to",
     "answer": " Mary", "distractor": " John"}

Clean and corrupt of one prompt must tokenize to the same length, so that position ``t`` of one
is position ``t`` of the other (patching swaps activations position by position). Prompts of
different lengths are fine: :func:`encode_task` groups them into batches of one length each, so
that no padding is ever needed and the last position is the last token of every row.

Shape vocabulary: ``B`` prompts of a batch, ``T`` tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from headlab.errors import InputError
from headlab.outputs import write_text_atomic

FIELDS = ("clean", "corrupt", "answer", "distractor")


@dataclass(frozen=True, kw_only=True)
class Prompt:
    """One clean/corrupt pair and the two strings whose first tokens the metric compares."""

    clean: str
    corrupt: str
    answer: str
    distractor: str
    #: what a generator knows about the prompt (IOI: ``{"io": "Mary", "s": "John"}``)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    #: where the prompt was read (``"ioi.jsonl, line 3"``), for errors that name it
    source: str = field(default="", compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"clean": self.clean, "corrupt": self.corrupt, "answer": self.answer,
                "distractor": self.distractor, **({"meta": self.meta} if self.meta else {})}  # fmt: skip


@dataclass(frozen=True, kw_only=True, eq=False)
class Batch:
    """Prompts of one token length, encoded.

    Shape:
        clean, corrupt: ``(B, T)`` token ids; answer, distractor: ``(B,)`` token ids;
        index: the ``B`` prompts' positions in :attr:`Task.prompts`.
    """

    clean: torch.Tensor
    corrupt: torch.Tensor
    answer: torch.Tensor
    distractor: torch.Tensor
    index: tuple[int, ...]

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            clean=self.clean.to(device),
            corrupt=self.corrupt.to(device),
            answer=self.answer.to(device),
            distractor=self.distractor.to(device),
            index=self.index,
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class Task:
    """A named list of prompts, encoded for one tokenizer into :class:`Batch` es."""

    name: str
    prompts: tuple[Prompt, ...]
    batches: tuple[Batch, ...]
    #: what a person should hear about the encoding (answers cut to their first token)
    notes: tuple[str, ...] = ()

    @property
    def n_prompts(self) -> int:
        return len(self.prompts)


def _line_error(where: str, message: str) -> InputError:
    return InputError(f"{where or 'prompt'}: {message}")


def parse_prompt(obj: object, where: str = "") -> Prompt:
    """A :class:`Prompt` from a JSON object with the four string fields (``meta`` optional)."""
    if not isinstance(obj, dict):
        raise _line_error(
            where, f"expected a JSON object with {', '.join(FIELDS)}, got {type(obj).__name__}"
        )
    missing = [k for k in FIELDS if k not in obj]
    if missing:
        raise _line_error(where, f"missing {', '.join(missing)} (expected {', '.join(FIELDS)})")
    for key in FIELDS:
        if not isinstance(obj[key], str) or not obj[key].strip():
            raise _line_error(where, f"{key} must be a non-empty string, got {obj[key]!r}")
    meta = obj.get("meta") or {}
    if not isinstance(meta, dict):
        raise _line_error(where, f"meta must be a JSON object, got {type(meta).__name__}")
    return Prompt(
        clean=obj["clean"],
        corrupt=obj["corrupt"],
        answer=obj["answer"],
        distractor=obj["distractor"],
        meta=meta,
        source=where,
    )


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def read_prompts(path: str | Path) -> list[Prompt]:
    """The prompts of a JSON Lines file (blank lines skipped).

    Raises:
        InputError: a missing or unreadable file, a line that is not JSON, lacks a field or
            gives one twice (naming the file and line), or a file with no prompt. A UTF-8 BOM
            and CRLF line ends are read as a Windows editor writes them.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"prompt file {path} not found (expected a JSON Lines file)")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a Windows editor's BOM too
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read prompt file {path}: {exc}") from exc
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            obj = json.loads(line, object_pairs_hook=_no_duplicates)
        except json.JSONDecodeError as exc:
            raise _line_error(where, f"not JSON ({exc.msg})") from exc
        except _DuplicateKey as exc:
            raise _line_error(where, f"the key {exc.args[0]!r} is given twice") from None
        prompts.append(parse_prompt(obj, where))
    if not prompts:
        raise InputError(f"prompt file {path} has no prompts (expected one JSON object a line)")
    return prompts


def write_prompts(prompts: Iterable[Prompt], path: str | Path) -> None:
    """``prompts`` as JSON Lines at ``path``, written atomically."""

    write_text_atomic(path, "".join(json.dumps(p.to_json()) + "\n" for p in prompts))


def prefix_ids(tokenizer: Any, text: str) -> list[int]:
    """``text``'s ids with the tokenizer's leading special tokens (a BOS) but no trailing ones
    (BERT's ``[SEP]``): the prompt must end where the answer would come."""
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    full = tokenizer(text)["input_ids"]
    prefix = full[: len(full) - len(plain)] if full[len(full) - len(plain) :] == plain else []
    return [*prefix, *plain]


def first_token(tokenizer: Any, text: str, what: str, where: str) -> int:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise _line_error(where, f"{what} {text!r} has no tokens")
    return int(ids[0])


def encode_task(
    tokenizer: Any, prompts: Sequence[Prompt], *, name: str = "prompts", batch: int = 24
) -> Task:
    """``prompts`` tokenized and grouped into batches of one length (at most ``batch`` rows).

    Raises:
        InputError: no prompts; a prompt whose clean and corrupt tokenize to different lengths
            (naming the prompt and both lengths); an answer whose first token is its
            distractor's.
    """
    if not prompts:
        raise InputError("a task needs at least one prompt")
    if batch < 1:
        raise InputError(f"batch must be at least 1, got {batch}")
    rows: dict[int, list[tuple[int, list[int], list[int], int, int]]] = {}
    cut: list[tuple[str, int]] = []  # answers and distractors of more than one token
    for i, p in enumerate(prompts):
        where = p.source or f"prompt {i + 1}"
        clean, corrupt = prefix_ids(tokenizer, p.clean), prefix_ids(tokenizer, p.corrupt)
        if len(clean) != len(corrupt):
            raise _line_error(
                where,
                f"clean and corrupt must tokenize to the same length, got {len(clean)} and "
                f"{len(corrupt)} tokens ({p.clean!r} / {p.corrupt!r})",
            )
        answer = first_token(tokenizer, p.answer, "answer", where)
        distractor = first_token(tokenizer, p.distractor, "distractor", where)
        for text, token in ((p.answer, answer), (p.distractor, distractor)):
            if len(tokenizer(text, add_special_tokens=False)["input_ids"]) > 1:
                cut.append((text, token))
        if answer == distractor:
            raise _line_error(
                where,
                f"answer {p.answer!r} and distractor {p.distractor!r} start with the same "
                "token: their logit difference is always 0",
            )
        rows.setdefault(len(clean), []).append((i, clean, corrupt, answer, distractor))
    batches = []
    for _, same in sorted(rows.items()):
        for lo in range(0, len(same), batch):
            chunk = same[lo : lo + batch]
            batches.append(
                Batch(
                    clean=torch.tensor([r[1] for r in chunk]),
                    corrupt=torch.tensor([r[2] for r in chunk]),
                    answer=torch.tensor([r[3] for r in chunk]),
                    distractor=torch.tensor([r[4] for r in chunk]),
                    index=tuple(r[0] for r in chunk),
                )
            )
    return Task(
        name=name, prompts=tuple(prompts), batches=tuple(batches), notes=_cut_notes(tokenizer, cut)
    )


def _cut_notes(tokenizer: Any, cut: list[tuple[str, int]]) -> tuple[str, ...]:
    """One line on answers and distractors read by their first token only, with an example
    (a first token that is a byte fragment, as a CJK character's can be, said so)."""
    if not cut:
        return ()
    text, token = cut[0]
    decode = getattr(tokenizer, "decode", None)
    first = decode([token]) if callable(decode) else f"token {token}"
    shown = f"a byte fragment of {text!r}" if "\ufffd" in first else f"{text!r} -> {first!r}"
    return (
        f"{len(cut)} answer(s) or distractor(s) are more than one token; the logit difference "
        f"reads the first token of each ({shown})",
    )
