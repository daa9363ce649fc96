"""#59: the circuit as drawn (PNG and page). Each head's effect in the JSON is the attribution
patching ``headlab patch --method attribution`` measures on the same prompts; every head is
named, or the largest by |effect| and those a class names are and the rest are listed; hovering
a node shows its numbers; MLPs sit in their layers, not in one column; the red dot of the curve
is in its key; the heads the circuit leaves out are said."""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
from tests.causal.test_circuit_cli import HELD_OUT
from tests.causal.test_patch_cli import PROMPTS, _jsonl
from tests.models.tiny import build

from headlab.causal.figure import (
    CLASS_COLOURS,
    LABEL_ALL,
    LABEL_TOP,
    circuit_layout,
    labelled_heads,
    write_circuit,
)
from headlab.cli import main
from headlab.experiments.circuit import LEFT_OUT_ALL, LEFT_OUT_TOP, left_out
from headlab.page.circuit import circuit_html


def _json_of(argv: list[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return json.loads(out.getvalue())


def test_each_heads_effect_is_its_attribution_patching(tmp_path: Path) -> None:
    """The sum of a head's edge scores over the whole graph, as a share of the logit
    difference, is attribution patching of its output (gradient x difference, every path from
    it passes one of its edges): the node's ``effect`` equals ``headlab patch --method
    attribution`` on the same prompts, head by head."""
    folder = build("llama", tmp_path / "llama", lm_head=True, seed=5)
    found, held = _jsonl(tmp_path / "f.jsonl", PROMPTS), _jsonl(tmp_path / "h.jsonl", HELD_OUT)
    base = ["-q", "--model", str(folder), "--prompts", str(found), "--json"]
    circuit = _json_of(["circuit", *base, "--eval-prompts", str(held), "--method", "eap"])
    patch = _json_of(["patch", *base, "--method", "attribution"])
    expected = {f"{h['layer']}.{h['head']}": h["effect"] for h in patch["heads"]}
    got = {n["name"]: n["effect"] for n in circuit["nodes"] if n["kind"] == "head"}
    assert got and got.keys() <= expected.keys()
    for name, value in got.items():
        assert value == pytest.approx(expected[name], abs=2e-4), name
    for h in circuit["left_out"]:  # said with their attribution, never a head of the circuit
        name = f"{h['layer']}.{h['head']}"
        assert name not in got and h["effect"] == pytest.approx(expected[name], abs=2e-4)


def test_the_heads_left_out_are_all_said_when_few_else_the_strongest() -> None:
    effects = {"embed": 5.0, "mlp 0": 4.0, **{f"0.{h}": 0.1 * (h + 1) for h in range(30)}}
    kept = {f"0.{h}" for h in range(28)}  # 0.28 and 0.29, the two strongest, left out
    assert [(h["head"], h["rank"], h["of"]) for h in left_out(effects, kept)] == [
        (29, 1, 30),
        (28, 2, 30),
    ]
    few = {f"0.{h}" for h in range(14, 30)}  # 14 left out: only those in the top 20 are said
    assert LEFT_OUT_ALL < 14 and LEFT_OUT_TOP == 20
    # 0..13 left out, ranked 30..17: only 13..10 are in the top 20
    assert [h["head"] for h in left_out(effects, few)] == [13, 12, 11, 10]
    middle = {f"0.{h}" for h in range(30) if h not in range(8, 22)}  # 14 left out, 8..21
    assert [h["head"] for h in left_out(effects, middle)] == [
        21,
        20,
        19,
        18,
        17,
        16,
        15,
        14,
        13,
        12,
        11,
        10,
    ]


def _circuit(layers: int, heads: int, strong: dict[str, float], seed: int = 0) -> dict[str, Any]:
    """A circuit's JSON of ``layers`` x ``heads`` heads, all in it, small random effects but
    ``strong``; two heads named by a class; an MLP per layer; a few edges between them."""
    rng = random.Random(seed)
    names = [f"{la}.{h}" for la in range(layers) for h in range(heads)]
    effect = {n: round(rng.uniform(-0.01, 0.01), 4) for n in names} | strong
    classes = {"2.1": "name mover", "1.0": "induction"}
    effect |= dict.fromkeys(classes, 0.0)  # named by their class, not by their effect
    nodes: list[dict[str, Any]] = [
        {"name": "embed", "kind": "embed", "layer": None, "head": None, "class": None}
    ]
    for la in range(layers):
        nodes += [
            {"name": f"{la}.{h}", "kind": "head", "layer": la, "head": h, "effect": effect[f"{la}.{h}"],
             "class": classes.get(f"{la}.{h}", "unexplained")}
            for h in range(heads)
        ]  # fmt: skip
        nodes.append({"name": f"mlp {la}", "kind": "mlp", "layer": la, "head": None, "class": None})
    nodes.append({"name": "logits", "kind": "logits", "layer": None, "head": None, "class": None})
    edges = [{"sender": n, "receiver": "logits", "score": -effect[n]} for n in names[-heads:]]
    edges += [{"sender": f"mlp {la}", "receiver": f"q:{la + 1}.0", "score": 0.1} for la in range(3)]
    curve = [{"edges": 3, "faithfulness": 0.2}, {"edges": 30, "faithfulness": 0.85}]
    by_class: dict[str, list[list[int]]] = {}
    for n in names:
        by_class.setdefault(classes.get(n, "unexplained"), []).append(
            [int(n.split(".")[0]), int(n.split(".")[1])]
        )
    return {
        "schema": "headlab.circuit/1", "model": "m", "task": "ioi", "eval_task": "held",
        "n_prompts": 4, "n_eval_prompts": 4, "method": "eap-ig", "steps": 5, "clean": 3.0,
        "corrupt": -0.5, "edges_total": 500, "group_size": [3] * layers, "curve": curve,
        "circuit": curve[1], "reached": True, "target": 0.8, "nodes": nodes, "edges": edges,
        "classes": by_class, "class_rules": {}, "class_colours": CLASS_COLOURS,
        "heads": [
            {"layer": int(n.split(".")[0]), "head": int(n.split(".")[1]),
             "class": classes.get(n, "unexplained"), "dla": 4 * effect[n], "copying": 0.75,
             "end_to_io": 0.42, "role": None}
            for n in names
        ],
        "left_out": [{"layer": 7, "head": 7, "effect": 0.0031, "rank": 143, "of": 270}],
    }  # fmt: skip


#: SmolLM2's IOI heads of largest direct effect, left unlabelled before #59
STRONG = {"7.3": 0.55, "8.0": -0.23, "8.1": 0.31}


def test_the_largest_effects_are_named_and_the_rest_listed(tmp_path: Path, monkeypatch) -> None:
    """A circuit of more than LABEL_ALL heads: the LABEL_TOP of largest |effect| and the heads a
    class names carry their name on the drawing (the three strong unexplained heads among
    them), every other head is listed under it, as are the heads left out."""
    import matplotlib.axes

    data = _circuit(9, 9, STRONG)  # 81 heads
    assert LABEL_ALL < 81
    named, listed = labelled_heads(data)
    assert named[:3] == ["7.3", "8.1", "8.0"] and {"2.1", "1.0"} <= set(named)
    assert len(named) == LABEL_TOP + 2 and len(named) + len(listed) == 81
    assert not set(named) & set(listed)
    texts: list[str] = []
    real = matplotlib.axes.Axes.annotate
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "annotate",
        lambda self, text, *a, **k: (texts.append(text), real(self, text, *a, **k))[1],
    )
    labels: list[str] = []
    real_label = matplotlib.axes.Axes.set_xlabel
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "set_xlabel",
        lambda self, text, *a, **k: (labels.append(text), real_label(self, text, *a, **k))[1],
    )
    write_circuit(data, tmp_path / "c.png")
    assert set(texts) == set(named) | {"embed", "logits"}
    note = " ".join(labels).replace("\n", " ")
    assert f"unlabelled ({len(listed)}, by |effect|)" in note
    assert all(h in note for h in listed)
    assert "Not in the circuit: 7.7 (effect +0.00, 143rd of 270)" in note
    named, listed = labelled_heads(_circuit(3, 4, {"2.3": 0.5}))
    assert len(named) == 12 and named[0] == "2.3" and listed == []  # small: every head named


