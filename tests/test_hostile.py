"""Hostile and careless inputs, one row each: the expected one-line error (or skip count).

Every CLI row runs ``headlab.cli.main(argv)`` in-process from an empty working folder and
fails on a traceback, on an exit code other than the expected one, on a message without the
expected words, or on any file created, changed or removed under the test's folder (inputs
included). Rows are cheap by design: each error must come before any real work, so the slowest
row loads the bundled 4-layer tiny-shakespeare model.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from headlab.cli import main
from headlab.errors import HeadlabError

# ---------------------------------------------------------------- hostile files

GOOD_TREE = ["1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_", "2\tdog\tdog\tNOUN\t_\t_\t0\troot\t_\t_"]
TREES = {
    "a cycle": [
        "1\tA\ta\tX\t_\t_\t2\tdep\t_\t_",
        "2\tB\tb\tX\t_\t_\t3\tdep\t_\t_",
        "3\tC\tc\tX\t_\t_\t2\tdep\t_\t_",
        "4\tD\td\tX\t_\t_\t0\troot\t_\t_",
    ],
    "a word is its own head": [
        "1\tA\ta\tX\t_\t_\t1\tdep\t_\t_",
        "2\tB\tb\tX\t_\t_\t0\troot\t_\t_",
    ],
    "two or more roots": ["1\tA\ta\tX\t_\t_\t0\troot\t_\t_", "2\tB\tb\tX\t_\t_\t0\troot\t_\t_"],
    "no root": ["1\tA\ta\tX\t_\t_\t2\tdep\t_\t_", "2\tB\tb\tX\t_\t_\t1\tdep\t_\t_"],
}
GAP_HEADER = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL"


def _gap_row(rid: str, text: str, pronoun: str, a: str, b: str, a_true: bool = True) -> str:
    cols = [rid, text, pronoun, str(text.index(pronoun)), a, str(text.index(a))]
    cols += ["TRUE" if a_true else "FALSE", b, str(text.index(b)), "FALSE" if a_true else "TRUE"]
    return "\t".join([*cols, "http://example.org"])


def build_files(root: Path) -> None:
    """The hostile inputs, written under ``root``."""
    from headlab.models.names import bundled_model_path

    trees = "\n\n".join("\n".join(t) for t in [GOOD_TREE, *TREES.values()]) + "\n"
    (root / "trees.conllu").write_text(trees, encoding="utf-8")
    only_bad = "\n\n".join("\n".join(t) for t in TREES.values()) + "\n"
    (root / "only-bad-trees.conllu").write_text(only_bad, encoding="utf-8")
    text = "Anna met Bella at noon, and she\u2028smiled at her new colleague there."
    rows = [
        GAP_HEADER,
        _gap_row("ok-1", text, "she", "Anna", "Bella"),  # U+2028 inside the text: still one row
        _gap_row("self", "Carla thanked Dora when Carla left.", "Carla", "Carla", "Dora"),
    ]
    (root / "gap.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (root / "empty.tsv").write_text("", encoding="utf-8")
    (root / "comments-only.tsv").write_text("# nothing\n\n", encoding="utf-8")
    (root / "latin1.tsv").write_bytes("caf\xe9\t3\n".encode("latin-1"))
    (root / "not-a-count.tsv").write_text("the\t12\nof\tmany\n", encoding="utf-8")
    (root / "superscript.tsv").write_text("the\t\u00b2\n", encoding="utf-8")
    big = {"model_type": "llama", "num_hidden_layers": 10**8, "num_attention_heads": 8}
    (root / "big.json").write_text(json.dumps({**big, "hidden_size": 512}))
    window = {"model_type": "mistral", "num_hidden_layers": 2, "num_attention_heads": 8}
    (root / "window.json").write_text(
        json.dumps({**window, "hidden_size": 64, "sliding_window": -4})
    )
    (root / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (root / "deep-object.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    curve = {"model": "m", "metric": "x", "unit": "u", "importance": "gradient"}
    (root / "curve-list.json").write_text(json.dumps({**curve, "curve": [1, 2]}))
    (root / "curve-nan.json").write_text(
        '{"model": "m", "metric": "x", "unit": "u", "importance": "g", "curve": '
        '[{"heads_removed": 0, "fraction": NaN, "metric": 1, "loss": 0}]}'
    )
    (root / "curve-no-model.json").write_text(
        json.dumps({"curve": [{"heads_removed": 0, "fraction": 0, "metric": 1, "loss": 0}]})
    )
    (root / "text.txt").write_text("to be or not to be " * 600, encoding="utf-8")
    (root / "zip.gguf").write_bytes(b"PK\x03\x04" + b"\0" * 60)  # a zip named .gguf
    (root / "cut.gguf").write_bytes(b"GGUF\x03\x00\x00")  # the magic, then nothing
    (root / "folder.gguf").mkdir()
    tiny = bundled_model_path("tiny-shakespeare")
    for name, layers in (("six-layers", 6), ("two-layers", 2)):
        folder = root / name
        shutil.copytree(tiny, folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "n_layer": layers}))
    (root / "data").mkdir()  # an experiment data folder without TinyShakespeare


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    build_files(root)
    return root


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` with a digest of its bytes."""
    out = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        out[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


# ---------------------------------------------------------------- command lines


@dataclass(frozen=True)
class Case:
    argv: list[str]
    code: int
    message: str


F = "{files}"  # replaced by the hostile files' folder

CASES: dict[str, Case] = {
    # empty strings that used to become the default
    "heads --word ''": Case(["heads", "--word", ""], 2, "--word: expected a word, got an empty"),
    "heads ''": Case(["heads", ""], 2, "expected a sentence, got an empty string"),
    "spec ''": Case(["spec", ""], 2, "expected a model name"),
    "spec --compare ''": Case(["spec", "--compare", "a", ""], 2, "expected a model name"),
    "roles --treebank ''": Case(["roles", "--treebank", ""], 2, "--treebank: expected a file"),
    "roles --gap ''": Case(["roles", "--gap", ""], 2, "--gap: expected a file"),
    "roles --frequencies ''": Case(["roles", "--frequencies", ""], 2, "expected a file"),
    "report --treebank ''": Case(["report", "--treebank", ""], 2, "expected a file"),
    "report --word ''": Case(["report", "--word", ""], 2, "--word: expected a word"),
    "report --out ''": Case(["report", "--out", ""], 2, "--out: expected a folder"),
    "prune --text ''": Case(["prune", "--curve", "--text", "  "], 2, "expected a file"),
    "report --one-vs-many ''": Case(["report", "--one-vs-many", ""], 2, "expected a file"),
    "experiment --data ''": Case(["experiment", "one-vs-many", "--data", ""], 2, "expected a"),
    # meaningless values
    # one message, whatever the number of sentences (the treebank's 4 beside the viewer's, #58)
    "report --word not in the sentence": Case(
        ["report", "--word", "salmon", "--out", "r"],
        1,
        "headlab: error: --word 'salmon' is in none of the viewer's 5 sentence(s) ('The chef",
    ),
    "report --word in none of the sentences": Case(
        ["report", "--sentence", "Your own sentence.", "--word", "salmon", "--out", "r"],
        1,
        "headlab: error: --word 'salmon' is in none of the viewer's 6 sentence(s) ('The chef",
    ),
    "report --word#3": Case(
        ["report", "--word", "the#3", "--out", "r"], 1, "--word 'the#3' is in none of the"
    ),
    "train --vocab 0": Case(
        ["train", "--text", f"{F}/text.txt", "--out", "m", "--vocab", "0"], 2, "257..65,536"
    ),
    "train --context 100000": Case(
        ["train", "--text", f"{F}/text.txt", "--out", "m", "--context", "100000"], 2, "2..4,096"
    ),
    "train --context longer than the text": Case(
        ["train", "--text", f"{F}/text.txt", "--out", "m", "--context", "4096", "--steps", "1"],
        1,
        "context 4096 needs more than 4097 tokens",
    ),
    "train --heads not dividing": Case(
        ["train", "--text", f"{F}/text.txt", "--out", "m", "--d-model", "30", "--heads", "4"],
        1,
        "d_model (30) must be divisible by n_heads (4)",
    ),
    "train --seed 1e23": Case(
        ["train", "--text", f"{F}/text.txt", "--out", "m", "--seed", "1e23"], 2, "expected an int"
    ),
    "train --seed 10^23": Case(
        ["train", "--text", f"{F}/text.txt", "--out", "m", "--seed", str(10**23)],
        2,
        "0..4,294,967,295",
    ),
    "roles --seed -1": Case(["roles", "--seed", "-1"], 2, "0..4,294,967,295"),
    "prune --max-loss nan": Case(["prune", "--curve", "--max-loss", "nan"], 2, "finite"),
    "prune --max-loss -1": Case(["prune", "--curve", "--max-loss", "-1"], 2, "expected a number"),
    "prune --step inf": Case(["prune", "--curve", "--step", "inf"], 2, "finite"),
    "prune --fraction nan": Case(["prune", "--fraction", "nan", "--out", "p"], 2, "finite"),
    # sizes with no bound
    "roles --replicates 10^8": Case(["roles", "--replicates", "100000000"], 2, "0..100,000"),
    "report --replicates 10^8": Case(["report", "--replicates", "100000000"], 2, "0..100,000"),
    "spec --context 0": Case(["spec", "--context", "0"], 2, "expected an integer in 1.."),
    "spec --context 2^50": Case(["spec", "--context", str(2**50)], 2, "expected an integer"),
    "spec 10^8 layers": Case(["spec", f"{F}/big.json"], 1, "at most 10,000, got 100,000,000"),
    "spec negative sliding_window": Case(
        ["spec", f"{F}/window.json"], 1, "sliding_window must be a positive integer, got -4"
    ),
    "spec 100k-deep JSON list": Case(["spec", f"{F}/deep.json"], 1, "nested too deeply"),
    "spec 100k-deep JSON object": Case(["spec", f"{F}/deep-object.json"], 1, "nested too deeply"),
    # GGUF files: refused by their bytes, before any conversion
    "heads --model missing.gguf": Case(
        ["heads", "--model", f"{F}/missing.gguf"], 1, "missing.gguf does not exist"
    ),
    "roles --model zip.gguf": Case(
        ["roles", "--model", f"{F}/zip.gguf"], 1, "is not a GGUF file (it starts with"
    ),
    "prune --model cut.gguf": Case(
        ["prune", "--curve", "--model", f"{F}/cut.gguf"], 1, "cannot read the GGUF file"
    ),
    "spec zip.gguf": Case(["spec", f"{F}/zip.gguf"], 1, "is not a GGUF file"),
    "spec missing.gguf": Case(["spec", f"{F}/missing.gguf"], 1, "missing.gguf does not exist"),
    "report --model a folder named .gguf": Case(
        ["report", "--model", f"{F}/folder.gguf", "--out", "r"], 1, "(expected a .gguf file)"
    ),
    # data files
    "roles --frequencies empty": Case(
        ["roles", "--frequencies", f"{F}/empty.tsv"], 1, "an empty frequency table"
    ),
    "roles --frequencies comments only": Case(
        ["roles", "--frequencies", f"{F}/comments-only.tsv"], 1, "an empty frequency table"
    ),
    "roles --frequencies latin-1": Case(
        ["roles", "--frequencies", f"{F}/latin1.tsv"], 1, "not UTF-8 text"
    ),
    "roles --frequencies non-numeric": Case(
        ["roles", "--frequencies", f"{F}/not-a-count.tsv"], 1, ":2: expected 'word<TAB>count'"
    ),
    "roles --frequencies superscript digit": Case(
        ["roles", "--frequencies", f"{F}/superscript.tsv"], 1, "count in digits 0-9"
    ),
    "roles --treebank with no tree": Case(
        ["roles", "--treebank", f"{F}/only-bad-trees.conllu"], 1, "4 left out: not one tree"
    ),
    "report --pruning curve of numbers": Case(
        ["report", "--pruning", f"{F}/curve-list.json", "--out", "r"],
        1,
        "curve[0] must be an object",
    ),
    "report --cost NaN": Case(
        ["report", "--cost", f"{F}/curve-nan.json", "--out", "r"], 1, "NaN is not a number"
    ),
    "report --cost a pruning file": Case(
        ["report", "--cost", f"{F}/curve-no-model.json", "--out", "r"], 1, "experiment cost"
    ),
    "report --pruning NaN": Case(
        ["report", "--pruning", f"{F}/curve-nan.json", "--out", "r"], 1, "NaN is not a number"
    ),
    "report --pruning without model": Case(
        ["report", "--pruning", f"{F}/curve-no-model.json", "--out", "r"],
        1,
        "'model' must be a string",
    ),
    "report --pruning 100k deep": Case(
        ["report", "--pruning", f"{F}/deep-object.json", "--out", "r"], 1, "nested too deeply"
    ),
    # #58: a size refused names its flag
    "experiment cost --heads 3 at width 256": Case(
        ["experiment", "cost", "--heads", "3", "--width", "256"],
        1,
        "headlab: error: --heads 3: each head count must divide the width 256",
    ),
    "experiment cost --quick --heads 3": Case(
        ["experiment", "cost", "--quick", "--heads", "1,3"], 1, "headlab: error: --heads 3: "
    ),
    "experiment --data without the corpus": Case(
        ["experiment", "one-vs-many", "--data", f"{F}/data"], 1, "cannot read TinyShakespeare"
    ),
    # a config that disagrees with its weights
    "heads: n_layer 6 over 4 layers of weights": Case(
        ["heads", "--model", f"{F}/six-layers"], 1, "the weights lack 24 tensor(s)"
    ),
    "heads: n_layer 2 over 4 layers of weights": Case(
        ["heads", "--model", f"{F}/two-layers"], 1, "has no place for (transformer.h.2."
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_command_line(
    name: str,
    files: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    case = CASES[name]
    argv = [a.replace(F, str(files)) for a in case.argv]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # relative outputs would land here
    before = snapshot(files), snapshot(tmp_path)
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert code == case.code, f"{name}: exit {code}, stderr: {err}"
    assert case.message in err, f"{name}: {err!r}"
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1, err  # one line; argparse adds its usage lines above it
    assert (snapshot(files), snapshot(tmp_path)) == before, f"{name} changed files"


# ---------------------------------------------------------------- library calls


def _call_cases() -> dict[str, tuple[Callable[[Path], Any], type[Exception], str]]:
    from headlab.attention import MultiHeadAttention
    from headlab.datasets import read_frequencies
    from headlab.layout import layout_from_config
    from headlab.training.language_model import LMRecipe

    def both_masks(_: Path) -> Any:
        mha = MultiHeadAttention(d_model=8, n_heads=2)
        real = torch.ones(1, 3, dtype=torch.bool)
        return mha(torch.randn(1, 3, 8), key_mask=real, key_padding_mask=~real)

    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64}
    return {
        "key_mask and key_padding_mask at once": (both_masks, HeadlabError, "not both"),
        "float key_padding_mask": (
            lambda _: MultiHeadAttention(d_model=8, n_heads=2)(
                torch.randn(1, 3, 8), key_padding_mask=torch.zeros(1, 3)
            ),
            HeadlabError,
            "True = padding, as in torch",
        ),
        "a config with 10^12 heads": (
            lambda _: layout_from_config({**llama, "num_attention_heads": 10**12}),
            HeadlabError,
            "at most 65,536",
        ),
        "a config with sliding_window 'x'": (
            lambda _: layout_from_config(
                {**llama, "num_attention_heads": 2, "sliding_window": "x"}
            ),
            HeadlabError,
            "sliding_window must be a positive integer",
        ),
        "LMRecipe(vocab_size=0)": (lambda _: LMRecipe(vocab_size=0), HeadlabError, "vocab_size"),
        "LMRecipe(lr=nan)": (lambda _: LMRecipe(lr=float("nan")), HeadlabError, "lr must be"),
        "read_frequencies(latin-1)": (
            lambda f: read_frequencies(f / "latin1.tsv"),
            HeadlabError,
            "not UTF-8",
        ),
    }


CALLS = _call_cases()


@pytest.mark.parametrize("name", list(CALLS))
def test_library_call(name: str, files: Path) -> None:
    call, error, message = CALLS[name]
    before = snapshot(files)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(files)
    assert snapshot(files) == before


def test_trees_that_are_not_one_tree_are_skipped_and_counted(files: Path) -> None:
    from headlab.datasets import read_conllu, read_treebank

    data = read_treebank(files / "trees.conllu")
    assert [s.words for s in data.sentences] == [("The", "dog")]
    assert data.skipped == dict.fromkeys(TREES, 1)
    assert len(read_conllu(files / "trees.conllu")) == 1


def test_roles_report_the_trees_left_out(
    files: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """headlab roles counts the sentences its reader left out in the JSON's skips, by reason,
    beside those the model could not align."""
    import json

    from headlab.models.names import bundled_model_path

    monkeypatch.chdir(files)
    model = str(bundled_model_path("tiny-shakespeare"))
    argv = ["roles", "--model", model, "--treebank", "trees.conllu", "--no-gap", "--json"]
    assert main([*argv, "--replicates", "0", "--device", "cpu"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]["treebank"]
    assert data["sentences"] == 1 + len(TREES)
    for reason in TREES:
        assert data["skipped"][reason] == 1
    assert data["used"] + sum(data["skipped"].values()) == data["sentences"]


def test_gap_rows_pronoun_as_candidate_skipped_and_line_separator_kept(files: Path) -> None:
    from headlab.datasets import read_gap

    gap = read_gap(files / "gap.tsv")
    assert [e.id for e in gap.examples] == ["ok-1"]  # one row, U+2028 and all
    assert "\u2028" in gap.examples[0].text
    assert gap.skipped["pronoun span is a candidate's"] == 1


def test_torch_key_padding_mask_gives_torch_answer() -> None:
    """Code ported from torch.nn.MultiheadAttention, padding mask and all, gives torch's output
    (the old meaning was inverted: errors of order 1)."""
    from headlab.attention import MultiHeadAttention

    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(theirs).eval()
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])  # torch: True = pad
    expected, _ = theirs(x, x, x, key_padding_mask=pad)
    torch.testing.assert_close(ours(x, key_padding_mask=pad), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours(x, key_mask=~pad), expected, atol=1e-5, rtol=0)


def test_experiment_data_default_is_beside_the_checkout_not_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headlab.errors import InputError
    from headlab.experiments.one_vs_many import default_data

    monkeypatch.chdir(tmp_path)
    checkout = Path(default_data.__code__.co_filename).resolve().parents[3]
    expected = (checkout / ".." / "shared" / "data").resolve()
    if expected.is_dir():
        assert default_data() == expected
    else:
        with pytest.raises(InputError, match="pass --data"):
            default_data()
