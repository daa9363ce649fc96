"""``headlab cards``: every number on a head's card equals what the dedicated command (or
library call) gives for the same model, prompts and seed, on tiny random models (a Llama with
grouped-query attention and its LM head; a BERT encoder); the tokens a head writes against its
OV circuit built from the family's own modules; the verdict's rules; the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.models.tiny import build

from headlab.causal.request import ComposeRequest, PatchRequest
from headlab.cli import main
from headlab.datasets import read_treebank, sample_path
from headlab.experiments.card_verdict import CARRIES, verdict
from headlab.experiments.cards import EXAMPLE_SENTENCES, SCHEMA, Cards, CardsRequest
from headlab.layout.costs import compute_spec
from headlab.models.analysis import word_attention
from headlab.models.loading import LoadedModel, load
from headlab.pruning.importance import gradient_importance
from headlab.pruning.inputs import build_metrics
from headlab.pruning.results import PruneOptions
from headlab.roles.copying import copying_scores
from headlab.roles.workflow import RolesRequest

LIMIT, N = 20, 6


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """headlab's cache in a folder of this module's own (no cached roles run of another
    tiny model named alike)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 4 query heads on 2 KV heads; the norms' gains random, so that folding them is tested
    return build("llama", tmp_path_factory.mktemp("llama"), lm_head=True, seed=3, random_gains=True)


@pytest.fixture(scope="module")
def llama(llama_folder: Path) -> LoadedModel:
    return load(llama_folder, with_lm_head=True)


@pytest.fixture(scope="module")
def llama_cards(llama: LoadedModel, llama_folder: Path, cache: None) -> dict[str, Any]:
    return CardsRequest(model=str(llama_folder), limit=LIMIT, n=N).run(llama).to_json()


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("bert", tmp_path_factory.mktemp("bert"), seed=4)


@pytest.fixture(scope="module")
def bert_cards(bert_folder: Path, cache: None) -> tuple[LoadedModel, dict[str, Any]]:
    lm = load(bert_folder)
    return lm, CardsRequest(model=str(bert_folder), limit=LIMIT).run(lm).to_json()


def _grid(data: dict[str, Any], get: Any) -> list[Any]:
    return [get(card) for card in data["cards"]]


def _roles(card: dict[str, Any]) -> dict[str, Any]:
    """A card's roles-run entry, its top examples aside."""
    return {k: v for k, v in card["looks"].items() if k != "examples"}


def test_every_head_has_a_card_and_every_field_its_command(llama_cards: dict[str, Any]) -> None:
    data = llama_cards
    assert data["schema"] == SCHEMA
    assert [c["id"] for c in data["cards"]] == [f"{l}.{h}" for l in range(2) for h in range(4)]  # noqa: E741
    assert data["skipped"] == {}
    for key in (
        "looks.roles",
        "looks.examples",
        "reads.k",
        "writes.promoted",
        "writes.copying",
        "costs.importance",
    ):
        assert key in data["commands"]
    for task in ("ioi", "induction"):
        assert data["commands"][f"does.patching.{task}"].endswith(
            f"--task {task} --n {N} --seed 0 --position last --no-layers --json"
        )
    json.dumps(data)  # plain JSON throughout
    assert all(isinstance(c["verdict"], str) and c["verdict"] for c in data["cards"])


def test_looks_is_the_roles_run(llama: LoadedModel, llama_cards: dict[str, Any]) -> None:
    roles = RolesRequest(limit=LIMIT).run(llama).to_json()
    assert _grid(llama_cards, _roles) == roles["heads"]
    assert llama_cards["roles_from"] == "measured"


