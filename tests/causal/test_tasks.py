"""Prompt files (JSON Lines), their encoding into batches, and the built-in task generators.

Most tests run on a word-level toy tokenizer (no package needed); those marked ``needs_smollm2`` run the generators on the
real SmolLM2 tokenizer and check that the model itself behaves on clean and corrupt prompts.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import needs_smollm2

from headlab.causal import generators as gen
from headlab.causal.tasks import Prompt, encode_task, parse_prompt, read_prompts, write_prompts
from headlab.errors import InputError
from headlab.pruning.tasks import NAMES

MARY = Prompt(
    clean="When Mary and John went to the store, John gave a drink to",
    corrupt="When Anna and Paul went to the store, Tom gave a drink to",
    answer=" Mary",
    distractor=" John",
    meta={"io": "Mary", "s": "John"},
)


class ToyTokenizer:
    """Words (with their leading space), punctuation and GPT-2-like years (`` 17`` + ``32``) as
    tokens, ids handed out on first sight; ``bos`` is prepended with ``add_special_tokens``."""

    PIECE = re.compile(r" ?[A-Za-z]+| ?\d\d| ?\d| ?[^\sA-Za-z\d]")
    unk_token_id = None

    def __init__(self, *, bos: bool = True) -> None:
        self.vocab: dict[str, int] = {"<s>": 0}
        self.bos = bos

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = [self.vocab.setdefault(p, len(self.vocab)) for p in self.PIECE.findall(text)]
        return {"input_ids": [0, *ids] if add_special_tokens and self.bos else ids}


def first_id(tokenizer: Any, text: str) -> int:
    return int(tokenizer(text, add_special_tokens=False)["input_ids"][0])


# -- files --------------------------------------------------------------------------------------


def test_prompts_round_trip_through_a_jsonl_file(tmp_path: Path) -> None:
    other = Prompt(clean="a b c a b", corrupt="a b c d e", answer=" c", distractor=" b")
    path = tmp_path / "sub" / "ioi.jsonl"
    write_prompts([MARY, other], path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["meta"] == {"io": "Mary", "s": "John"}
    assert "meta" not in json.loads(lines[1])  # empty meta is left out
    path.write_text(lines[0] + "\n\n   \n" + lines[1] + "\n", encoding="utf-8")  # blank lines
    back = read_prompts(path)
    assert back == [MARY, other]
    assert [p.to_json() for p in back] == [MARY.to_json(), other.to_json()]
    assert not list(path.parent.glob(".*.tmp"))  # the atomic write left no temporary file


GOOD = json.dumps(MARY.to_json())


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"clean": "When Mary', "not JSON"),
        ('["When Mary", "When Anna", " Mary", " John"]', "expected a JSON object"),
        (
            json.dumps({k: v for k, v in MARY.to_json().items() if k != "distractor"}),
            "missing distractor",
        ),
        (json.dumps({**MARY.to_json(), "answer": 7}), "answer must be a non-empty string"),
        (json.dumps({**MARY.to_json(), "corrupt": None}), "corrupt must be a non-empty string"),
        (json.dumps({**MARY.to_json(), "clean": ""}), "clean must be a non-empty string"),
        (json.dumps({**MARY.to_json(), "answer": "  "}), "answer must be a non-empty string"),
        (json.dumps({**MARY.to_json(), "meta": [1]}), "meta must be a JSON object"),
        (GOOD[:-1] + ', "answer": " John"}', "the key 'answer' is given twice"),
    ],
    ids=[
        "not-json",
        "not-object",
        "missing-key",
        "number",
        "null",
        "empty",
        "blank",
        "meta",
        "twice",
    ],
)
def test_a_malformed_line_names_the_file_and_line(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(f"{GOOD}\n\n{line}\n{GOOD}\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_prompts(path)
    message = str(info.value)
    assert f"{path}, line 3:" in message and says in message
    assert "\n" not in message


def test_a_file_from_a_windows_editor_reads_as_written(tmp_path: Path) -> None:
    """A UTF-8 BOM and CRLF line ends, as Notepad saves JSON Lines."""
    path = tmp_path / "windows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + f"{GOOD}\r\n{GOOD}\r\n".encode())
    assert read_prompts(path) == [
        Prompt(**{**MARY.to_json(), "source": f"{path}, line {n}"}) for n in (1, 2)
    ]


def test_missing_and_empty_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        read_prompts(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(InputError, match="has no prompts"):
        read_prompts(tmp_path / "empty.jsonl")
    (tmp_path / "latin.jsonl").write_bytes(b'{"clean": "caf\xe9"}\n')
    with pytest.raises(InputError, match="cannot read"):
        read_prompts(tmp_path / "latin.jsonl")
    with pytest.raises(InputError, match="^prompt: expected a JSON object"):  # noqa: RUF043
        parse_prompt("When Mary")


# -- encoding -----------------------------------------------------------------------------------


def test_encode_task_groups_by_length_and_compares_first_tokens() -> None:
    tok = ToyTokenizer()
    short = Prompt(
        clean="Mary and John", corrupt="Anna and Paul", answer=" Mary", distractor=" John"
    )
    prompts = [MARY, short, MARY, short, MARY]
    task = encode_task(tok, prompts, name="ioi", batch=2)
    assert task.name == "ioi" and task.n_prompts == 5 and task.prompts == tuple(prompts)
    # short ones (1 + 3 tokens) first, then the long ones (1 + 14) in batches of at most 2
    assert [b.clean.shape for b in task.batches] == [(2, 4), (2, 15), (1, 15)]
    assert [b.index for b in task.batches] == [(1, 3), (0, 2), (4,)]
    for b in task.batches:
        assert b.clean.shape == b.corrupt.shape and b.answer.shape == b.distractor.shape == (
            len(b.index),
        )
        assert b.clean.dtype == b.answer.dtype == torch.int64
        assert (b.clean[:, 0] == 0).all() and (b.corrupt[:, 0] == 0).all()  # the BOS, kept
        assert b.answer.tolist() == [first_id(tok, " Mary")] * len(b.index)
        assert b.distractor.tolist() == [first_id(tok, " John")] * len(b.index)
        for row, i in zip(b.clean.tolist(), b.index, strict=True):
            assert row == tok(prompts[i].clean)["input_ids"]
    multi = Prompt(clean="a b", corrupt="c d", answer=" Mary Ann", distractor=" John")
    assert encode_task(tok, [multi]).batches[0].answer.tolist() == [first_id(tok, " Mary")]
    moved = encode_task(tok, [MARY]).batches[0].to("cpu")
    assert moved.index == (0,) and torch.equal(
        moved.clean, encode_task(tok, [MARY]).batches[0].clean
    )


def test_encode_task_refuses_unequal_lengths_and_equal_first_tokens() -> None:
    tok = ToyTokenizer()
    bad = Prompt(
        clean="When Mary and John went",
        corrupt="When Anna went",
        answer=" Mary",
        distractor=" John",
    )
    with pytest.raises(InputError) as info:
        encode_task(tok, [MARY, bad])
    message = str(info.value)
    assert message.startswith("prompt 2: ") and "got 6 and 4 tokens" in message
    assert "When Anna went" in message and "\n" not in message
    same = Prompt(clean="a b", corrupt="c d", answer=" Mary", distractor=" Mary Ann")
    with pytest.raises(InputError, match="prompt 1: .* start with the same token"):  # noqa: RUF043
        encode_task(tok, [same])
    with pytest.raises(InputError, match="at least one prompt"):
        encode_task(tok, [])
    with pytest.raises(InputError, match="batch must be at least 1"):
        encode_task(tok, [MARY], batch=0)


# -- generators ---------------------------------------------------------------------------------


def names_of(prompts: list[Prompt]) -> set[str]:
    return {n for p in prompts for n in (p.meta["io"], p.meta["s"], *p.meta["corrupt_names"])}


def words_of(prompts: list[Prompt]) -> set[str]:
    return {w for p in prompts for w in (p.clean + " " + p.corrupt).split()}


def check_generators(tokenizer: Any, n: int) -> dict[str, dict[str, list[Prompt]]]:
    """Every built-in task and part on ``tokenizer``: ``n`` prompts that fit it, the same for
    the same seed, and the parts disjoint; returns the prompts."""
    out: dict[str, dict[str, list[Prompt]]] = {}
    for name in gen.BUILTIN:
        out[name] = {}
        for part in gen.PARTS:
            prompts = gen.builtin_prompts(name, tokenizer, n, seed=1, part=part)
            assert len(prompts) == n
            for p in prompts:
                clean = tokenizer(p.clean, add_special_tokens=False)["input_ids"]
                assert len(clean) == len(
                    tokenizer(p.corrupt, add_special_tokens=False)["input_ids"]
                )
                answer = tokenizer(p.answer, add_special_tokens=False)["input_ids"]
                distractor = tokenizer(p.distractor, add_special_tokens=False)["input_ids"]
                assert len(answer) == len(distractor) == 1 and answer != distractor, p
                assert p.clean != p.corrupt
            task = encode_task(tokenizer, prompts)  # never refuses a generated prompt
            assert sum(len(b.index) for b in task.batches) == n
            again = gen.builtin_prompts(name, tokenizer, n, seed=1, part=part)
            assert [p.to_json() for p in again] == [p.to_json() for p in prompts]
            other = gen.builtin_prompts(name, tokenizer, n, seed=2, part=part)
            assert [p.to_json() for p in other] != [p.to_json() for p in prompts]
            out[name][part] = prompts
    ioi, ind = out["ioi"], out["induction"]
    assert names_of(ioi["discovery"]) <= set(NAMES[0::2])
    assert names_of(ioi["held-out"]) <= set(NAMES[1::2])
    # and its own templates, places and objects: sentences discovery never saw
    frames = {
        part: {(p.clean.split(",")[0].split()[0], *p.clean.split()[-3:-1]) for p in ioi[part]}
        for part in gen.PARTS
    }
    assert not frames["discovery"] & frames["held-out"]
    assert not words_of(ioi["held-out"]) & {"store", "park", "drink", "book"}
    assert not words_of(ind["discovery"]) & words_of(ind["held-out"])
    for part in gen.PARTS:  # IOI: half ABBA, half BABA; the corrupt names are three others
        assert [p.meta["order"] for p in ioi[part][:4]] == ["ABBA", "BABA", "ABBA", "BABA"]
        for p in ioi[part]:
            assert len({p.meta["io"], p.meta["s"], *p.meta["corrupt_names"]}) == 5
            assert p.clean.count(p.meta["s"]) == 2 and p.clean.count(p.meta["io"]) == 1
        for p in ind[part]:  # induction: the answer follows the repeated prefix in the clean side
            words, k = p.clean.split(), p.meta["k"]
            length = p.meta["length"]
            assert words[length:] == words[:k] and " " + words[k] == p.answer
            corrupt = p.corrupt.split()
            assert corrupt[length:] == words[length:]  # the same second half ...
            assert not set(corrupt[:length]) & set(words[:length])  # ... after a fresh first
            assert p.distractor.strip() in words[k + 1 : length]
    return out


def test_generators_on_a_toy_tokenizer() -> None:
    check_generators(ToyTokenizer(), 20)
    check_generators(ToyTokenizer(bos=False), 8)


def test_generators_refuse_bad_arguments() -> None:
    tok = ToyTokenizer()
    with pytest.raises(InputError, match="unknown task 'sva': choose one of ioi, induction"):
        gen.builtin_prompts("sva", tok, 4)
    with pytest.raises(InputError, match="part must be one of discovery, held-out, got 'test'"):
        gen.builtin_prompts("ioi", tok, 4, part="test")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputError, match="n must be a whole number"):
            gen.builtin_prompts("induction", tok, bad)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="length must be a whole number of at least 4"):
        gen.induction(tok, 4, length=3)
    with pytest.raises(InputError, match="needs 120 words"):
        gen.induction(tok, 4, length=60)

    class Letters(ToyTokenizer):  # no name, word or year stays whole
        PIECE = re.compile(r".")

    # #58: why, and what to do instead, not only a count
    for task, kept in ((gen.ioi, "0 of the 14 discovery names"), (gen.induction, "0 of the 55")):
        with pytest.raises(InputError) as info:
            task(Letters(), 4)
        line = str(info.value)
        assert line.startswith(f"--task {task.__name__} needs ") and "\n" not in line
        assert f"this model's tokenizer keeps {kept}" in line
        assert line.endswith(
            "give your own with --prompts FILE.jsonl (docs/causal.md, Tasks and the metric)"
        )


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_folder))


@needs_smollm2
def test_a_cjk_answer_cut_to_a_byte_fragment_is_said(smollm2_tokenizer: Any) -> None:
    """#59: SmolLM2 spells 李 in byte tokens; the task says its first token is a fragment."""
    (line,) = encode_task(smollm2_tokenizer, [replace(MARY, answer=" 李")]).notes
    assert line.startswith("1 answer(s) or distractor(s) are more than one token")
    assert "a byte fragment of ' 李'" in line