def test_mlps_sit_in_their_layers_not_one_column() -> None:
    pos = circuit_layout(_circuit(9, 9, STRONG))
    mlps = [pos[f"mlp {la}"] for la in range(9)]
    assert [y for _, y in mlps] == [la + 0.5 for la in range(9)]  # above their layer's heads
    assert len({x for x, _ in mlps}) == 3  # staggered, not one column
    assert all(0 <= x <= 8 for x, _ in mlps)  # among the heads, not beside them
    assert pos["7.3"] == (3.0, 7.0) and pos["logits"][1] == 9.0 and pos["embed"][1] == -1.0


@pytest.mark.slow
def test_the_page_shows_numbers_on_hover_and_keys_the_curve(browser: Any, tmp_path: Path) -> None:
    data = _circuit(9, 9, STRONG)
    page = tmp_path / "circuit.html"
    page.write_text(circuit_html(data), encoding="utf-8")
    tab = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    tab.on("console", lambda m: m.type == "error" and errors.append(m.text))
    tab.on("pageerror", lambda e: errors.append(str(e)))
    try:
        tab.goto(page.as_uri())
        tab.wait_for_selector("body[data-ready='1']")
        named, listed = labelled_heads(data)
        shown = tab.eval_on_selector_all(
            "#graph text.node-name", "ts => ts.map(t => t.textContent)"
        )
        assert set(shown) == set(named) | {"embed", "logits"}
        # hovering a node: its class, effect and evidence
        title = tab.locator("#graph [data-node='7.3'] title").text_content()
        assert "7.3 \u2014 unexplained" in title and "effect +0.550" in title
        assert (
            "direct logit attribution: 2.200" in title
            and "copies the indirect object: 0.750" in title
        )
        # MLPs drawn as squares in their layers, at three columns
        xs = tab.eval_on_selector_all(
            "#graph rect[data-node]", "rs => rs.map(r => r.getAttribute('x'))"
        )
        assert len(xs) == 9 and len(set(xs)) == 3
        # the curve's red dot is in its key, with the circuit kept
        kept = tab.locator("#curve circle[fill='#d62728']")
        assert kept.count() == 1 and kept.get_attribute("data-edges") == "30"
        key = tab.locator("#curve-key span.kept")
        assert (
            key.locator("i").evaluate("i => getComputedStyle(i).backgroundColor")
            == "rgb(214, 39, 40)"
        )
        assert "the circuit kept: 30 edges, 85.0%" in key.text_content()
        # the heads listed and the head left out
        tab.click("#unlabelled summary")
        assert tab.locator("#unlabelled p").text_content() == ", ".join(listed)
        assert "Not in the circuit: 7.7 (effect +0.0031, 143rd of 270" in tab.text_content(
            "#left-out"
        )
        tab.screenshot(path=str(tmp_path / "page.png"), full_page=True)
        assert errors == []
    finally:
        tab.close()


def test_an_edge_into_a_head_that_sends_nothing_is_drawn_without_it(tmp_path: Path) -> None:
    """A cut that keeps an edge into a head's queries but none of the head's own edges (the
    top cut may): the head is no node of the JSON, and the figure draws the rest."""
    data = _circuit(3, 4, {})
    data["nodes"] = [n for n in data["nodes"] if n["name"] != "1.0"]
    assert any(e["receiver"] == "q:1.0" for e in data["edges"])
    assert write_circuit(data, tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