def test_top_examples_are_the_strongest_attention_off_the_sink(
    llama: LoadedModel, llama_cards: dict[str, Any]
) -> None:
    sentences = read_treebank(sample_path("treebank"), limit=EXAMPLE_SENTENCES).sentences
    seen = [word_attention(llama, words=list(s.words)) for s in sentences]
    assert llama_cards["sample"] == [list(a.alignment.words) for a in seen]
    for layer, head in ((0, 1), (1, 3)):
        best = []  # per sentence: the largest weight, query and key not special, key not the sink
        for index, att in enumerate(seen):
            special, p = att.alignment.is_special, att.patterns[layer][head]
            top = None
            for q in range(p.shape[0]):
                for k in range(p.shape[1]):
                    if special[q] or special[k] or k == att.sink:
                        continue
                    w = float(p[q, k].double())
                    if top is None or w > top["weight"]:
                        top = {"sentence": index, "query": q, "key": k, "weight": w}
            if top is not None:
                best.append(top)
        best.sort(key=lambda r: -r["weight"])
        assert llama_cards["cards"][4 * layer + head]["looks"]["examples"] == best[:3]


def test_patching_and_dla_are_headlab_patch(
    llama: LoadedModel, llama_folder: Path, llama_cards: dict[str, Any]
) -> None:
    for task in ("ioi", "induction"):
        asked = PatchRequest(
            model=str(llama_folder), task=task, n=N, position="last", no_layers=True
        )
        effects = asked.run(llama).to_json()["heads"]
        assert _grid(llama_cards, lambda c, t=task: c["does"]["patching"][t]) == [
            h["effect"] for h in effects
        ]
        dla = PatchRequest(model=str(llama_folder), task=task, n=N, method="dla").run(llama)
        assert _grid(llama_cards, lambda c, t=task: c["writes"]["dla"][t]) == [
            h["dla"] for h in dla.to_json()["heads"]
        ]


def test_every_position_is_headlab_patch_at_every_position(
    llama: LoadedModel, llama_folder: Path
) -> None:
    asked = CardsRequest(
        model=str(llama_folder),
        tasks=("induction",),
        n=N,
        position="all",
        no_roles=True,
        no_dla=True,
        no_compose=True,
        no_importance=True,
    )
    data = asked.run(llama).to_json()
    patch = PatchRequest(model=str(llama_folder), task="induction", n=N, no_layers=True)
    assert _grid(data, lambda c: c["does"]["patching"]["induction"]) == [
        h["effect"] for h in patch.run(llama).to_json()["heads"]
    ]
    assert "--position all" in data["commands"]["does.patching.induction"]
    assert data["cards"][0]["looks"] == {"examples": data["cards"][0]["looks"]["examples"]}
    assert data["skipped"]["roles"] == "--no-roles" and "looks.roles" not in data["commands"]


def test_the_ioi_class_is_headlab_circuits(
    llama: LoadedModel, llama_folder: Path, llama_cards: dict[str, Any]
) -> None:
    from headlab.causal.request import patch_task
    from headlab.experiments.head_classes import head_classes, roles_by_head

    asked = PatchRequest(model=str(llama_folder), task="ioi", n=N)
    heads = [(layer, head) for layer in range(2) for head in range(4)]
    roles = RolesRequest(limit=LIMIT).run(llama).to_json()
    known = roles_by_head(roles, [4, 4])
    classes, shaped = head_classes(llama, patch_task(llama, asked), heads, roles=known, paths=False)
    assert shaped
    assert _grid(llama_cards, lambda c: c["does"]["ioi_class"]) == [classes[h] for h in heads]
    assert "does.ioi_class" in llama_cards["commands"]


def test_reads_are_headlab_compose(
    llama: LoadedModel, llama_folder: Path, llama_cards: dict[str, Any]
) -> None:
    for card in llama_cards["cards"]:
        for kind in ("q", "k", "v"):
            if card["layer"] == 0:
                assert card["reads"][kind] == []
                continue
            asked = ComposeRequest(model=str(llama_folder), receivers=card["id"], kind=kind, top=3)
            (receiver,) = asked.run(llama).to_json()["receivers"]
            assert card["reads"][kind] == [
                {"head": f"{s['layer']}.{s['head']}", "score": s["score"],
                 "x_baseline": s["x_baseline"]}
                for s in receiver["senders"]
            ]  # fmt: skip


