"""A behaviour's circuit, found automatically, measured, and its heads named from evidence: the
workflow of ``headlab circuit``.

1. Every edge of the model's graph is scored on the discovery prompts (EAP or EAP-IG,
   :func:`headlab.causal.circuit.edge_scores`).
2. The graph is cut to circuits of growing size and each is run on held-out prompts, every edge
   outside it corrupted (:func:`headlab.causal.circuit.faithfulness_curve`). The circuit kept
   is the smallest that reaches ``target`` (default 80%) of the logit difference.
3. On IOI-shaped prompts the circuit's heads are named by the classes of the IOI paper where
   measurements support them (:mod:`headlab.experiments.head_classes`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headlab.causal.circuit import (
    TARGETS,
    Curve,
    EdgeMethod,
    EdgeScores,
    Search,
    check_differs,
    edge_scores,
    faithfulness_curve,
)
from headlab.causal.cut import check_sizes
from headlab.causal.figure import CLASS_COLOURS
from headlab.causal.graph import build_graph
from headlab.causal.learned import (
    LearnedMasks,
    MaskOptions,
    check_kept_memory,
    learn_masks,
    learned_order,
)
from headlab.causal.tasks import Task, encode_task
from headlab.errors import InputError
from headlab.experiments.head_classes import CLASS_RULES, CLASSES, head_classes
from headlab.models.loading import LoadedModel
from headlab.progress import NO_PROGRESS, Progress
from headlab.text import Part, table

#: the learned search's defaults: the share of the graph's edges its masks aim for (the
#: circuit #59 asks for), its steps, and the prompts a step takes
MASK_SHARE, MASK_STEPS, MASK_BATCH = 0.05, 300, 8


@dataclass(frozen=True, eq=False)
class CircuitResult:
    """A circuit and the evidence for its heads' classes.

    Attributes:
        scores: every edge's score on the discovery prompts.
        curve: faithfulness against size on the held-out prompts; ``chosen`` the index of the
            circuit kept (the smallest reaching ``target``).
        heads: per head in the circuit, its class and evidence (``unexplained`` where the prompts
            are not IOI-shaped, ``None`` where classes were not asked for).
    """

    scores: EdgeScores
    curve: Curve
    masks: LearnedMasks | None
    chosen: int
    target: float
    eval_task: str
    n_eval: int
    heads: dict[tuple[int, int], dict[str, Any]]
    ioi_shaped: bool
    seconds: float

    @property
    def reached(self) -> bool:
        """Whether the circuit kept reaches ``target`` (else it is the most faithful measured)."""
        return self.curve.faithfulness[self.chosen] >= self.target

    @property
    def circuit(self) -> torch.Tensor:
        """bool ``(S, R)``: the edges of the circuit kept."""
        return self.curve.circuits[self.chosen]

    def classes(self) -> dict[str, list[list[int]]]:
        out: dict[str, list[list[int]]] = {name: [] for name in CLASSES}
        for (layer, head), info in sorted(self.heads.items()):
            if info["class"] is not None:
                out[info["class"]].append([layer, head])
        return {name: heads for name, heads in out.items() if heads}

    def to_json(self) -> dict[str, Any]:
        s, c, graph = self.scores, self.curve, self.scores.graph
        kept = self.circuit.nonzero().tolist()
        edges = sorted(
            (
                {
                    "sender": graph.senders[i],
                    "receiver": graph.receivers[j],
                    "score": round(float(s.scores[i, j]), 6),
                }
                for i, j in kept
            ),
            key=lambda e: -abs(e["score"]),
        )
        names = [*sorted({e["sender"] for e in edges}, key=graph.senders.index), "logits"]
        effects = self.sender_effects()
        nodes = [{**_node(name, self.heads), "effect": effects.get(name)} for name in names]

        def point(i: int | None) -> dict[str, Any] | None:
            if i is None:
                return None
            # + 0.0: a faithfulness that rounds to zero from below reads 0.0, not -0.0
            return {"edges": c.edges[i], "faithfulness": round(c.faithfulness[i], 4) + 0.0}

        return {
            "schema": "headlab.circuit/1",
            "model": s.model,
            "task": s.task,
            "eval_task": self.eval_task,
            "n_prompts": s.n_prompts,
            "n_eval_prompts": self.n_eval,
            "method": s.method,
            "steps": s.steps,
            "search": c.search,
            # the learned search's target, steps and time ("kept": gates open at the end)
            **(
                {}
                if self.masks is None
                else {
                    "masks": {
                        "target": self.masks.target,
                        "steps": len(self.masks.loss),
                        "kept": round(self.masks.kept, 1),
                        "seconds": round(self.masks.seconds, 2),
                    }
                }
            ),
            "clean": round(s.clean, 4),
            "corrupt": round(s.corrupt, 4),
            "eval": {"clean": round(c.clean, 4), "corrupt": round(c.corrupt, 4)},
            "edges_total": graph.n_edges,
            # query heads per KV head, per layer: a k/v receiver feeds that many heads
            "group_size": [
                len(graph.receiver_range(i, "q")) // len(graph.receiver_range(i, "k"))
                for i in range(len(graph.blocks))
            ],
            "curve": [point(i) for i in range(len(c.edges))],
            "smallest": {str(t): point(c.smallest[t]) for t in TARGETS},
            "target": self.target,
            "circuit": point(self.chosen),
            # false: no circuit measured reached the target; "circuit" is the most faithful
            "reached": self.reached,
            "nodes": nodes,
            "edges": edges,
            "classes": self.classes(),
            "class_rules": CLASS_RULES if self.ioi_shaped else {},
            "class_colours": CLASS_COLOURS,
            "heads": [
                {"layer": layer, "head": head, **info}
                for (layer, head), info in sorted(self.heads.items())
            ],
            "left_out": left_out(effects, set(names)),
            "seconds": round(self.seconds, 2),
        }

    def sender_effects(self) -> dict[str, float]:
        """Each sender's estimated effect (``embed``, ``L.H``, ``mlp L``): the share of the
        logit difference that corrupting its output removes, the sum of its edges' scores over
        the whole graph (every path from it to the logits passes one of them: the attribution
        patching of ``headlab patch --method attribution`` for EAP, on the same prompts)."""
        s = self.scores
        shares = -s.scores.sum(dim=1) / (s.clean - s.corrupt)  # (S,)
        return {
            name: round(float(v), 4) + 0.0 for name, v in zip(s.graph.senders, shares, strict=True)
        }


#: heads not in the circuit named in its JSON: all of them when there are at most this many,
#: else those among the :data:`LEFT_OUT_TOP` heads of largest estimated |effect|
LEFT_OUT_ALL, LEFT_OUT_TOP = 10, 20


def left_out(effects: dict[str, float], kept: set[str]) -> list[dict[str, Any]]:
    """The heads the circuit leaves out that a reader should hear of (:data:`LEFT_OUT_ALL`,
    :data:`LEFT_OUT_TOP`), by decreasing |effect|: each with its estimated effect and its rank
    by |effect| among all heads."""
    heads = sorted(
        (n for n in effects if n != "embed" and not n.startswith("mlp ")),
        key=lambda n: -abs(effects[n]),
    )
    rank = {name: i + 1 for i, name in enumerate(heads)}
    out = [n for n in heads if n not in kept]
    if len(out) > LEFT_OUT_ALL:
        out = [n for n in out if rank[n] <= LEFT_OUT_TOP]
    return [
        {
            "layer": int(n.split(".")[0]),
            "head": int(n.split(".")[1]),
            "effect": effects[n],
            "rank": rank[n],
            "of": len(heads),
        }
        for n in out
    ]


def _node(name: str, heads: dict[tuple[int, int], dict[str, Any]]) -> dict[str, Any]:
    if name in ("embed", "logits"):
        return {"name": name, "kind": name, "layer": None, "head": None, "class": None}
    if name.startswith("mlp "):
        return {"name": name, "kind": "mlp", "layer": int(name[4:]), "head": None, "class": None}
    layer, head = (int(x) for x in name.split("."))
    info = heads.get((layer, head), {})
    return {"name": name, "kind": "head", "layer": layer, "head": head, "class": info.get("class")}


# ---------------------------------------------------------------- evidence
def circuit_heads(result_scores: EdgeScores, circuit: torch.Tensor) -> list[tuple[int, int]]:
    """The heads that send along the circuit's edges, by layer and head."""
    graph = result_scores.graph
    heads = []
    for s in sorted(set(circuit.nonzero()[:, 0].tolist())):
        name = graph.senders[s]
        if name != "embed" and not name.startswith("mlp "):
            layer, head = (int(x) for x in name.split("."))
            heads.append((layer, head))
    return heads


