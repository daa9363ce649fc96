"""The classes of a circuit's heads, named from evidence on IOI-shaped prompts (the answer
once before the end, the distractor twice: the indirect object and the subject of Wang et al.
2022), by the classes of the IOI paper where measurements support them (:data:`CLASS_RULES`), in
this order:

- ``name mover``: positive direct logit attribution (at least :data:`DLA_SHARE` of the largest),
  the last position attends to the indirect object (at least :data:`ATTENDS`) more than to the
  subject, and it copies it (:func:`name_copying`);
- ``negative name mover``: the same attention, negative direct logit attribution;
- ``s-inhibition``: its path into the strongest name movers' queries carries at least
  :data:`PATH_SHARE` of the largest such path (path patching, Wang et al. Appendix B);
- ``induction``: at the subject's second occurrence it attends to the token after the first;
- ``duplicate token``: at the subject's second occurrence it attends to the first;
- ``previous token``: every position attends to the one before (mean, :data:`PREVIOUS`);
- ``unexplained``: none of these measured.

A ``headlab roles`` run (:func:`roles_by_head`) adds its induction, duplicate-token and
previous-token heads as evidence. Classes are tendencies measured on these prompts, not
assignments; every number is in the result.
"""

from __future__ import annotations

from typing import Any

import torch

from headlab.causal.dla import direct_logit_attribution
from headlab.causal.graph import build_graph
from headlab.causal.paths import Receiver, path_patching
from headlab.causal.tasks import Task
from headlab.errors import InputError
from headlab.models.capture import HeadCapture
from headlab.models.loading import LoadedModel
from headlab.progress import Progress
from headlab.roles import registry
from headlab.roles.classify import ROLES, UNCLASSIFIED

#: the classes a role names too, in the order a head is checked against them, each with its
#: evidence on these prompts; a class's name and bar are its role's (:mod:`headlab.roles.registry`
#: says why previous token's bar differs from the role's)
ROLE_CLASSES = (
    (registry.role("induction"), "s2_to_after_s1"),
    (registry.role("duplicate-token"), "s2_to_s1"),
    (registry.role("previous-token"), "previous"),
)
INDUCTION, DUPLICATE, PREVIOUS_TOKEN = (role for role, _ in ROLE_CLASSES)
#: each such class's bar on its evidence
CLASS_BARS = {role.circuit_class: role.class_bar or 0.0 for role, _ in ROLE_CLASSES}
#: the classes, in the order a head is checked against them
CLASSES = (
    "name mover",
    "negative name mover",
    "s-inhibition",
    *(role.circuit_class for role, _ in ROLE_CLASSES),
    "unexplained",
)
#: a name mover's |direct logit attribution|, as a share of the largest head's
DLA_SHARE = 0.1
#: mean attention weight that counts as "attends to" (a uniform row of these prompts: ~0.07)
ATTENDS = 0.3
#: mean attention to the previous token that makes a previous-token head
PREVIOUS = CLASS_BARS[PREVIOUS_TOKEN.circuit_class]
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
    INDUCTION.circuit_class: "at the subject's second occurrence attends to the token after "
    f"its first >= {CLASS_BARS[INDUCTION.circuit_class]}, or headlab roles names it an induction head",
    DUPLICATE.circuit_class: "at the subject's second occurrence attends to its first >= "
    f"{CLASS_BARS[DUPLICATE.circuit_class]}, or headlab roles names it a duplicate-token head",
    PREVIOUS_TOKEN.circuit_class: f"mean attention to the previous token >= {PREVIOUS}, or "
    "headlab roles names it a previous-token head",
    "unexplained": "in the circuit; none of the measurements above",
}


def answer_positions(ids: list[int], answer: int, distractor: int) -> tuple[int, int, int] | None:
    """(indirect object, subject's first, subject's second occurrence) in an IOI-shaped
    prompt, or ``None``."""
    io = [i for i, t in enumerate(ids) if t == answer]
    s = [i for i, t in enumerate(ids) if t == distractor]
    if len(io) != 1 or len(s) != 2 or s[0] + 1 >= len(ids):
        return None
    return io[0], s[0], s[1]