def _written_oracle(lm: LoadedModel, k: int) -> list[tuple[list[int], list[int]]]:
    """Each head's promoted and suppressed token ids, from the Llama's own modules: the mean
    of its V x V OV circuit's rows, W_U diag(n_f) W_O^h W_V^g diag(n_in) mean(W_E)."""
    model = lm.model.double()
    inner = model.model
    mean = inner.embed_tokens.weight.mean(0)  # (E,)
    unembed = model.lm_head.weight * inner.norm.weight  # (V, E)
    n_heads, n_kv, d = 4, 2, lm.head_dim
    out = []
    for layer in inner.layers:
        attn = layer.self_attn
        x = mean * layer.input_layernorm.weight
        for h in range(n_heads):
            g = h // (n_heads // n_kv)
            v = attn.v_proj.weight[g * d : (g + 1) * d] @ x  # (D,)
            row = unembed @ (attn.o_proj.weight[:, h * d : (h + 1) * d] @ v)  # (V,)
            out.append((row.topk(k).indices.tolist(), (-row).topk(k).indices.tolist()))
    model.float()
    return out


def test_writes_are_the_ov_circuit_and_the_copying_score(
    llama: LoadedModel, llama_cards: dict[str, Any]
) -> None:
    with torch.no_grad():
        oracle = _written_oracle(llama, 5)
    for card, (up, down) in zip(llama_cards["cards"], oracle, strict=True):
        assert [t["id"] for t in card["writes"]["promoted"]] == up
        assert [t["id"] for t in card["writes"]["suppressed"]] == down
        assert card["writes"]["unembedding"] == "language-model head"
        assert card["writes"]["promoted"][0]["token"] == llama.tokenizer.decode([up[0]])
    scores = copying_scores(llama)
    got = _grid(llama_cards, lambda c: c["writes"]["copying"])
    assert got == [float(scores[c["layer"], c["head"]]) for c in llama_cards["cards"]]
    # the roles run's copying score is the same number, rounded
    assert [round(v, 4) for v in got] == _grid(
        llama_cards, lambda c: c["looks"]["scores"]["copying"]
    )


def test_costs_are_the_layout_and_prune_importance(
    llama: LoadedModel, llama_cards: dict[str, Any]
) -> None:
    spec = compute_spec(llama.layout, context=llama_cards["settings"]["context"])
    flops = _grid(llama_cards, lambda c: c["costs"]["flops_share"])
    kv = _grid(llama_cards, lambda c: c["costs"]["kv_share"])
    assert sum(flops) == pytest.approx(1.0) and sum(kv) == pytest.approx(1.0)
    # equal layers: each of the 8 heads carries an eighth, of FLOPs and of the KV cache
    assert flops == pytest.approx([1 / 8] * 8) and kv == pytest.approx([1 / 8] * 8)
    assert spec.attention_flops_per_token > 0
    _, metric, _ = build_metrics(llama, PruneOptions())
    scores = gradient_importance(llama, metric)
    got = _grid(llama_cards, lambda c: c["costs"]["importance"])
    assert got == [float(scores[c["layer"], c["head"]]) for c in llama_cards["cards"]]
    ranks = _grid(llama_cards, lambda c: c["costs"]["importance_rank"])
    assert sorted(ranks) == list(range(1, 9))
    assert [got[i] for i in sorted(range(8), key=lambda i: ranks[i])] == sorted(got, reverse=True)


