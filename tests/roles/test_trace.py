"""``headlab heads --trace``: a word's dependents and the heads that carry its attention to them,
against an independent oracle (HF eager attentions, word weights by loops over subword tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.models.tiny import build

from headlab.cli import main
from headlab.datasets import TreebankSentence
from headlab.datasets.lesson import LESSON_SENTENCE
from headlab.models import load
from headlab.roles.results import RelationRow
from headlab.roles.trace import check_text, lesson_parse, trace_word

#: a sentence whose word "cooked" has four dependents, one of them split into word pieces
CONLLU = """# sent_id = tiny-1
# text = Yesterday the unbelievably patient chef cooked fish slowly .
1\tYesterday\tyesterday\tNOUN\tNN\t_\t6\tobl:tmod\t_\t_
2\tthe\tthe\tDET\tDT\t_\t5\tdet\t_\t_
3\tunbelievably\tunbelievably\tADV\tRB\t_\t4\tadvmod\t_\t_
4\tpatient\tpatient\tADJ\tJJ\t_\t5\tamod\t_\t_
5\tchef\tchef\tNOUN\tNN\t_\t6\tnsubj\t_\t_
6\tcooked\tcook\tVERB\tVBD\t_\t0\troot\t_\t_
7\tfish\tfish\tNOUN\tNN\t_\t6\tobj\t_\t_
8\tslowly\tslowly\tADV\tRB\t_\t6\tadvmod\t_\t_
9\t.\t.\tPUNCT\t.\t_\t6\tpunct\t_\t_

"""
SECOND = """# sent_id = tiny-2
1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_
2\t.\t.\tPUNCT\t.\t_\t1\tpunct\t_\t_

"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load(build("bert", tmp_path_factory.mktemp("bert-trace"), seed=3))


@pytest.fixture(scope="module")
def eager(tiny: Any) -> Any:
    from transformers import AutoModel

    return AutoModel.from_pretrained(
        str(tiny.path), local_files_only=True, attn_implementation="eager"
    ).eval()


def _oracle_rows(eager: Any, tokenizer: Any, words: list[str], word: int) -> dict[str, Any]:
    """Word ``word``'s word-level attention in every head, from HF eager attentions and loops:
    to a word, the sum over its tokens; from a word, the mean over its tokens (headlab's
    definition), special tokens words of their own. Returns ``{"rows": (L*H, W), "columns":
    parse word -> column, "special": flags}``."""
    text = " ".join(words)
    starts, pos = [], 0
    for w in words:
        starts.append((pos, pos + len(w)))
        pos += len(w) + 1
    enc = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    with torch.no_grad():
        out = eager(
            input_ids=torch.tensor([enc["input_ids"]]),
            attention_mask=torch.tensor([enc["attention_mask"]]),
            output_attentions=True,
            token_type_ids=torch.zeros(1, len(enc["input_ids"]), dtype=torch.long),
        )
    att = np.stack([a[0].double().numpy() for a in out.attentions])  # (L, H, T, T)
    owner, special, column = [], [], {}
    for (a, _b), sp in zip(enc["offset_mapping"], enc["special_tokens_mask"], strict=True):
        if sp:
            special.append(True)
            owner.append(len(special) - 1)
            continue
        k = next(i for i, (s, e) in enumerate(starts) if s <= a < e)
        if k not in column:
            special.append(False)
            column[k] = len(special) - 1
        owner.append(column[k])
    n_layers, n_heads, n_tokens, _ = att.shape
    rows = np.zeros((n_layers * n_heads, len(special)))
    mine = [t for t in range(n_tokens) if owner[t] == column[word]]
    for layer in range(n_layers):
        for h in range(n_heads):
            for t in mine:
                for s in range(n_tokens):
                    rows[layer * n_heads + h, owner[s]] += att[layer, h, t, s] / len(mine)
    return {"rows": rows, "columns": column, "special": special, "n_heads": n_heads}


def _row(relation: str, layer: int, head: int) -> RelationRow:
    return RelationRow(
        relation=relation,
        direction="head_to_dependent",
        layer=layer,
        head=head,
        accuracy=0.5,
        baseline=0.4,
        baseline_offset=-1,
        count=100,
    )


def _roles_json(path: Path, model: str, rows: list[RelationRow], layout: list[int]) -> Path:
    path.write_text(
        json.dumps(
            {
                "schema": "headlab.roles/2",
                "model": model,
                "heads_in_layer": layout,
                "relations": [vars(r) for r in rows],
            }
        ),
        encoding="utf-8",
    )
    return path