def attention_evidence(lm: LoadedModel, task: Task) -> dict[str, torch.Tensor] | None:
    """Per head ``(L, H)``: mean attention from the last position to the indirect object and
    to the subject, at the subject's second occurrence to its first and to the token after it,
    and to the previous token; ``None`` unless every prompt is IOI-shaped."""
    n_layers, width = lm.n_layers, max(lm.layout.heads_per_layer)
    keys = ("end_to_io", "end_to_s", "s2_to_s1", "s2_to_after_s1", "previous")
    sums = {k: torch.zeros(n_layers, width, dtype=torch.float64) for k in keys}
    count = 0
    for batch in task.batches:
        rows = [
            answer_positions(ids, int(a), int(d))
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


def name_copying(lm: LoadedModel, task: Task, heads: list[tuple[int, int]]) -> torch.Tensor:
    """``(L, H)``: for each of ``heads``, the share of prompts in which what it reads at the
    indirect object (its value vector there, through its columns of the output projection,
    the gain of a post-norm block's norm on the attention's output, the final norm's gain and
    the unembedding) ranks the indirect object among the top
    :data:`TOP_LOGITS` logits (Wang et al. 2022's copying score, on the prompts' own
    residual stream); NaN for every other head."""
    out = torch.full(
        (lm.n_layers, max(lm.layout.heads_per_layer)), float("nan"), dtype=torch.float64
    )
    if not heads:
        return out
    w_u = lm.model.get_output_embeddings().weight.detach()  # (V, E)
    graph = build_graph(lm)
    gain = graph.final_gain
    layers = sorted({layer for layer, _ in heads})
    hits = torch.zeros_like(out).nan_to_num(0.0)
    total = 0
    for batch in task.batches:
        rows = [
            answer_positions(ids, int(a), int(d))
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
            post = graph.blocks[layer].attention_out
            post_gain = None if post is None else post.gain  # its 1 / rms: no change of rank
            if post_gain is not None:
                written = written * post_gain.to(written)
            if isinstance(gain, torch.Tensor):
                written = written * gain.detach().to(written)
            top = (written @ w_u.to(written).t()).topk(TOP_LOGITS, dim=-1).indices  # (B, k)
            hit = (top == batch.answer.to(top.device)[:, None]).any(dim=-1)
            hits[layer, head] += float(hit.sum())
        total += len(rows)
    for layer, head in heads:
        out[layer, head] = hits[layer, head] / total
    return out


def classify(
    heads: list[tuple[int, int]],
    dla: torch.Tensor,
    copying: torch.Tensor,
    attention: dict[str, torch.Tensor],
    paths: torch.Tensor | None,
    roles: dict[tuple[int, int], str] | None = None,
) -> dict[tuple[int, int], dict[str, Any]]:
    """Each of ``heads``' class by :data:`CLASS_RULES`, checked in the order of
    :data:`CLASSES`, beside the numbers it was named from: direct logit attribution ``dla``,
    ``copying`` (:func:`name_copying`), ``attention`` (:func:`attention_evidence`), ``paths``
    into the name movers' queries (``None``: not measured yet) and its role in ``roles``."""
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
        else:  # a role's class: its evidence here clears the class's bar, or roles names it
            kind = next(
                (
                    r.circuit_class
                    for r, key in ROLE_CLASSES
                    if (e[key] or 0.0) >= CLASS_BARS[r.circuit_class] or role == r.name
                ),
                "unexplained",
            )
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


def head_classes(
    lm: LoadedModel,
    task: Task,
    heads: list[tuple[int, int]],
    *,
    roles: dict[tuple[int, int], str] | None = None,
    progress: Progress | None = None,
    paths: bool = True,
) -> tuple[dict[tuple[int, int], dict[str, Any]], bool]:
    """Each of ``heads``' class and evidence on ``task``, and whether the prompts are
    IOI-shaped (else every head is ``unexplained`` with what was measured). ``roles``: each
    head's role by ``headlab roles`` (:func:`roles_by_head`), evidence for the induction,
    duplicate-token and previous-token classes beside the attention on these prompts.
    ``paths=False`` leaves out path patching into the name movers: no head is then named
    ``s-inhibition``."""
    dla = direct_logit_attribution(lm, task, progress=progress).dla
    attention = attention_evidence(lm, task)
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
    copying = name_copying(lm, task, candidates)
    first = classify(heads, dla, copying, attention, None, roles)
    movers = sorted(
        (h for h, info in first.items() if info["class"] == "name mover"),
        key=lambda h: -float(dla[h]),
    )[: PATH_RECEIVERS if paths else 0]
    into: torch.Tensor | None = None
    for layer, head in movers:
        senders = [h for h in heads if h[0] < layer]
        if not senders:
            continue
        result = path_patching(
            lm, task, Receiver("q", layer, head), senders=senders, progress=progress
        )
        effects = result.effects.nan_to_num(float("-inf"))
        into = effects if into is None else torch.maximum(into, effects)
    if into is not None:
        into = into.masked_fill(torch.isinf(into), float("nan"))
    return classify(heads, dla, copying, attention, into, roles), True