def test_a_cached_roles_run_is_read_and_parts_can_be_left_out(
    llama: LoadedModel, llama_folder: Path, llama_cards: dict[str, Any], tmp_path: Path
) -> None:
    roles = tmp_path / "roles.json"
    run = RolesRequest(limit=LIMIT).run(llama).to_json()
    roles.write_text(json.dumps(run))
    asked = CardsRequest(
        model=str(llama_folder), roles=str(roles), no_patch=True, no_dla=True, no_compose=True,
        no_importance=True,
    )  # fmt: skip
    data = asked.run(llama).to_json()
    assert data["roles_from"] == str(roles)
    assert _grid(data, _roles) == run["heads"]
    assert set(data["skipped"]) == {"patch", "dla", "compose", "importance"}
    assert not any(k.startswith(("does.", "writes.dla", "reads.")) for k in data["commands"])
    assert all(c["reads"] is None and c["does"]["patching"] == {} for c in data["cards"])
    assert all(c["costs"]["importance"] is None for c in data["cards"])


def test_a_decoder_without_its_head_says_what_it_leaves_out(
    llama_folder: Path, cache: None
) -> None:
    lm = load(llama_folder)  # the base model: no language-model head
    data = CardsRequest(model=str(llama_folder), examples=2, no_roles=True).run(lm).to_json()
    assert set(data["skipped"]) == {"roles", "patch", "dla", "importance"}
    assert "language-model head" in data["skipped"]["importance"]
    card = data["cards"][0]
    assert card["writes"]["unembedding"] == "output head read from the folder"
    assert card["writes"]["promoted"] and card["costs"]["importance"] is None


def test_a_model_with_no_unembedding_says_so(tmp_path: Path, cache: None) -> None:
    folder = build("llama", tmp_path / "base", seed=5)  # no head saved, embeddings not tied
    data = CardsRequest(model=str(folder), examples=0, no_roles=True).run(load(folder)).to_json()
    assert "no unembedding" in data["skipped"]["writes"]
    assert all(c["writes"]["promoted"] is None for c in data["cards"])
    assert "writes.promoted" not in data["commands"]


def test_an_encoder_card_has_no_task_but_stsb_importance(
    bert_cards: tuple[LoadedModel, dict[str, Any]],
) -> None:
    lm, data = bert_cards
    assert "causal language model" in data["skipped"]["patch"]
    assert data["cards"][0]["writes"]["unembedding"] == "tied embedding"
    assert all(c["costs"]["kv_share"] is None for c in data["cards"])
    _, metric, _ = build_metrics(lm, PruneOptions())  # STS-B for an encoder
    scores = gradient_importance(lm, metric)
    assert _grid(data, lambda c: c["costs"]["importance"]) == [
        float(scores[c["layer"], c["head"]]) for c in data["cards"]
    ]
    roles = RolesRequest(limit=LIMIT).run(lm).to_json()
    assert _grid(data, _roles) == roles["heads"]


def _card(role: str | None, patching: dict[str, float], **writes: Any) -> dict[str, Any]:
    looks = None if role is None else {"role": role, "score": 0.71, "baseline": 0.3,
                                       "fold_agreement": 1.0}  # fmt: skip
    return {
        "id": "3.1",
        "looks": looks,
        "reads": {"k": [{"head": "2.0", "score": 0.4, "x_baseline": 3.0}]},
        "writes": {"copying": writes.get("copying"), "dla": writes.get("dla", {})},
        "does": {"patching": patching},
    }


def test_the_verdict_says_both_where_attention_and_effect_disagree() -> None:
    sender = {"2.0": {"looks": {"role": "previous-token"}}}
    line = verdict(_card("delimiter", {"induction": 0.36}), sender, folds=5)
    assert line.startswith("looks like a delimiter head (0.71 against 0.30, 5/5 folds), acts "
                           "like an induction head: carries 36% of the induction task")  # fmt: skip
    assert "reads its keys from 2.0 (a previous-token head), 3.0x baseline" in line
    mover = _card("sink", {"ioi": 0.51})
    mover["does"]["ioi_class"] = {"class": "name mover"}
    assert verdict(mover, {}).startswith("looks like a sink head (0.71 against 0.30), acts like "
                                         "a name mover head: carries 51% of the ioi task")  # fmt: skip
    # patched at every position, a previous-token head carries induction too: no role inferred
    fed = verdict(_card("previous-token", {"induction": 0.36}), sender, position="all")
    assert fed.startswith("previous-token head (0.71 against 0.30): carries 36% of the induction")
    same = verdict(_card("induction", {"induction": 0.36}, copying=0.92), sender, folds=5)
    assert same.startswith("induction head (0.71 against 0.30, 5/5 folds): carries 36%")
    assert "copies what it attends to (0.92)" in same
    # below the bar, the effect is not said, and a head with nothing is unexplained
    quiet = _card(None, {"induction": CARRIES / 2})
    quiet["reads"] = {"k": []}
    assert verdict(quiet, {}).startswith("unexplained")
    dla = verdict(_card(None, {}, dla={"ioi": -2.0}), {}, largest_dla={"ioi": 2.0})
    assert "pushes the ioi answer down directly (DLA -2)" in dla


