"""A model whose answer is known (issue 43): a two-layer attention-only model trained here, on
repeated random sequences, grows a previous-token head and induction heads. Composition scores
must rank that pair first, and path patching must find the induction metric taking the path
from the previous-token head into the induction heads' keys."""

from __future__ import annotations

import pytest
import torch

from headlab.causal.composition import composition_scores
from headlab.causal.paths import Receiver, path_patching
from headlab.experiments.induction import (
    InductionConfig,
    induction_task,
    repeated_batch,
    train_induction,
)
from headlab.models import HeadCapture, wrap

CFG = InductionConfig(steps=400)


@pytest.fixture(scope="module")
def toy() -> object:
    model = train_induction(CFG)
    return wrap(model, None, name="induction toy", path=".")


@pytest.fixture(scope="module")
def heads(toy: object) -> dict[str, object]:
    """Each head's mean attention to the previous token, and to the token after the earlier
    occurrence of the current one (on repeated sequences it never saw)."""
    gen = torch.Generator().manual_seed(99)
    ids, copied = repeated_batch(CFG, gen)
    with torch.no_grad(), HeadCapture(toy) as cap:
        logits = toy.model(input_ids=ids).logits  # type: ignore[attr-defined]
    accuracy = (logits[:, :-1].argmax(-1) == ids[:, 1:])[copied[:, 1:]].float().mean()
    prev, ind = {}, {}
    for layer in range(2):
        p = cap.pattern(layer)  # (B, H, T, T)
        for h in range(CFG.heads):
            prev[(layer, h)] = float(p[:, h].diagonal(offset=-1, dim1=-2, dim2=-1).mean())
            hits = []
            for b in range(ids.shape[0]):
                for i in copied[b].nonzero().flatten().tolist():
                    earlier = [j for j in range(i) if ids[b, j] == ids[b, i] and j + 1 < i]
                    if earlier:
                        hits.append(float(p[b, h, i, earlier[-1] + 1]))
            ind[(layer, h)] = sum(hits) / len(hits)
    return {"accuracy": float(accuracy), "prev": prev, "ind": ind}


def test_the_toy_learns_to_continue_repeats(heads: dict[str, object]) -> None:
    assert heads["accuracy"] > 0.9  # random guessing: 1/63


def _previous_token(heads: dict) -> set[tuple[int, int]]:
    """Heads that attend to the previous token (the toy may split the role over its two
    layer-0 heads): at least 0.3 of their attention, against about 0.05 for the others."""
    return {k for k, v in heads["prev"].items() if v > 0.3}


def _induction(heads: dict) -> set[tuple[int, int]]:
    return {k for k, v in heads["ind"].items() if v > 0.5}


def test_it_grows_previous_token_heads_and_induction_heads(heads: dict) -> None:
    prev, induction = _previous_token(heads), _induction(heads)
    assert prev and {layer for layer, _ in prev} == {0}
    assert induction and {layer for layer, _ in induction} == {1}
    assert sum(heads["prev"][k] for k in prev) > 0.6  # together, most of the previous token


def test_k_composition_ranks_previous_token_into_induction_first(toy, heads: dict) -> None:
    prev, induction = _previous_token(heads), _induction(heads)
    scores = composition_scores(toy)
    best = scores.top_pairs("k", 1)[0]
    sender = (best["sender"]["layer"], best["sender"]["head"])
    receiver = (best["receiver"]["layer"], best["receiver"]["head"])
    assert sender in prev and receiver in induction
    assert best["score"] > 2 * scores.baseline["k"]
    for layer, h in induction:  # and through the keys more than the queries
        read = [float(scores.k[p[0], p[1], layer, h]) for p in prev]
        asked = [float(scores.q[p[0], p[1], layer, h]) for p in prev]
        assert max(read) > max(asked)


def test_path_patching_finds_the_previous_token_path_into_the_keys(toy, heads) -> None:
    prev, induction = _previous_token(heads), sorted(_induction(heads))
    task = induction_task(32, CFG)
    total = 0.0
    for layer, h in induction:
        result = path_patching(toy, task, Receiver("k", layer, h))
        assert result.clean > result.corrupt + 1.0  # the toy prefers the answer, clean only
        ranked = result.ranked()
        assert (ranked[0][0], ranked[0][1]) in prev, ranked
        carried = sum(float(result.effects[p]) for p in prev)
        others = sum(
            abs(float(result.effects[0, x])) for x in range(CFG.heads) if (0, x) not in prev
        )
        assert carried > 0.3 and carried > 3 * others, (carried, others)
        total += carried
    assert total > 0.5, total  # through the induction heads' keys: most of the behaviour


def test_the_circuit_found_is_previous_token_into_induction_keys(toy, heads: dict) -> None:
    """#44: EAP-IG edge scores, cut greedily from the logits, find the induction circuit: a
    circuit of at most 20 of the toy's 46 edges keeps 80% of the logit difference on prompts
    it was not found on, with the induction heads writing to the logits and a previous-token
    head feeding an induction head's keys."""
    from headlab.causal.circuit import edge_scores, faithfulness_curve

    prev, induction = _previous_token(heads), _induction(heads)
    scores = edge_scores(toy, induction_task(48, CFG, seed=1), method="eap-ig")
    graph = scores.graph
    curve = faithfulness_curve(toy, scores, induction_task(48, CFG, seed=2))
    assert curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-6)
    best = curve.smallest[0.8]
    assert best is not None and curve.edges[best] <= 20, list(
        zip(curve.edges, curve.faithfulness, strict=True)
    )
    kept = curve.circuits[best].nonzero().tolist()
    names = {(graph.senders[s], graph.receivers[r]) for s, r in kept}
    for layer, head in induction:
        assert (f"{layer}.{head}", "logits") in names
    k_comp = {
        (s, r) for s, r in names if s in {f"{a}.{b}" for a, b in prev} and r.startswith("k:1.")
    }
    assert k_comp, sorted(names)


def test_learned_edge_masks_find_a_circuit_as_small(toy, heads: dict) -> None:
    """#59: edge pruning (masks learned by gradient descent towards 15 edges) finds, on prompts
    it was not trained on, a circuit of at most 20 of the toy's 46 edges that keeps 80% of the
    logit difference, with the induction heads writing to the logits."""
    from headlab.causal.circuit import circuit_logit_differences
    from headlab.causal.cut import first_edges, reaching_logits
    from headlab.causal.graph import build_graph
    from headlab.causal.learned import MaskOptions, learn_masks, learned_order

    graph = build_graph(toy)
    masks = learn_masks(
        toy, graph, induction_task(48, CFG, seed=1), MaskOptions(target=15, steps=100)
    )
    assert masks.kept == pytest.approx(15, abs=5)  # the schedule brought it to its target
    order = learned_order(graph, masks)
    sizes = [10, 15, 20]
    circuits = [reaching_logits(graph, first_edges(graph, order, n)) for n in sizes]
    lds, clean, corrupt = circuit_logit_differences(
        toy, graph, induction_task(48, CFG, seed=2), circuits
    )
    faith = [(ld - corrupt) / (clean - corrupt) for ld in lds]
    assert max(faith) >= 0.8, list(zip(sizes, faith, strict=True))
    best = circuits[max(range(len(sizes)), key=lambda i: faith[i])]
    names = {(graph.senders[s], graph.receivers[r]) for s, r in best.nonzero().tolist()}
    for layer, head in _induction(heads):
        assert (f"{layer}.{head}", "logits") in names
