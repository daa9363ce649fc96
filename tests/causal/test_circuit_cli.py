"""``headlab circuit`` end to end on a tiny random Llama (GQA), and on a post-norm Gemma 3: the
JSON a user reads, the page it draws (in Chromium), and bad input refused in one line before
any model is loaded."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tests.causal.test_patch_cli import PROMPTS, _fails, _jsonl, corruptions
from tests.models.tiny import build

from headlab.causal.graph import build_graph
from headlab.cli import main
from headlab.experiments.head_classes import CLASSES
from headlab.models.loading import load

HELD_OUT = [
    {
        "clean": "When Lisa and Mark went to the park, Mark gave a book to",
        "corrupt": "When Emma and Paul went to the park, Tom gave a book to",
        "answer": " Lisa",
        "distractor": " Mark",
    },
    {
        "clean": "Then, Mark and Lisa had a long walk, and afterwards Lisa said to",
        "corrupt": "Then, Paul and Emma had a long walk, and afterwards Tom said to",
        "answer": " Mark",
        "distractor": " Lisa",
    },
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, Path]:
    tmp = tmp_path_factory.mktemp("circuit")
    folder = build("llama", tmp / "llama", lm_head=True, seed=5)
    found, held = _jsonl(tmp / "find.jsonl", PROMPTS), _jsonl(tmp / "held.jsonl", HELD_OUT)
    page = tmp / "circuit.html"
    argv = ["-q", "circuit", "--model", str(folder), "--prompts", str(found)]
    argv += ["--eval-prompts", str(held), "--json", "--html", str(page), "--method", "eap"]
    argv += ["--figure", str(tmp / "circuit.png")]
    roles = tmp / "roles.json"  # headlab roles' verdicts, evidence beside the prompts' attention
    heads = [{"layer": 0, "head": h, "role": r} for h, r in ((1, "induction"), (2, "unclassified"))]
    roles.write_text(json.dumps({"schema": "headlab.roles/2", "model": "llama", "heads": heads}))
    argv += ["--roles", str(roles)]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return folder, json.loads(out.getvalue()), page


def test_the_json_has_the_curve_the_circuit_and_its_classes(run) -> None:
    folder, data, _ = run
    graph = build_graph(load(folder, with_lm_head=True))
    assert data["schema"] == "headlab.circuit/1" and data["edges_total"] == graph.n_edges
    assert (data["n_prompts"], data["n_eval_prompts"], data["method"]) == (2, 2, "eap")
    curve = data["curve"]
    assert [p["edges"] for p in curve] == sorted(p["edges"] for p in curve)
    assert curve[-1]["edges"] == graph.n_edges and curve[-1]["faithfulness"] == pytest.approx(1.0)
    assert curve[0]["edges"] == 1
    chosen = data["circuit"]
    assert chosen in curve and len(data["edges"]) == chosen["edges"]
    reached = [p for p in curve if p["faithfulness"] >= 0.8]
    assert chosen["edges"] == min(p["edges"] for p in reached)  # the smallest reaching 80%
    assert data["smallest"]["0.8"] == chosen
    names = {n["name"] for n in data["nodes"]}
    assert "logits" in names and all(e["sender"] in names for e in data["edges"])
    assert all(
        e["sender"] in graph.senders and e["receiver"] in graph.receivers for e in data["edges"]
    )
    scores = [abs(e["score"]) for e in data["edges"]]
    assert scores == sorted(scores, reverse=True)
    heads = {(h["layer"], h["head"]) for h in data["heads"]}
    assert heads == {(n["layer"], n["head"]) for n in data["nodes"] if n["kind"] == "head"}
    assert set(data["classes"]) <= set(CLASSES)
    assert sum(len(v) for v in data["classes"].values()) == len(heads)
    for h in data["heads"]:  # the evidence behind each class, measured on these IOI prompts
        assert {"dla", "copying", "end_to_io", "end_to_s", "s2_to_s1", "previous"} <= set(h)
    assert data["class_rules"]["name mover"].startswith("direct logit attribution > 0")
    assert data["roles_from"].endswith("roles.json")
    by_head = {(h["layer"], h["head"]): h for h in data["heads"]}
    if (0, 1) in by_head:  # roles names it an induction head: that class, unless an IOI one
        assert by_head[(0, 1)]["role"] == "induction"
        assert by_head[(0, 1)]["class"] in (
            "name mover",
            "negative name mover",
            "s-inhibition",
            "induction",
        )
    assert all(h["role"] in (None, "induction") for h in data["heads"])


def test_the_page_draws_the_circuit_offline(run, browser) -> None:
    _, data, page = run
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(str(e)))
    requests: list[str] = []
    tab.on("request", lambda r: requests.append(r.url))
    tab.goto(page.as_uri())
    tab.wait_for_selector("body[data-ready='1']")
    heads = [n for n in data["nodes"] if n["kind"] == "head"]
    circles = [n for n in data["nodes"] if n["kind"] != "mlp"]  # heads, embeddings, logits
    assert tab.locator("#graph circle[data-class]").count() == len(circles)
    for n in heads:
        mark = tab.locator(f"#graph [data-node='{n['name']}']")
        assert mark.get_attribute("data-class") == n["class"]
    lines = tab.locator("#graph line[data-edge]")
    assert lines.count() >= min(len(data["edges"]), 400)
    widths = [
        float(w)
        for w in tab.eval_on_selector_all(
            "#graph line[data-edge]", "ls => ls.map(l => l.getAttribute('stroke-width'))"
        )
    ]
    assert max(widths) > 3 * min(widths)  # width follows |score|
    assert tab.locator("#curve circle").count() == len([p for p in data["curve"] if p["edges"] > 0])
    assert f"{data['circuit']['edges']} of {data['edges_total']} edges" in tab.text_content(
        "#summary"
    )
    assert errors == [] and all(u.startswith("file:") for u in requests)
    tab.close()


def test_bad_input_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    found = _jsonl(tmp_path / "find.jsonl", PROMPTS)
    base = ["circuit", "--model", str(tmp_path / "missing")]
    assert "add --eval-prompts" in _fails([*base, "--prompts", str(found)], capsys)
    line = _fails(
        [*base, "--prompts", str(found), "--eval-prompts", str(found), "--html", "x.png"], capsys
    )
    assert "--html x.png: expected a .html file" in line
    broken = _jsonl(tmp_path / "bad.jsonl", ["{not json"])
    line = _fails([*base, "--prompts", str(found), "--eval-prompts", str(broken)], capsys)
    assert "bad.jsonl" in line
    not_roles = tmp_path / "not-roles.json"
    not_roles.write_text(json.dumps({"model": "m", "edges": []}))
    args = [*base, "--prompts", str(found), "--eval-prompts", str(found), "--roles"]
    line = _fails([*args, str(not_roles)], capsys)
    assert "not-roles.json" in line and "headlab roles --json" in line
    for flag, value in (("--target", "1.5"), ("--sizes", "ten")):
        assert main(["circuit", flag, value]) == 2  # argparse's usage error
        assert f"argument {flag}: expected" in capsys.readouterr().err


def test_each_class_follows_its_stated_rule() -> None:
    """The rules the JSON states, applied to measured evidence in the order stated."""
    import torch

    from headlab.experiments.head_classes import classify

    def grid(values: dict) -> torch.Tensor:
        t = torch.zeros(1, 8, dtype=torch.float64)
        for h, v in values.items():
            t[0, h] = v
        return t

    dla = grid({0: 2.0, 1: -1.0, 2: 0.05, 3: 1.0})
    copying = grid({0: 0.9, 3: 0.2})  # head 3 attends to the IO but does not copy it
    attention = {
        "end_to_io": grid({0: 0.6, 1: 0.5, 3: 0.5}),
        "end_to_s": grid({0: 0.1, 1: 0.2, 2: 0.7, 3: 0.1}),
        "s2_to_s1": grid({5: 0.5}),
        "s2_to_after_s1": grid({4: 0.45}),
        "previous": grid({6: 0.8, 7: 0.35}),
    }
    paths = grid({2: 0.1, 4: 0.02})
    heads = [(0, h) for h in range(8)]
    got = {
        h: info["class"] for (_, h), info in classify(heads, dla, copying, attention, paths).items()
    }
    # headlab roles' verdict is evidence too: 7 becomes a previous-token head; 2 stays an
    # S-inhibition head, the IOI rules being checked first
    roles = {(0, 7): "previous-token", (0, 2): "induction"}
    with_roles = classify(heads, dla, copying, attention, paths, roles)
    assert with_roles[(0, 7)]["class"] == "previous token"
    assert with_roles[(0, 7)]["role"] == "previous-token"
    assert with_roles[(0, 2)]["class"] == "s-inhibition"
    assert got == {
        0: "name mover",
        1: "negative name mover",
        2: "s-inhibition",
        3: "unexplained",  # positive DLA, looks at the IO, copies nothing: no name mover
        4: "induction",  # its path is 0.2 of the largest, under the 0.3 asked
        5: "duplicate token",
        6: "previous token",
        7: "unexplained",  # 0.35 to the previous token, under 0.4
    }


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_name_copying_matches_an_eager_oracle(family: str, tmp_path: Path, monkeypatch) -> None:
    """Wang et al.'s copying score as headlab measures it: the head's value at the indirect
    object through its output columns, the final norm's gain and the unembedding (in Gemma
    also the gain of the norm on the attention's output, and each gain is ``1 + g``); the
    oracle reads the value projection's output by hook on HF's own modules."""
    import torch

    from headlab.causal.patching import as_task
    from headlab.experiments import head_classes
    from headlab.experiments.head_classes import answer_positions, name_copying

    # a random model ranks no name in its top 5 of 30,522: half the vocabulary makes it a coin
    monkeypatch.setattr(head_classes, "TOP_LOGITS", 15_000)

    folder = build(
        family, tmp_path / "m", lm_head=True, seed=5, attn_implementation="eager",
        random_gains=True,
    )  # fmt: skip
    lm = load(folder, with_lm_head=True)
    task = as_task(lm, PROMPTS)
    heads = [(layer, head) for layer in range(2) for head in range(4) if (layer, head) != (0, 1)]
    got = name_copying(lm, task, heads)
    assert 0 < float(got.nan_to_num(0).sum()) < len(heads)  # some hits, not all
    model, d = lm.model, lm.head_dim
    n_kv_group = model.config.num_attention_heads // model.config.num_key_value_heads
    for layer, head in heads:
        seen: dict[str, torch.Tensor] = {}
        attn = model.model.layers[layer].self_attn

        def keep(m, a, o, seen=seen):  # type: ignore[no-untyped-def]
            seen["v"] = o.detach()

        hook = attn.v_proj.register_forward_hook(keep)
        hits = 0
        for batch in task.batches:
            with torch.no_grad():
                model(input_ids=batch.clean)
            for b in range(batch.clean.shape[0]):
                io, _, _ = answer_positions(
                    batch.clean[b].tolist(), int(batch.answer[b]), int(batch.distractor[b])
                )
                g = head // n_kv_group
                v = seen["v"][b, io, g * d : (g + 1) * d]
                out = attn.o_proj.weight[:, head * d : (head + 1) * d] @ v
                if family == "gemma3":
                    post = model.model.layers[layer].post_attention_layernorm
                    out = out * (1 + post.weight) * (1 + model.model.norm.weight)
                else:
                    out = out * model.model.norm.weight
                top = (model.lm_head.weight @ out).topk(15_000).indices
                hits += int(int(batch.answer[b]) in top.tolist())
        hook.remove()
        assert float(got[layer, head]) == pytest.approx(hits / task.n_prompts)
    assert torch.isnan(got[0, 1])  # not asked: not measured


def test_the_report_draws_the_circuit(run, browser, tmp_path: Path, capsys) -> None:
    """``headlab report --circuit``: the graph as a figure of the report, seen in Chromium;
    ``--figure`` the same PNG; a file that is not a circuit, or a circuit of another model,
    refused before any measurement."""
    folder, data, page = run
    assert (page.parent / "circuit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = tmp_path / "circuit.json"
    result.write_text(json.dumps(data))
    out = tmp_path / "report"
    report = ["-q", "report", "--out", str(out), "--limit", "8", "--replicates", "0", "--no-gap"]
    report.append("--roles-only")
    # the default model (MiniLM) is not the one the circuit was found in: refused, nothing written
    line = _fails([*report, "--circuit", str(result)], capsys)
    assert "--circuit: measured on" in line and "the report is of" in line
    assert not out.exists()
    report += ["--model", str(folder)]
    assert main([*report, "--circuit", str(result)]) == 0
    capsys.readouterr()
    html = (out / "index.html").read_text()
    c = data["circuit"]
    assert 'src="figures/circuit.png"' in html
    assert f"{c['edges']} of {data['edges_total']} edges keep" in html
    tab = browser.new_page()
    tab.goto((out / "index.html").as_uri())
    width = tab.eval_on_selector(
        "img[src='figures/circuit.png']", "i => i.complete && i.naturalWidth"
    )
    assert width > 300
    tab.close()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": "m", "edges": []}))
    line = _fails([*report, "--out", str(tmp_path / "r2"), "--circuit", str(bad)], capsys)
    assert "expected the JSON of headlab circuit --json" in line and str(bad) in line
    assert not (tmp_path / "r2").exists()


def test_flags_that_would_be_ignored_are_refused(tmp_path: Path, capsys) -> None:
    """Before any model is loaded: an output path that is a folder, and flags that have no
    effect with the others given."""
    found = _jsonl(tmp_path / "find.jsonl", PROMPTS)
    base = ["circuit", "--model", str(tmp_path / "missing"), "--prompts", str(found)]
    base += ["--eval-prompts", str(found)]
    (tmp_path / "page.html").mkdir()
    line = _fails([*base, "--html", str(tmp_path / "page.html")], capsys)
    assert "is a folder" in line
    cases = {
        "--n": ["--n", "8"],
        "--eval-n": ["--eval-n", "8"],
        "--steps": ["--method", "eap", "--steps", "3"],
        "--roles": ["--no-classes", "--roles", str(found)],
        "--mask-edges": ["--mask-edges", "10"],
        "--mask-steps": ["--search", "top", "--mask-steps", "10"],
    }
    for flag, extra in cases.items():
        line = _fails([*base, *extra], capsys)
        assert line.startswith(f"error: {flag} has no effect here") or f"{flag} has no" in line


def _circuit(argv: list[str], capsys) -> tuple[dict, str]:
    assert main(["-q", "circuit", "--json", *argv]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def _said(err: str) -> list[str]:
    """stderr's lines but the same-sign warnings, which the prompts above get in the random
    model (#58: their clean and corrupted runs both prefer the distractor, slightly)."""
    return [line for line in err.splitlines() if "the same sign" not in line]


def test_a_target_no_circuit_reaches_is_said(run, tmp_path: Path, capsys) -> None:
    """One-edge circuits cannot keep all of the logit difference: the most faithful is kept,
    the JSON says it did not reach the target and stderr says why; --no-classes names no head
    (rather than calling every head unexplained)."""
    folder = run[0]
    found, held = _jsonl(tmp_path / "f.jsonl", PROMPTS), _jsonl(tmp_path / "h.jsonl", HELD_OUT)
    argv = ["--model", str(folder), "--prompts", str(found), "--eval-prompts", str(held)]
    argv += ["--method", "eap", "--no-classes"]
    data, err = _circuit([*argv, "--sizes", "1,2", "--target", "1.0"], capsys)
    best = max(p["faithfulness"] for p in data["curve"])
    assert data["reached"] is False and data["circuit"]["faithfulness"] == best < 1.0
    assert "no circuit measured reaches 100%" in err and "kept the most faithful" in err
    assert data["classes"] == {} and all(h["class"] is None for h in data["heads"])
    assert all(n["class"] is None for n in data["nodes"])
    from headlab.experiments.circuit import circuit_text  # what is printed without --json

    parts = circuit_text(data, top=3)
    printed = " ".join(p for p in parts if isinstance(p, str))
    assert f"the circuit kept: {data['circuit']['edges']} of {data['edges_total']} edges" in printed
    out = data["left_out"]  # a two-edge circuit leaves out most heads: those said are printed
    assert out and all(f"{h['layer']}.{h['head']} {h['effect']:+.2f}" in printed for h in out)
    edges = next(p for p in parts if not isinstance(p, str) and p.columns[0] == "sender")
    assert [r[0] for r in edges.rows] == [e["sender"] for e in data["edges"][:3]]
    data, err = _circuit([*argv, "--target", "0.8"], capsys)  # the full graph is in the curve
    assert data["reached"] is True and data["circuit"]["faithfulness"] >= 0.8
    assert _said(err) == []
    assert all(p["faithfulness"] != 0 or str(p["faithfulness"]) == "0.0" for p in data["curve"])


def test_clean_and_corrupted_prompts_of_the_same_sign_are_warned_of(
    run, tmp_path: Path, capsys
) -> None:
    """#58: discovery or held-out prompts whose clean and corrupted logit differences have the
    same sign (signs from a transformers oracle) are warned of in one line each, naming which
    prompts and what can exceed 1, as headlab patch warns (the one gap_warning); nothing is said
    of prompts of opposite signs."""
    folder = run[0]
    clean, same, other, ld = corruptions(folder)
    capsys.readouterr()  # transformers' loading bar of the oracle
    same_file = _jsonl(tmp_path / "same.jsonl", [{**PROMPTS[0], "corrupt": same}])
    other_file = _jsonl(tmp_path / "other.jsonl", [{**PROMPTS[0], "corrupt": other}])
    base = ["--model", str(folder), "--method", "eap", "--no-classes", "--sizes", "1,2"]
    cases = {  # (discovery, held-out) -> the prompts warned of
        (same_file, other_file): ["discovery"],
        (other_file, same_file): ["held-out"],
        (other_file, other_file): [],
    }
    for (found, held), warned in cases.items():
        argv = [*base, "--prompts", str(found), "--eval-prompts", str(held)]
        data, err = _circuit([*argv, "--target", "0.01"], capsys)
        corrupt = ld(same if "discovery" in warned else other)
        assert data["clean"] == pytest.approx(clean, abs=1e-3)
        assert data["corrupt"] == pytest.approx(corrupt, abs=1e-3)
        lines = [line for line in err.splitlines() if "warning" in line]
        assert len(lines) == len(warned), err
        for line, which in zip(lines, warned, strict=True):
            assert line.startswith(f"headlab circuit: warning: the {which} clean and corrupted ")
            assert "the same sign" in line and "can exceed 1" in line
        others = [line for line in err.splitlines() if line not in lines]
        assert all(line.startswith("headlab circuit: no circuit measured") for line in others)


def test_prompts_that_cannot_find_a_circuit_are_refused(run, tmp_path: Path, capsys) -> None:
    """Discovery prompts whose corruption changes nothing (every score would be 0), and sizes
    beyond the graph, are refused in one line before any scoring."""
    folder = run[0]
    same = [{**p, "corrupt": p["clean"]} for p in PROMPTS]
    found, held = _jsonl(tmp_path / "same.jsonl", same), _jsonl(tmp_path / "h.jsonl", HELD_OUT)
    base = ["circuit", "--model", str(folder), "--method", "eap", "--no-classes"]
    line = _fails([*base, "--prompts", str(found), "--eval-prompts", str(held)], capsys)
    assert "every corrupted prompt equals its clean one" in line
    line = _fails([*base, "--prompts", str(held), "--eval-prompts", str(found)], capsys)
    assert "every corrupted prompt equals its clean one" in line
    total = build_graph(load(folder, with_lm_head=True)).n_edges
    argv = [*base, "--prompts", str(held), "--eval-prompts", str(held)]
    line = _fails([*argv, "--sizes", f"10,{total + 1}"], capsys)
    assert (
        line == f"headlab: error: --sizes {total + 1}: a circuit has 0..{total} edges in this model"
    )
    line = _fails([*argv, "--sizes", "0"], capsys)  # a 0-edge "circuit" is no circuit (#59)
    assert line.startswith("headlab: error: --sizes: a circuit keeps at least one edge")


def test_a_corrupt_config_is_said_to_be_corrupt(tmp_path: Path, capsys) -> None:
    """#59: a config.json that is not JSON is reported as such by patch and circuit, not as
    "not a causal language model"."""
    folder = build("llama", tmp_path / "llama", lm_head=True, seed=5)
    (folder / "config.json").write_text('{"model_type": "llama",', encoding="utf-8")
    for command in ("patch", "circuit"):
        line = _fails([command, "--model", str(folder)], capsys)
        assert "not a causal language model" not in line and "config.json" in line, line


def test_roles_of_another_layout_are_refused(tmp_path: Path) -> None:
    """A roles run must be of the model's heads: its layout, heads inside it, known roles."""
    from headlab.errors import InputError
    from headlab.experiments.head_classes import roles_by_head

    def run_of(heads: list, layout: list[int] | None = None) -> dict:
        data = {"schema": "headlab.roles/2", "model": "m", "heads": heads}
        return data if layout is None else {**data, "heads_in_layer": layout}

    ok = [{"layer": 1, "head": 3, "role": "induction"}, {"layer": 0, "head": 0, "role": "broad"}]
    ok.append({"layer": 0, "head": 1, "role": "unclassified"})
    assert roles_by_head(run_of(ok, [4, 4]), [4, 4]) == {(1, 3): "induction", (0, 0): "broad"}
    with pytest.raises(InputError, match=r"heads per layer \[12, 12\], the model has \[4, 4\]"):
        roles_by_head(run_of(ok, [12, 12]), [4, 4])
    with pytest.raises(InputError, match=r"head 1\.3 is not in the model"):
        roles_by_head(run_of(ok), [4, 2])
    with pytest.raises(InputError, match="has role 'name mover', expected one of"):
        roles_by_head(run_of([{"layer": 0, "head": 0, "role": "name mover"}]), [4, 4])


def test_the_help_says_the_library_default_of_steps() -> None:
    from headlab.causal.metric import IG_STEPS
    from headlab.cli import _causal

    assert _causal.IG_STEPS == IG_STEPS  # repeated in the CLI: --help imports no torch


def test_a_post_norm_decoder_runs_end_to_end(tmp_path: Path, capsys) -> None:
    """``headlab circuit`` on a tiny random Gemma 3 (norms on the sublayers' outputs, a norm
    on each head's queries and keys, sliding-window layers), head classes measured: the whole
    graph keeps all of the logit difference (float32)."""
    folder = build("gemma3", tmp_path / "gemma3", lm_head=True, seed=5, random_gains=True)
    graph = build_graph(load(folder, with_lm_head=True))
    assert all(b.attention_out is not None for b in graph.blocks)
    found, held = _jsonl(tmp_path / "f.jsonl", PROMPTS), _jsonl(tmp_path / "h.jsonl", HELD_OUT)
    argv = ["--model", str(folder), "--prompts", str(found), "--eval-prompts", str(held)]
    data, _ = _circuit([*argv, "--method", "eap-ig", "--steps", "2"], capsys)
    assert data["edges_total"] == graph.n_edges
    curve = data["curve"]
    assert curve[-1]["edges"] == graph.n_edges
    assert curve[-1]["faithfulness"] == pytest.approx(1.0, abs=1e-4)
    assert all(math.isfinite(e["score"]) for e in data["edges"])
    assert set(data["classes"]) <= set(CLASSES)


def test_the_learned_search_measures_the_order_its_masks_give(run, tmp_path: Path, capsys) -> None:
    """#59: ``--search learned`` learns a mask per edge on the discovery prompts and measures
    the first edges of the order it gives on the held-out ones: the JSON says the masks'
    target and steps, the full graph is the clean model, and a target beyond the graph is one
    line before any scoring."""
    from headlab.causal.circuit import circuit_logit_differences
    from headlab.causal.cut import curve_sizes, first_edges, reaching_logits
    from headlab.causal.learned import MaskOptions, learn_masks, learned_order
    from headlab.causal.tasks import encode_task, read_prompts

    folder = run[0]
    found, held = _jsonl(tmp_path / "f.jsonl", PROMPTS), _jsonl(tmp_path / "h.jsonl", HELD_OUT)
    argv = ["--model", str(folder), "--prompts", str(found), "--eval-prompts", str(held)]
    argv += ["--method", "eap", "--no-classes", "--search", "learned"]
    page = tmp_path / "learned.html"
    data, err = _circuit(
        [*argv, "--mask-edges", "20", "--mask-steps", "30", "--html", str(page)], capsys
    )
    assert _said(err) == [f"wrote {page}"] and page.is_file()
    assert data["search"] == "learned"
    assert data["masks"]["target"] == 20 and data["masks"]["steps"] == 30
    assert data["curve"][-1] == {"edges": data["edges_total"], "faithfulness": 1.0}
    # the same masks, learned again by the library, give the same curve
    from headlab.models import load

    lm = load(folder, with_lm_head=True)
    graph = build_graph(lm)
    small = encode_task(lm.tokenizer, read_prompts(found), batch=8)
    order = learned_order(graph, learn_masks(lm, graph, small, MaskOptions(target=20, steps=30)))
    sizes = [p["edges"] for p in data["curve"]]
    asked = curve_sizes(graph.n_edges)[:3]
    circuits = [reaching_logits(graph, first_edges(graph, order, n)) for n in asked]
    lds, clean, corrupt = circuit_logit_differences(
        lm, graph, encode_task(lm.tokenizer, read_prompts(held)), circuits
    )
    assert [int(c.sum()) for c in circuits] == sizes[:3]
    for point, ld in zip(data["curve"][:3], lds, strict=True):
        assert point["faithfulness"] == pytest.approx((ld - corrupt) / (clean - corrupt), abs=1e-4)
    line = _fails(["circuit", *argv, "--mask-edges", "999999"], capsys)
    assert "--mask-edges 999999" in line and "edges" in line


def test_the_learned_search_refuses_prompts_whose_runs_would_not_fit(
    run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """#58: ``--search learned`` keeps every sender's output of every corrupted prompt; the
    bytes it plans are those an edge run records (the oracle), and prompts whose runs would not
    fit the memory available are refused in one line before any run."""
    import headlab.causal.learned as learned
    from headlab.causal.edges import EdgeRun
    from headlab.causal.learned import MaskOptions, kept_bytes, learn_masks
    from headlab.causal.tasks import encode_task, parse_prompt
    from headlab.errors import InputError

    lm = load(run[0], with_lm_head=True)
    graph = build_graph(lm)
    task = encode_task(lm.tokenizer, [parse_prompt(p) for p in PROMPTS], batch=8)
    recorded = 0
    for batch in task.batches:
        with EdgeRun(lm, graph) as edge_run:
            lm.model(batch.corrupt)
        recorded += edge_run.values.numel() * edge_run.values.element_size()
    assert kept_bytes(lm, graph, task) == recorded

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a run started")

    monkeypatch.setattr(learned, "available_bytes", lambda device: recorded)  # 80% < recorded
    monkeypatch.setattr(learned, "EdgeRun", no_run)
    with pytest.raises(InputError) as info:
        learn_masks(lm, graph, task, MaskOptions(target=20, steps=2))
    line = str(info.value)
    assert line.startswith("--n/--prompts: the learned search keeps every sender's output")
    assert f"each of the {len(PROMPTS)} corrupted prompts" in line
    assert line.endswith("at most about 1 prompts fit")  # 80% of two prompts' runs: one
    found, held = _jsonl(tmp_path / "f.jsonl", PROMPTS), _jsonl(tmp_path / "h.jsonl", HELD_OUT)
    argv = ["circuit", "--model", str(run[0]), "--prompts", str(found), "--eval-prompts"]
    argv += [str(held), "--method", "eap", "--no-classes", "--search", "learned"]
    assert "the learned search keeps every sender's output" in _fails(argv, capsys)