def test_trace_ranks_heads_as_eager_attention_does(tiny: Any, eager: Any, tmp_path: Path) -> None:
    (tmp_path / "one.conllu").write_text(CONLLU, encoding="utf-8")
    from headlab.roles.trace import choose_sentence

    sentence = choose_sentence(tmp_path / "one.conllu", None)
    table = [_row("nsubj", 1, 2), _row("obj", 0, 3), _row("advmod", 1, 0), _row("obl", 0, 1)]
    k = 3
    trace = trace_word(tiny, sentence, "cooked", table, k=k)
    oracle = _oracle_rows(eager, tiny.tokenizer, list(sentence.words), 5)
    rows, n_heads = oracle["rows"], oracle["n_heads"]
    self_column = oracle["columns"][5]
    # the dependents of "cooked", in order, with the parse's relations
    assert [(a.relation, a.dependent) for a in trace.arcs] == [
        ("obl:tmod", "Yesterday"),
        ("nsubj", "chef"),
        ("obj", "fish"),
        ("advmod", "slowly"),
        ("punct", "."),
    ]
    for arc in trace.arcs:
        weights = rows[:, oracle["columns"][arc.dependent_index]]  # (L*H,)
        best = sorted(range(len(weights)), key=lambda i: -weights[i])[:k]
        assert [(h.layer, h.head) for h in arc.top] == [divmod(i, n_heads) for i in best]
        for h in arc.top:
            assert h.weight == pytest.approx(weights[h.layer * n_heads + h.head], abs=1e-5)
        gold = {"obl:tmod": (0, 1), "nsubj": (1, 2), "obj": (0, 3), "advmod": (1, 0)}
        if arc.relation not in gold:
            assert arc.gold is None and arc.verdict == "no gold row"
            continue
        g = gold[arc.relation][0] * n_heads + gold[arc.relation][1]
        rank = 1 + sum(1 for w in weights if w > weights[g])
        assert arc.gold_rank == rank
        assert arc.verdict == ("agree" if rank <= k else "disagree")
        # the table counts the argmax with self and special tokens excluded
        allowed = [
            j
            for j in range(len(oracle["special"]))
            if not oracle["special"][j] and j != self_column
        ]
        target = max(allowed, key=lambda j: rows[g, j])
        assert arc.gold_hit == (target == oracle["columns"][arc.dependent_index])
    # obl:tmod has no row of its own: the table's obl row stands in, and says so
    assert trace.arcs[0].gold_relation == "obl"