def find_circuit(
    lm: LoadedModel,
    task: Task,
    eval_task: Task,
    *,
    method: EdgeMethod = "eap-ig",
    steps: int = 5,
    search: Search = "greedy",
    sizes: Sequence[int] | None = None,
    target: float = 0.8,
    classes: bool = True,
    roles: dict[tuple[int, int], str] | None = None,
    mask_edges: int | None = None,
    mask_steps: int = MASK_STEPS,
    progress: Progress | None = None,
) -> CircuitResult:
    """Score every edge on ``task``, measure circuits of growing size on ``eval_task``, keep
    the smallest reaching ``target`` and name its heads' classes (with ``classes``).

    ``search="learned"`` learns a mask per edge on ``task`` (:mod:`headlab.causal.learned`,
    ``mask_steps`` steps of :data:`MASK_BATCH` prompts, towards ``mask_edges`` edges, default
    :data:`MASK_SHARE` of them) and measures the first edges of the order it gives.

    Without ``classes`` every head's class is ``None`` (not named, rather than unexplained).
    If no circuit measured reaches ``target``, the most faithful is kept and
    :attr:`CircuitResult.reached` is false.

    Raises:
        InputError: ``target`` outside (0, 1], a size outside ``0..edges``; what the steps
            below raise.
    """
    if not 0.0 < target <= 1.0:
        raise InputError(f"target must be a share in (0, 1], got {target}")
    start = time.perf_counter()
    progress = progress or NO_PROGRESS
    graph = build_graph(lm)
    check_differs(task)  # both sets of prompts and the sizes checked before minutes of scoring
    check_differs(eval_task)
    if sizes is not None:
        check_sizes(graph, sizes)
        sizes = sorted(set(sizes))  # measured smallest first, each once
        if not any(sizes):
            raise InputError(
                "--sizes: a circuit keeps at least one edge (0 measures the corrupted model, "
                "a point of the curve, not a circuit)"
            )
    if search == "learned" and mask_edges is not None and mask_edges > graph.n_edges:
        raise InputError(
            f"--mask-edges {mask_edges}: the graph of {lm.name} has {graph.n_edges} edges"
        )
    if search == "learned":
        check_kept_memory(lm, graph, task)  # what the search keeps, before the scoring
    scores = edge_scores(lm, task, method=method, steps=steps, graph=graph, progress=progress)
    order, masks = None, None
    if search == "learned":
        options = MaskOptions(
            target=mask_edges or max(1, round(MASK_SHARE * graph.n_edges)), steps=mask_steps
        )
        small = encode_task(lm.tokenizer, task.prompts, name=task.name, batch=MASK_BATCH)
        masks = learn_masks(lm, graph, small, options, progress=progress)
        order = learned_order(graph, masks)
    curve = faithfulness_curve(
        lm, scores, eval_task, sizes=sizes, search=search, order=order, progress=progress
    )
    # a circuit keeps at least one edge: 0 edges is the corrupted model, a point of the curve
    sized = [i for i in range(len(curve.edges)) if curve.edges[i] > 0] or [*range(len(curve.edges))]
    reached = [i for i in sized if curve.faithfulness[i] >= target]
    chosen = (
        min(reached, key=lambda i: curve.edges[i])
        if reached
        else max(sized, key=lambda i: (curve.faithfulness[i], -curve.edges[i]))
    )
    heads = circuit_heads(scores, curve.circuits[chosen])
    info, shaped = (
        head_classes(lm, task, heads, roles=roles, progress=progress)
        if classes
        else ({h: {"class": None} for h in heads}, False)
    )
    return CircuitResult(
        scores=scores,
        curve=curve,
        masks=masks,
        chosen=chosen,
        target=target,
        eval_task=eval_task.name,
        n_eval=eval_task.n_prompts,
        heads=info,
        ioi_shaped=shaped,
        seconds=time.perf_counter() - start,
    )


