"""A behaviour's circuit, found automatically, measured, and its heads named from evidence: the
workflow of ``headlab circuit``.

1. Every edge of the model's graph is scored on the discovery prompts (EAP or EAP-IG,
   :func:`headlab.causal.circuit.edge_scores`).
2. The graph is cut to circuits of growing size and each is run on held-out prompts, every edge
   outside it corrupted (:func:`headlab.causal.circuit.faithfulness_curve`). The circuit kept
   is the smallest that reaches ``target`` (default 80%) of the logit difference.
3. On IOI-shaped prompts (the answer once before the end, the distractor twice: the indirect
   object and the subject of Wang et al. 2022), the circuit's heads are named by the classes
   of the IOI paper where measurements support them (:data:`CLASS_RULES`), in this order:

   - ``name mover``: positive direct logit attribution (at least :data:`DLA_SHARE` of the
     largest), the last position attends to the indirect object (at least
     :data:`ATTENDS`) more than to the subject, and it copies it (:func:`_name_copying`);
   - ``negative name mover``: the same attention, negative direct logit attribution;
   - ``s-inhibition``: its path into the strongest name movers' queries carries at least
     :data:`PATH_SHARE` of the largest such path (path patching, Wang et al. Appendix B);
   - ``induction``: at the subject's second occurrence it attends to the token after the first;
   - ``duplicate token``: at the subject's second occurrence it attends to the first;
   - ``previous token``: every position attends to the one before (mean, :data:`PREVIOUS`);
   - ``unexplained``: none of these measured.

Classes are tendencies measured on these prompts, not assignments; every number is in the JSON.
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
from headlab.causal.dla import direct_logit_attribution
from headlab.causal.figure import CLASS_COLOURS
from headlab.causal.graph import build_graph
from headlab.causal.paths import Receiver, path_patching
from headlab.causal.tasks import Task
from headlab.errors import InputError
from headlab.models.capture import HeadCapture
from headlab.models.loading import LoadedModel
from headlab.progress import NO_PROGRESS, Progress
from headlab.roles.classify import ROLES, UNCLASSIFIED
from headlab.text import Part, table

#: the classes, in the order a head is checked against them
CLASSES = (
    "name mover",
    "negative name mover",
    "s-inhibition",
    "induction",
    "duplicate token",
    "previous token",
    "unexplained",
)
#: a name mover's |direct logit attribution|, as a share of the largest head's
DLA_SHARE = 0.1
#: mean attention weight that counts as "attends to" (a uniform row of these prompts: ~0.07)
ATTENDS = 0.3
#: mean attention to the previous token that makes a previous-token head
PREVIOUS = 0.4
#: a name mover copies: the indirect object among the top 5 logits of what it reads there, in
#: at least this share of the prompts (Wang et al.'s copying score)
COPIES = 0.5
TOP_LOGITS = 5
#: a head's path into the name movers' queries, as a share of the largest such path
PATH_SHARE = 0.3
#: name movers whose queries path patching reads (the strongest by direct logit attribution)
PATH_RECEIVERS = 2
CLASS_RULES = {
    "name mover": f"direct logit attribution > 0 and >= {DLA_SHARE} of the largest; at the "
    f"last position attends to the indirect object >= {ATTENDS} and more than to the subject; "
    f"copies it: its value there, through its output projection, the final norm's gain and the "
    f"unembedding, ranks the indirect object in the top {TOP_LOGITS} logits in >= {COPIES} of "
    "the prompts",
    "negative name mover": f"direct logit attribution < 0 and |dla| >= {DLA_SHARE} of the "
    f"largest; attends to the indirect object at the end >= {ATTENDS}, more than to the subject",
    "s-inhibition": f"path patching into the queries of the {PATH_RECEIVERS} strongest name "
    f"movers: effect >= {PATH_SHARE} of the largest path there",
    "induction": f"at the subject's second occurrence attends to the token after its first "
    f">= {ATTENDS}, or headlab roles names it an induction head",
    "duplicate token": f"at the subject's second occurrence attends to its first >= {ATTENDS}, "
    "or headlab roles names it a duplicate-token head",
    "previous token": f"mean attention to the previous token >= {PREVIOUS}, or headlab roles "
    "names it a previous-token head",
    "unexplained": "in the circuit; none of the measurements above",
}


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
        nodes = [_node(name, self.heads) for name in names]

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
            "seconds": round(self.seconds, 2),
        }


def _node(name: str, heads: dict[tuple[int, int], dict[str, Any]]) -> dict[str, Any]:
    if name in ("embed", "logits"):
        return {"name": name, "kind": name, "layer": None, "head": None, "class": None}
    if name.startswith("mlp "):
        return {"name": name, "kind": "mlp", "layer": int(name[4:]), "head": None, "class": None}
    layer, head = (int(x) for x in name.split("."))
    info = heads.get((layer, head), {})
    return {"name": name, "kind": "head", "layer": layer, "head": head, "class": info.get("class")}


# ---------------------------------------------------------------- evidence
def _positions(ids: list[int], answer: int, distractor: int) -> tuple[int, int, int] | None:
    """(indirect object, subject's first, subject's second occurrence) in an IOI-shaped
    prompt, or ``None``."""
    io = [i for i, t in enumerate(ids) if t == answer]
    s = [i for i, t in enumerate(ids) if t == distractor]
    if len(io) != 1 or len(s) != 2 or s[0] + 1 >= len(ids):
        return None
    return io[0], s[0], s[1]


def _attention_evidence(lm: LoadedModel, task: Task) -> dict[str, torch.Tensor] | None:
    """Per head ``(L, H)``: mean attention from the last position to the indirect object and
    to the subject, at the subject's second occurrence to its first and to the token after it,
    and to the previous token; ``None`` unless every prompt is IOI-shaped."""
    n_layers, width = lm.n_layers, max(lm.layout.heads_per_layer)
    keys = ("end_to_io", "end_to_s", "s2_to_s1", "s2_to_after_s1", "previous")
    sums = {k: torch.zeros(n_layers, width, dtype=torch.float64) for k in keys}
    count = 0
    for batch in task.batches:
        rows = [
            _positions(ids, int(a), int(d))
            for ids, a, d in zip(
                batch.clean.tolist(), batch.answer.tolist(), batch.distractor.tolist(), strict=True
            )
        ]
        if any(r is None for r in rows):
            return None
        with torch.inference_mode(), HeadCapture(lm, record_head_outputs=False) as cap:
            lm.model(input_ids=batch.clean.to(lm.device))
        for layer in range(n_layers):
            p = cap.pattern(layer).double().cpu()  # (B, H, T, T)
            n_heads = p.shape[1]
            prev = p.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)  # (B, H)
            for b, found in enumerate(rows):
                assert found is not None
                io, s1, s2 = found
                sums["end_to_io"][layer, :n_heads] += p[b, :, -1, io]
                sums["end_to_s"][layer, :n_heads] += p[b, :, -1, s1] + p[b, :, -1, s2]
                sums["s2_to_s1"][layer, :n_heads] += p[b, :, s2, s1]
                sums["s2_to_after_s1"][layer, :n_heads] += p[b, :, s2, s1 + 1]
                sums["previous"][layer, :n_heads] += prev[b]
        count += len(rows)
    return {k: v / count for k, v in sums.items()}


def _name_copying(lm: LoadedModel, task: Task, heads: list[tuple[int, int]]) -> torch.Tensor:
    """``(L, H)``: for each of ``heads``, the share of prompts in which what it reads at the
    indirect object (its value vector there, through its columns of the output projection,
    the final norm's gain and the unembedding) ranks the indirect object among the top
    :data:`TOP_LOGITS` logits (Wang et al. 2022's copying score, on the prompts' own
    residual stream); NaN for every other head."""
    out = torch.full(
        (lm.n_layers, max(lm.layout.heads_per_layer)), float("nan"), dtype=torch.float64
    )
    if not heads:
        return out
    w_u = lm.model.get_output_embeddings().weight.detach()  # (V, E)
    gain = getattr(build_graph(lm).final_norm, "weight", None)
    layers = sorted({layer for layer, _ in heads})
    hits = torch.zeros_like(out).nan_to_num(0.0)
    total = 0
    for batch in task.batches:
        rows = [
            _positions(ids, int(a), int(d))
            for ids, a, d in zip(
                batch.clean.tolist(), batch.answer.tolist(), batch.distractor.tolist(), strict=True
            )
        ]
        io = torch.tensor([r[0] if r is not None else 0 for r in rows])
        with (
            torch.inference_mode(),
            HeadCapture(lm, layers=layers, record_head_outputs=False) as cap,
        ):
            lm.model(input_ids=batch.clean.to(lm.device))
        for layer, head in heads:
            v = cap.records[layer].v  # (B, Hkv, T, D)
            assert v is not None
            n_heads = lm.layout.heads_per_layer[layer]
            group = head // (n_heads // v.shape[1])
            read = v[torch.arange(v.shape[0]), group, io.to(v.device)]  # (B, D)
            w_o = lm.adapter.out_proj_weight(lm.layers[layer].out_proj).detach()  # (E, H*D)
            d = read.shape[-1]
            written = read @ w_o[:, head * d : (head + 1) * d].to(read).t()  # (B, E)
            if isinstance(gain, torch.Tensor):
                written = written * gain.detach().to(written)
            top = (written @ w_u.to(written).t()).topk(TOP_LOGITS, dim=-1).indices  # (B, k)
            hit = (top == batch.answer.to(top.device)[:, None]).any(dim=-1)
            hits[layer, head] += float(hit.sum())
        total += len(rows)
    for layer, head in heads:
        out[layer, head] = hits[layer, head] / total
    return out


def _classify(
    heads: list[tuple[int, int]],
    dla: torch.Tensor,
    copying: torch.Tensor,
    attention: dict[str, torch.Tensor],
    paths: torch.Tensor | None,
    roles: dict[tuple[int, int], str] | None = None,
) -> dict[tuple[int, int], dict[str, Any]]:
    largest = float(dla.nan_to_num(0.0).abs().max())
    best_path = 0.0 if paths is None else float(paths.nan_to_num(0.0).max())
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for layer, head in heads:

        def at(t: torch.Tensor | None, layer: int = layer, head: int = head) -> float | None:
            if t is None or bool(torch.isnan(t[layer, head])):
                return None
            return round(float(t[layer, head]), 4)

        e = {
            "dla": at(dla),
            "copying": at(copying),
            **{k: at(v) for k, v in attention.items()},
            "path_to_name_movers": at(paths),
        }
        role = None if roles is None else roles.get((layer, head))
        d, cp = e["dla"] or 0.0, e["copying"]
        looks_at_io = (e["end_to_io"] or 0.0) >= ATTENDS and (e["end_to_io"] or 0.0) > (
            e["end_to_s"] or 0.0
        )
        strong = abs(d) >= DLA_SHARE * largest and largest > 0
        if strong and d > 0 and looks_at_io and cp is not None and cp >= COPIES:
            kind = "name mover"
        elif strong and d < 0 and looks_at_io:
            kind = "negative name mover"
        elif (
            e["path_to_name_movers"] is not None
            and best_path > 0
            and (e["path_to_name_movers"] >= PATH_SHARE * best_path)
        ):
            kind = "s-inhibition"
        elif (e["s2_to_after_s1"] or 0.0) >= ATTENDS or role == "induction":
            kind = "induction"
        elif (e["s2_to_s1"] or 0.0) >= ATTENDS or role == "duplicate-token":
            kind = "duplicate token"
        elif (e["previous"] or 0.0) >= PREVIOUS or role == "previous-token":
            kind = "previous token"
        else:
            kind = "unexplained"
        out[(layer, head)] = {"class": kind, **e, "role": role}
    return out


def roles_by_head(
    data: dict[str, Any], heads_per_layer: list[int] | None = None
) -> dict[tuple[int, int], str]:
    """``{(layer, head): role}`` of a ``headlab roles --json`` run, its unclassified heads
    left out; with ``heads_per_layer`` (the model's), checked to be a run of that layout.

    Raises:
        InputError: a run of another head layout, a head outside it, an unknown role.
    """
    what = f"roles run of {data.get('model')!r}"
    if heads_per_layer is not None:
        theirs = data.get("heads_in_layer")
        if theirs is not None and list(theirs) != list(heads_per_layer):
            raise InputError(
                f"{what}: heads per layer {list(theirs)}, the model has {list(heads_per_layer)}"
                ": give the roles run of this model"
            )
    out: dict[tuple[int, int], str] = {}
    for h in data["heads"]:
        try:
            layer, head, role = int(h["layer"]), int(h["head"]), h.get("role")
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{what}: each head needs an integer layer and head") from None
        if heads_per_layer is not None and not (
            0 <= layer < len(heads_per_layer) and 0 <= head < heads_per_layer[layer]
        ):
            raise InputError(f"{what}: head {layer}.{head} is not in the model")
        if role is not None and role != UNCLASSIFIED and role not in ROLES:
            raise InputError(
                f"{what}: head {layer}.{head} has role {role!r}, expected one of "
                f"{', '.join(ROLES)} or {UNCLASSIFIED}"
            )
        if role not in (None, UNCLASSIFIED):
            out[(layer, head)] = str(role)
    return out


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


def head_classes(
    lm: LoadedModel,
    task: Task,
    heads: list[tuple[int, int]],
    *,
    roles: dict[tuple[int, int], str] | None = None,
    progress: Progress | None = None,
) -> tuple[dict[tuple[int, int], dict[str, Any]], bool]:
    """Each of ``heads``' class and evidence on ``task``, and whether the prompts are
    IOI-shaped (else every head is ``unexplained`` with what was measured). ``roles``: each
    head's role by ``headlab roles`` (:func:`roles_by_head`), evidence for the induction,
    duplicate-token and previous-token classes beside the attention on these prompts."""
    dla = direct_logit_attribution(lm, task, progress=progress).dla
    attention = _attention_evidence(lm, task)
    if attention is None:
        out = {h: {"class": "unexplained", "dla": round(float(dla[h]), 4)} for h in heads}
        return out, False
    largest = float(dla.nan_to_num(0.0).abs().max())
    candidates = [
        (layer, head)
        for layer, head in heads
        if float(dla[layer, head]) >= DLA_SHARE * largest
        and float(attention["end_to_io"][layer, head]) >= ATTENDS
    ]
    copying = _name_copying(lm, task, candidates)
    first = _classify(heads, dla, copying, attention, None, roles)
    movers = sorted(
        (h for h, info in first.items() if info["class"] == "name mover"),
        key=lambda h: -float(dla[h]),
    )[:PATH_RECEIVERS]
    paths: torch.Tensor | None = None
    for layer, head in movers:
        senders = [h for h in heads if h[0] < layer]
        if not senders:
            continue
        result = path_patching(
            lm, task, Receiver("q", layer, head), senders=senders, progress=progress
        )
        effects = result.effects.nan_to_num(float("-inf"))
        paths = effects if paths is None else torch.maximum(paths, effects)
    if paths is not None:
        paths = paths.masked_fill(torch.isinf(paths), float("nan"))
    return _classify(heads, dla, copying, attention, paths, roles), True


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
    progress: Progress | None = None,
) -> CircuitResult:
    """Score every edge on ``task``, measure circuits of growing size on ``eval_task``, keep
    the smallest reaching ``target`` and name its heads' classes (with ``classes``).

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
    scores = edge_scores(lm, task, method=method, steps=steps, graph=graph, progress=progress)
    curve = faithfulness_curve(lm, scores, eval_task, sizes=sizes, search=search, progress=progress)
    reached = [i for i, f in enumerate(curve.faithfulness) if f >= target]
    chosen = (
        min(reached, key=lambda i: curve.edges[i])
        if reached
        else max(range(len(curve.edges)), key=lambda i: (curve.faithfulness[i], -curve.edges[i]))
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
    the faithfulness curve, the circuit kept, its heads by class and its ``top`` edges."""
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
