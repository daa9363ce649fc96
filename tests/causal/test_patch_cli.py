"""``headlab patch`` and the library entry ``patch_heads``, end to end on tiny random decoders:
the JSON a user reads, the files written, and every bad input refused in one line that names
the file and line, with nothing written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.models.tiny import build

from headlab.causal.patching import patch_heads, run_patching, spearman
from headlab.causal.tasks import encode_task, read_prompts
from headlab.cli import main
from headlab.models.loading import load

PROMPTS = [
    {
        "clean": "When Mary and John went to the store, John gave a drink to",
        "corrupt": "When Anna and Paul went to the store, Tom gave a drink to",
        "answer": " Mary",
        "distractor": " John",
    },
    {
        "clean": "Then, John and Mary had a long argument, and afterwards Mary said to",
        "corrupt": "Then, Paul and Anna had a long argument, and afterwards Tom said to",
        "answer": " John",
        "distractor": " Mary",
    },
]


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("llama", tmp_path_factory.mktemp("llama"), lm_head=True, seed=5)


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_json_names_every_head_and_the_metric(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = _jsonl(tmp_path / "ioi.jsonl", PROMPTS)
    figure, table = tmp_path / "heat.png", tmp_path / "heads.csv"
    argv = ["-q", "patch", "--model", str(folder), "--prompts", str(prompts), "--json"]
    assert main([*argv, "--figure", str(figure), "--csv-out", str(table)]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    lines = captured.err.splitlines()
    same_sign = out["metric"]["clean"] * out["metric"]["corrupt"] > 0  # a warning then (#58)
    assert [line for line in lines if "warning: " in line] == lines[: int(same_sign)]
    assert lines[int(same_sign) :] == [f"wrote {figure}", f"wrote {table}"]  # each said (#59)
    assert out["model"] and out["task"] == "ioi.jsonl" and out["method"] == "activation"
    assert out["position"] == "all" and out["n_prompts"] == 2
    assert set(out["metric"]) >= {"clean", "corrupt"}
    assert out["metric"]["clean"] != out["metric"]["corrupt"]
    heads = out["heads"]
    assert sorted((h["layer"], h["head"]) for h in heads) == [
        (la, h) for la in (0, 1) for h in range(4)
    ]
    assert all(isinstance(h["effect"], float) for h in heads)
    # the files say the same as the JSON
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = table.read_text().splitlines()
    assert rows[0] == "layer,head,effect" and len(rows) == 1 + len(heads)
    first = rows[1].split(",")
    match = next(h for h in heads if (h["layer"], h["head"]) == (int(first[0]), int(first[1])))
    assert float(first[2]) == pytest.approx(match["effect"], rel=1e-5, abs=1e-9)
    # patching the last position only is another measurement
    assert main([*argv, "--position", "last"]) == 0
    last = json.loads(capsys.readouterr().out)
    assert last["position"] == "last"
    assert [h["effect"] for h in last["heads"]] != [h["effect"] for h in heads]


def test_compare_prints_both_correlations_and_top_heads(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = _jsonl(tmp_path / "ioi.jsonl", PROMPTS)
    argv = ["-q", "patch", "--model", str(folder), "--prompts", str(prompts)]
    assert main([*argv, "--method", "attribution", "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    compare = out["compare"]
    assert compare["method"] == "activation"
    assert -1.0 <= compare["pearson"] <= 1.0 and -1.0 <= compare["spearman"] <= 1.0
    assert len(compare["top"]["attribution"]) == len(compare["top"]["activation"]) == 5
    assert main([*argv, "--method", "ig", "--steps", "2", "--compare"]) == 0
    text = capsys.readouterr().out
    assert "Pearson" in text and "Spearman" in text and "activation patching's top" in text


def test_write_gives_prompts_that_read_back(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ioi.jsonl"
    argv = ["-q", "patch", "--model", str(folder), "--task", "ioi", "--n", "6", "--seed", "3"]
    assert main([*argv, "--write", str(out)]) == 0
    assert capsys.readouterr().err == f"wrote 6 prompts to {out}\n"
    prompts = read_prompts(out)
    assert len(prompts) == 6 and all(p.answer != p.distractor for p in prompts)
    assert main(["-q", "patch", "--model", str(folder), "--prompts", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_prompts"] == 6


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([PROMPTS[0], "{not json"], r"bad\.jsonl, line 2: not JSON"),
        (
            [PROMPTS[0], {"clean": "a", "corrupt": "b", "answer": " x"}],
            r"line 2: missing distractor",
        ),
        (
            [{**PROMPTS[0], "corrupt": "When Anna went to the big store, Tom gave it to"}],
            r"bad\.jsonl, line 1: clean and corrupt must tokenize to the same length",
        ),
        ([{**PROMPTS[0], "distractor": " Mary"}], r"line 1: answer ' Mary' and distractor ' Mary'"),
        ([{**PROMPTS[0], "corrupt": PROMPTS[0]["clean"]}], r"score the same on average"),
    ],
)
def test_bad_prompt_files_are_refused_in_one_line_and_nothing_is_written(
    folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    rows: list[object],
    expected: str,
) -> None:
    import re

    bad = _jsonl(tmp_path / "bad.jsonl", rows)
    figure = tmp_path / "heat.png"
    argv = ["-q", "patch", "--model", str(folder), "--prompts", str(bad), "--figure", str(figure)]
    line = _fails(argv, capsys)
    assert re.search(expected, line), line
    assert not figure.exists()


def test_a_model_without_a_language_model_head_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = build("bert", tmp_path / "bert")
    prompts = _jsonl(tmp_path / "ioi.jsonl", PROMPTS)
    line = _fails(["-q", "patch", "--model", str(plain), "--prompts", str(prompts)], capsys)
    assert "language-model head" in line or "causal" in line, line
    empty = tmp_path / "empty"
    empty.mkdir()  # not a model at all: said as such, not as "no language-model head"
    line = _fails(["-q", "patch", "--model", str(empty), "--prompts", str(prompts)], capsys)
    assert "config.json" in line and "causal" not in line, line


def test_bad_flags_are_refused_before_any_work(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["-q", "patch", "--model", str(folder)]
    assert "expected a .png file" in _fails([*base, "--figure", str(tmp_path / "x.jpg")], capsys)
    assert "does not exist" in _fails([*base, "--write", str(tmp_path / "no" / "a.jsonl")], capsys)
    assert "--compare compares" in _fails([*base, "--compare"], capsys)


def test_library_entry_takes_a_transformers_model_and_dicts(folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    result = patch_heads(model, tokenizer, PROMPTS)
    lm = load(folder, with_lm_head=True)
    same = run_patching(lm, encode_task(lm.tokenizer, read_prompts_from(PROMPTS)))
    torch.testing.assert_close(result.effects, same.effects, atol=1e-6, rtol=1e-5)
    top = result.top(3)
    assert len(top) == 3 and abs(top[0][2]) >= abs(top[1][2]) >= abs(top[2][2])
    assert top[0][2] == pytest.approx(float(result.effects[top[0][0], top[0][1]]))
    page = result._repr_html_()
    assert page.count("<tr>") == lm.n_layers + 1 and page.count("<td") == 8  # + the head axis
    with pytest.raises(Exception, match="k must be a whole number"):
        result.top(0)


def read_prompts_from(rows: list[dict[str, str]]) -> list:  # type: ignore[type-arg]
    from headlab.causal.tasks import parse_prompt

    return [parse_prompt(r) for r in rows]


def test_spearman_matches_scipy() -> None:
    from scipy.stats import spearmanr

    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 4, generator=g, dtype=torch.float64)
    b = a + 0.5 * torch.randn(5, 4, generator=g, dtype=torch.float64)
    b[0, :2] = b[0, 2]  # ties
    assert spearman(a, b) == pytest.approx(spearmanr(a.flatten(), b.flatten()).statistic)


def test_the_report_draws_a_patching_result(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = _jsonl(tmp_path / "ioi.jsonl", PROMPTS)
    argv = ["-q", "patch", "--model", str(folder), "--prompts", str(prompts), "--json"]
    assert main(argv) == 0
    result = tmp_path / "patch.json"
    result.write_text(capsys.readouterr().out)
    top = json.loads(result.read_text())["heads"]
    best = max(top, key=lambda h: abs(h["effect"]))
    out = tmp_path / "report"
    report = ["-q", "report", "--out", str(out), "--limit", "8", "--replicates", "0", "--no-gap"]
    report.append("--roles-only")
    line = _fails([*report, "--patch", str(result)], capsys)  # the default model is another
    assert "--patch: measured on" in line and not out.exists()
    report += ["--model", str(folder)]
    assert main([*report, "--patch", str(result)]) == 0
    capsys.readouterr()
    page = (out / "index.html").read_text()
    assert 'src="figures/patching.png"' in page and "Which heads carry ioi.jsonl" in page
    assert f"{best['layer']}.{best['head']} ({best['effect']:+.2f})" in page
    assert (out / "figures" / "patching.png").read_bytes()[:4] == b"\x89PNG"
    # a file that is not a patching result is refused before anything is measured
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": "m", "heads": []}))
    line = _fails([*report, "--out", str(tmp_path / "r2"), "--patch", str(bad)], capsys)
    assert "expected the JSON of headlab patch --json" in line and str(bad) in line
    assert not (tmp_path / "r2").exists()


def test_a_prompt_longer_than_the_model_reads_is_refused(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#59: a prompt past the model's positions (128 in the tiny Llama) is refused in one line
    naming the file, the line and the limit, not run with exit 0."""
    long = " and".join(["When Mary and John went to the store, John gave a drink to"] * 12)
    prompts = [PROMPTS[0], {**PROMPTS[0], "clean": long, "corrupt": long.replace("Mary", "Anna")}]
    path = _jsonl(tmp_path / "long.jsonl", prompts)
    line = _fails(["patch", "--model", str(folder), "--prompts", str(path)], capsys)
    assert f"{path}, line 2:" in line and "reads at most 128" in line