def circuit_text(data: dict[str, Any], top: int = 15) -> list[Part]:
    """What ``headlab circuit`` prints of its JSON (:meth:`CircuitResult.to_json`): the run,
    the faithfulness curve, the circuit kept, the heads it leaves out (:func:`left_out`), its
    heads by class and its ``top`` edges."""
    c = data["circuit"]
    out: list[Part] = [
        f"{data['method']} edge scores of {data['model']} on {data['task']} ({data['n_prompts']} "
        f"prompts, logit difference {data['clean']:.3f} clean, {data['corrupt']:.3f} corrupt); "
        f"measured on {data['n_eval_prompts']} held-out prompts ({data['eval_task']}) in "
        f"{data['seconds']:.0f} s",
        table(
            ("edges", "faithfulness"),
            [(str(p["edges"]), f"{p['faithfulness']:.3f}") for p in data["curve"]],
            title="faithfulness against circuit size (held-out prompts)",
            right=(0, 1),
        ),
    ]
    for share, point in data["smallest"].items():
        reached = "none measured" if point is None else f"{point['edges']} edges"
        out.append(f"smallest circuit reaching {float(share):.0%}: {reached}")
    out.append(
        f"the circuit kept: {c['edges']} of {data['edges_total']} edges, "
        f"{c['faithfulness']:.1%} of the logit difference, {len(data['nodes'])} nodes"
    )
    if data.get("left_out"):
        named = ", ".join(
            f"{h['layer']}.{h['head']} {h['effect']:+.2f} ({h['rank']} of {h['of']})"
            for h in data["left_out"]
        )
        out.append(
            f"not in the circuit (effect estimated from the edges, rank by |effect|): {named}"
        )
    if data["classes"]:
        rows = [
            (name, ", ".join(f"{la}.{h}" for la, h in heads))
            for name, heads in data["classes"].items()
        ]
        out.append(
            table(("class", "heads"), rows, title="its heads, by class (evidence in --json)")
        )
    edges = [(e["sender"], e["receiver"], f"{e['score']:+.4f}") for e in data["edges"][:top]]
    out.append(
        table(
            ("sender", "receiver", "score"), edges, title=f"its {top} strongest edges", right=(2,)
        )
    )
    return out