def test_cli_trace_json_with_conllu_and_roles_file(
    tiny: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conllu = tmp_path / "two.conllu"
    conllu.write_text(CONLLU + SECOND, encoding="utf-8")
    layout = list(tiny.layout.heads_per_layer)
    roles = _roles_json(tmp_path / "roles.json", tiny.name, [_row("nsubj", 1, 2)], layout)
    args = ["heads", "--trace", "--model", str(tiny.path), "--conllu", str(conllu)]
    assert main([*args, "--sentence-id", "tiny-1", "--roles", str(roles), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "headlab.trace/1" and out["word"] == "cooked"  # the root
    assert out["heads_ranked"] == sum(layout)
    nsubj = next(a for a in out["arcs"] if a["relation"] == "nsubj")
    assert nsubj["gold"]["layer"] == 1 and nsubj["gold"]["head"] == 2
    assert nsubj["verdict"] in ("agree", "disagree")
    assert [a["verdict"] for a in out["arcs"] if a["relation"] != "nsubj"] == ["no gold row"] * 4
    # the table view names the same heads
    assert main([*args, "--sentence-id", "tiny-1", "--roles", str(roles), "--top", "2"]) == 0
    text = capsys.readouterr().out
    top = ", ".join(f"{h['layer']}.{h['head']} {h['weight']:.2f}" for h in nsubj["top"][:2])
    assert top in text


def test_cli_trace_measures_the_table_when_not_given(
    tiny: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --roles the table comes from the bundled sample: every relation of the lesson's
    parse that the sample has gets a gold head."""
    assert main(["heads", "--trace", "--model", str(tiny.path), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "bundled" in out["relation_table"] and "relation table" in captured.err
    assert out["word"] == "prepared"
    assert {a["relation"]: a["dependent"] for a in out["arcs"]} == {
        "nsubj": "chef",
        "obj": "fish",
        "advmod": "carefully",
        "punct": ".",
    }
    assert all(a["gold"] is not None for a in out["arcs"])


def test_trace_reads_the_table_that_headlab_roles_writes(
    tiny: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`headlab roles --json` output, fed back through --roles, gives each arc the table's
    head-to-dependent row for its relation."""
    model = ["--model", str(tiny.path)]
    assert main(["roles", *model, "--no-gap", "--replicates", "0", "--limit", "40", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    (tmp_path / "roles.json").write_text(json.dumps(table), encoding="utf-8")
    assert (
        main(["heads", "--trace", *model, "--roles", str(tmp_path / "roles.json"), "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    rows = {r["relation"]: r for r in table["relations"] if r["direction"] == "head_to_dependent"}
    assert any(arc["gold"] for arc in out["arcs"])
    for arc in out["arcs"]:
        row = rows.get(arc["relation"])
        if row is None:
            assert arc["gold"] is None
            continue
        assert (arc["gold"]["layer"], arc["gold"]["head"]) == (row["layer"], row["head"])
        assert arc["gold"]["accuracy"] == row["accuracy"]


def test_lesson_parse_spells_the_lesson_sentence() -> None:
    parse = lesson_parse()
    check_text(parse, LESSON_SENTENCE)  # raises if not
    deps = {
        parse.words[d]: r
        for d, (h, r) in enumerate(zip(parse.heads, parse.relations, strict=True))
        if h == 6
    }
    assert parse.words[6] == "prepared"
    assert deps == {"chef": "nsubj", "fish": "obj", "carefully": "advmod", ".": "punct"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--word", "dog"], "word 'dog' is not in the sentence"),
        (["--word", "the"], "'the' has no dependents"),
        (["--conllu", "{two}"], "has 2 sentences; choose one with --sentence-id"),
        (["--conllu", "{two}", "--sentence-id", "nope"], "no sentence with sent_id 'nope'"),
        (["Another sentence.", "--conllu", "{one}"], "do not spell the sentence"),
        (["--layer", "0"], "--layer and --head do not go with it"),
        (["--conllu", "{one}", "--spacy"], "does not go with --conllu"),
        (["--roles", "{other}"], "was measured on 'some-other-model'"),
        (["--roles", "{one}"], "not JSON"),
    ],
)
def test_trace_bad_input_is_one_line(
    tiny: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    paths = {
        "one": tmp_path / "one.conllu",
        "two": tmp_path / "two.conllu",
        "other": tmp_path / "other.json",
    }
    paths["one"].write_text(CONLLU, encoding="utf-8")
    paths["two"].write_text(CONLLU + SECOND, encoding="utf-8")
    _roles_json(paths["other"], "some-other-model", [_row("nsubj", 0, 0)], [4, 4])
    extra = [x.format(**{k: str(v) for k, v in paths.items()}) for x in extra]
    code = main(["heads", "--trace", "--model", str(tiny.path), *extra])
    err = capsys.readouterr().err
    assert code == 1 and message in err
    assert len(err.strip().splitlines()) == 1


def test_trace_options_need_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["heads", "--conllu", "x.conllu"]) == 1
    assert "--conllu goes with --trace" in capsys.readouterr().err


def test_missing_spacy_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from headlab.datasets import parse

    monkeypatch.setattr(parse, "_loaded", {})
    monkeypatch.setitem(sys.modules, "spacy", None)  # import spacy -> ImportError
    assert main(["heads", "--trace", "A sentence of my own."]) == 1
    err = capsys.readouterr().err.strip()
    assert "pip install 'headlab[parse]'" in err and "--conllu" in err
    assert len(err.splitlines()) == 1


def test_spacy_parse_of_the_lesson_sentence_matches_the_hand_parse_for_prepared() -> None:
    pytest.importorskip("spacy")
    from headlab.datasets.parse import parse_sentence, spacy_pipeline
    from headlab.errors import InputError

    try:
        spacy_pipeline()
    except InputError as exc:
        pytest.skip(str(exc))
    parsed = parse_sentence(LESSON_SENTENCE)
    hand = lesson_parse()
    assert parsed.words == hand.words

    def deps(s: TreebankSentence) -> dict[str, str]:
        return {
            s.words[d]: r
            for d, (h, r) in enumerate(zip(s.heads, s.relations, strict=True))
            if h == 6
        }

    # spaCy's dobj is UD's obj; "prepared" gets the same four dependents
    assert deps(parsed) == deps(hand)
    with pytest.raises(InputError, match="2 sentences"):
        parse_sentence("The chef cooked. The guests ate.")


@pytest.mark.slow
def test_minilm_lesson_trace_names_the_heads_eager_attention_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real MiniLM on the lesson's sentence: each dependent's top heads are the heads whose
    eager attention from "prepared" to it is largest, and the printed table names them."""
    from transformers import AutoModel

    from headlab.models import HeadCapture, encode, word_pattern
    from headlab.models.words import align

    minilm = load()
    table = [_row("nsubj", 2, 11), _row("obj", 3, 1), _row("advmod", 0, 2), _row("punct", 2, 9)]
    roles = _roles_json(tmp_path / "roles.json", minilm.name, table, [12] * 6)
    assert main(["heads", "--trace", "--roles", str(roles), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    eager = AutoModel.from_pretrained(
        str(minilm.path), local_files_only=True, attn_implementation="eager"
    ).eval()
    parse = lesson_parse()
    oracle = _oracle_rows(eager, minilm.tokenizer, list(parse.words), 6)
    rows = oracle["rows"]
    # the same arcs through headlab's own capture: the top head is the argmax over heads
    a = align(minilm.tokenizer, words=parse.words)
    with torch.inference_mode(), HeadCapture(minilm) as cap:
        minilm.model(**encode(minilm, [a.text]))
    captured = torch.stack(
        [word_pattern(cap.pattern(layer)[0], a)[:, a.plain_words[6]] for layer in range(6)]
    ).flatten(0, 1)  # (L*H, W)
    assert [arc["dependent"] for arc in out["arcs"]] == ["chef", "fish", "carefully", "."]
    for arc in out["arcs"]:
        column = oracle["columns"][arc["dependent_index"]]
        weights = rows[:, column]
        best = sorted(range(72), key=lambda i: -weights[i])[:3]
        assert [(h["layer"], h["head"]) for h in arc["top"]] == [divmod(i, 12) for i in best]
        top = arc["top"][0]
        assert int(captured[:, column].argmax()) == top["layer"] * 12 + top["head"]
        g = arc["gold"]["layer"] * 12 + arc["gold"]["head"]
        assert arc["gold"]["rank"] == 1 + int((weights > weights[g]).sum())
        assert arc["gold"]["weight"] == pytest.approx(weights[g], abs=1e-4)
    assert main(["heads", "--trace", "--roles", str(roles)]) == 0
    text = capsys.readouterr().out
    for arc in out["arcs"]:
        shown = ", ".join(f"{h['layer']}.{h['head']} {h['weight']:.2f}" for h in arc["top"])
        assert shown in text and arc["verdict"] in text
    # spaCy's parse, where installed, gives "prepared" the same arcs and so the same trace
    try:
        from headlab.datasets.parse import spacy_pipeline

        spacy_pipeline()
    except Exception:  # spaCy or its model missing: the hand parse was traced above
        return
    assert main(["heads", "--trace", "--spacy", "--roles", str(roles), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["arcs"] == out["arcs"]


def test_a_decoder_cannot_see_later_dependents_and_draws_no_verdict(tmp_path: Path) -> None:
    """A causal model's word attends to earlier words only: a later dependent gets weight 0
    from every head and the verdict 'unseen', never 'agree' by ties at zero."""
    from headlab.roles.trace import choose_sentence

    lm = load(build("gpt2", tmp_path / "gpt2", seed=4))
    assert lm.causal
    (tmp_path / "one.conllu").write_text(CONLLU, encoding="utf-8")
    sentence = choose_sentence(tmp_path / "one.conllu", None)
    table = [_row("nsubj", 1, 2), _row("obj", 0, 3), _row("advmod", 1, 0), _row("obl", 0, 1)]
    trace = trace_word(lm, sentence, "cooked", table, k=3)
    seen = {a.dependent: a.unseen for a in trace.arcs}
    assert seen == {"Yesterday": False, "chef": False, "fish": True, "slowly": True, ".": True}
    for arc in trace.arcs:
        if arc.unseen:
            assert arc.verdict == "unseen" and all(h.weight == 0.0 for h in arc.top)
            assert arc.to_json()["verdict"] == "unseen"
        else:
            assert arc.verdict in ("agree", "disagree", "no gold row")
            assert sum(h.weight for h in arc.top) > 0