def test_answers_of_more_than_one_token_are_said_on_stderr(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#59: an answer the tokenizer splits is read by its first token, and stderr says so in
    one line with an example (a CJK character's first token is a byte fragment)."""
    from headlab.causal.tasks import encode_task, parse_prompt
    from headlab.models import load

    lm = load(folder, with_lm_head=True)
    split = [w for w in (" Anastasia", " Bartholomew", " 李", " zyxwvut", " qqqqzzzz")]
    words = [w for w in split if len(lm.tokenizer.encode(w, add_special_tokens=False)) > 1]
    assert words, "every word is one token in the tiny tokenizer"
    prompts = [{**PROMPTS[0], "answer": w} for w in words]
    task = encode_task(lm.tokenizer, [parse_prompt(p) for p in prompts])
    (line,) = task.notes
    assert line.startswith(f"{len(words)} answer(s) or distractor(s) are more than one token")
    path = _jsonl(tmp_path / "long.jsonl", prompts)
    assert main(["patch", "--model", str(folder), "--prompts", str(path), "--json"]) == 0
    err = capsys.readouterr().err
    assert f"headlab patch: note: {line}\n" in err
    one = encode_task(lm.tokenizer, [parse_prompt(PROMPTS[0])])
    assert one.notes == ()


def test_a_tokenizer_that_keeps_no_name_whole_says_why_and_what_to_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """#58: tiny-shakespeare's character tokenizer keeps none of IOI's names and one of
    induction's words whole: one line says why the built-in prompts cannot be drawn and to
    give --prompts, not only a count."""
    from headlab.causal.generators import NAMES, WORDS
    from headlab.models import load

    tokenizer = load("tiny-shakespeare").tokenizer
    whole = [
        n for n in NAMES[::2] if len(tokenizer(" " + n, add_special_tokens=False)["input_ids"]) == 1
    ]
    assert whole == []  # the oracle: no discovery name is one token
    for task in ("ioi", "induction"):
        line = _fails(["patch", "--model", "tiny-shakespeare", "--task", task], capsys)
        assert line.startswith(f"headlab: error: --task {task} needs ")
        assert "this model's tokenizer keeps " in line and "cuts words into smaller" in line
        assert "give your own with --prompts FILE.jsonl" in line

    def one(text: str) -> bool:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) == 1

    words = [w for w in WORDS[::2] if one(w) and one(" " + w)]
    assert f"keeps {len(words)} of the {len(WORDS[::2])} discovery words" in line


def corruptions(folder: Path) -> tuple[float, str, str, Callable[[str], float]]:
    """For PROMPTS[0] in the model at ``folder``: its clean logit difference, a corrupted
    prompt of the same sign, one of the other sign, and the oracle giving a prompt's logit
    difference (the model's last-position logits through transformers)."""
    from transformers import AutoModelForCausalLM

    from headlab.causal.tasks import prefix_ids

    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    tokenizer = load(folder).tokenizer
    base = PROMPTS[0]

    def first(text: str) -> int:
        return tokenizer(text, add_special_tokens=False)["input_ids"][0]

    def ids(text: str) -> list[int]:
        return prefix_ids(tokenizer, text)  # the ids headlab feeds the model

    def ld(text: str) -> float:
        with torch.no_grad():
            logits = model(torch.tensor([ids(text)])).logits[0, -1].double()
        return float(logits[first(base["answer"])] - logits[first(base["distractor"])])

    clean = ld(base["clean"])
    same = other = None
    stem = base["clean"].rsplit(" ", 1)[0]  # "... John gave a drink"
    for last in ("for", "with", "at", "from", "by", "of", "in", "on"):
        text = f"{stem} {last}"
        if len(ids(text)) != len(ids(base["clean"])):
            continue
        if clean * ld(text) > 0 and same is None:
            same = text
        if clean * ld(text) < 0 and other is None:
            other = text
    assert same is not None and other is not None, "no corruption of either sign"
    return clean, same, other, ld


def test_clean_and_corrupted_prompts_of_the_same_sign_are_warned_of(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#58: own prompts whose clean and corrupted logit differences have the same sign give
    effects that can exceed 1; stderr says so in one line, and says nothing otherwise. The
    signs come from an oracle: the model's last-position logits through transformers."""
    clean, same, other, ld = corruptions(folder)
    base = PROMPTS[0]
    capsys.readouterr()  # transformers' loading bar of the oracle
    for corrupt, warned in ((same, True), (other, False)):
        path = _jsonl(tmp_path / "p.jsonl", [{**base, "corrupt": corrupt}])
        assert main(["-q", "patch", "--model", str(folder), "--prompts", str(path), "--json"]) == 0
        captured = capsys.readouterr()
        metric = json.loads(captured.out)["metric"]
        assert metric["clean"] == pytest.approx(clean, abs=1e-4)
        assert metric["corrupt"] == pytest.approx(ld(corrupt), abs=1e-4)
        lines = captured.err.splitlines()
        if warned:
            assert len(lines) == 1, lines
            line = lines[0]
            assert line.startswith("headlab patch: warning: the clean and corrupted prompts both")
            assert "the same sign" in line and "can exceed 1" in line
        else:
            assert lines == []