@needs_smollm2
def test_generators_on_the_smollm2_tokenizer(smollm2_tokenizer: Any) -> None:
    tok = smollm2_tokenizer
    prompts = check_generators(tok, 24)
    task = encode_task(tok, prompts["ioi"]["discovery"])
    first = task.prompts[task.batches[0].index[0]]
    assert task.batches[0].answer[0] == first_id(tok, first.answer)
    ids = {name: first_id(tok, " " + name) for name in ("Mary", "John")}
    mary = encode_task(tok, [MARY]).batches[0]
    assert (mary.answer.item(), mary.distractor.item()) == (ids["Mary"], ids["John"])
    assert mary.clean.tolist()[0] == tok(MARY.clean)["input_ids"]


def test_generators_on_the_gpt2_tokenizer_when_cached() -> None:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained("gpt2", local_files_only=True)
    except (OSError, ValueError) as exc:
        pytest.skip(f"no GPT-2 tokenizer in the local cache ({type(exc).__name__})")
    check_generators(tok, 24)


# -- behaviour on SmolLM2 -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_folder: Path) -> Any:
    from headlab.models.loading import load

    return load("smollm2", with_lm_head=True)


def mean_logit_differences(lm: Any, prompts: list[Prompt]) -> tuple[float, float]:
    """Mean ``logit(answer) - logit(distractor)`` at the last position, clean and corrupt."""
    task = encode_task(lm.tokenizer, prompts)
    sums = [0.0, 0.0]
    with torch.inference_mode():
        for b in task.batches:
            for side, ids in enumerate((b.clean, b.corrupt)):
                logits = lm.model(input_ids=ids).logits[:, -1]  # (B, V)
                rows = torch.arange(len(b.index))
                sums[side] += float((logits[rows, b.answer] - logits[rows, b.distractor]).sum())
    return sums[0] / len(prompts), sums[1] / len(prompts)


@needs_smollm2
@pytest.mark.parametrize(
    # measured on SmolLM2 (n=24, seed 0, discovery): see docs/causal.md
    ("name", "clean_above", "gap_above"),
    [("ioi", 2.0, 2.5), ("induction", 1.5, 2.0)],
)
def test_smollm2_solves_the_clean_prompts_and_not_the_corrupt_ones(
    smollm2: Any, name: str, clean_above: float, gap_above: float
) -> None:
    prompts = gen.builtin_prompts(name, smollm2.tokenizer, 24, seed=0)
    clean, corrupt = mean_logit_differences(smollm2, prompts)
    assert clean > clean_above, (clean, corrupt)
    assert clean - corrupt > gap_above, (clean, corrupt)
    assert abs(corrupt) < 1.5, (clean, corrupt)