def test_the_command_prints_the_cards(
    llama: LoadedModel, llama_folder: Path, cache: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["cards", "--model", str(llama_folder), "--limit", str(LIMIT), "--n", "4", "-q"]
    assert main([*argv, "--json", "--tasks", "induction", "--no-importance"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["tasks"] == ["induction"] and len(data["cards"]) == 8
    from headlab.cache import cached_roles_path

    cached = cached_roles_path(data["model"])
    assert cached.is_file()  # kept, as headlab roles keeps its run
    quick = {"no_patch": True, "no_dla": True, "no_compose": True, "no_importance": True,
             "examples": 0}  # fmt: skip
    read = CardsRequest(model=str(llama_folder), **quick).run(llama).to_json()
    assert read["roles_from"] == str(cached)  # the cached run, read
    again = CardsRequest(model=str(llama_folder), limit=5, **quick).run(llama).to_json()
    assert again["roles_from"] == "measured"  # --limit asks for a run measured here
    assert main([*argv, "--no-patch", "--no-dla"]) == 0
    out = capsys.readouterr().out
    assert "verdict" in out and "1.3" in out


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--tasks", "sst2"], "--tasks"),
        (["--no-roles", "--limit", "5"], "--limit has no effect here"),
        (["--roles", "/nonexistent/roles.json"], "cannot read roles file"),
        (["--tasks", ""], "--tasks"),
        (["--position", "first"], "--position"),
        (["--roles", "r.json", "--limit", "5"], "--limit has no effect here: --roles"),
    ],
)
def test_bad_input_is_one_line_before_the_model_loads(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cards", "--model", "/nonexistent/model", *flags]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_cards_are_a_result(llama_cards: dict[str, Any]) -> None:
    from headlab.request import Request, Result

    assert isinstance(CardsRequest(no_roles=True), Request)
    fake = Cards(model="m", heads_in_layer=(1,), causal=True, settings={}, commands={},
                 skipped={}, cards=[{"id": "0.0"}])  # fmt: skip
    assert isinstance(fake, Result) and fake.card(0, 0) == {"id": "0.0"}


def test_a_model_the_tasks_cannot_be_drawn_for_still_gets_its_cards() -> None:
    """A character-level model (tiny-shakespeare, 128 positions) cannot draw the built-in
    IOI and induction prompts, and some bundled sentences are longer than it reads: its cards
    keep every other part, say why each task is missing, and name no command for it."""
    lm = load("tiny-shakespeare", with_lm_head=True)
    data = CardsRequest(
        model="tiny-shakespeare", no_compose=True, no_importance=True, no_roles=True
    )
    out = data.run(lm).to_json()
    assert len(out["cards"]) == lm.n_layers * lm.n_heads
    for task in ("ioi", "induction"):
        assert "cannot be drawn" in out["skipped"][f"task {task}"]
        assert not any(k.endswith(f".{task}") for k in out["commands"])
    assert out["cards"][0]["writes"]["promoted"]  # the OV circuit still reads the weights
    examples = [c["looks"]["examples"] for c in out["cards"] if c["looks"].get("examples")]
    assert examples and all(len(e) <= 3 for e in examples)
