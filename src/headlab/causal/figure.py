"""Causal figures as PNG, written atomically: the patching heatmap (layers x heads, each cell a
head's signed effect), composition rows, and a circuit drawn as a graph."""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path
from typing import Any

from headlab.outputs import write_bytes_atomic


def heatmap_bound(effects: Any) -> float:
    """The heatmap's colour scale, symmetric: the effects are shares of the logit difference,
    so the scale is +-1 (a largest effect of 0.013 stays pale), wider only where an effect
    exceeds it (heads overlap: one can remove more than the whole difference)."""
    finite = abs(effects[effects == effects])
    return max(1.0, float(finite.max(initial=0.0)))


def label_colour(value: float, bound: float) -> str:
    """White on the darkest cells of the red-blue map, black elsewhere (readable on both)."""
    return "white" if abs(value) > 0.55 * bound else "black"


def write_heatmap(result: Any, path: str | Path, *, label: int = 5) -> Path:
    """Draw ``result`` (a :class:`~headlab.causal.patching.PatchingResult`) as a layers x heads
    heatmap, red where a head carries the behaviour, blue where it works against it, on a fixed
    scale (:func:`heatmap_bound`); the ``label`` heads of largest absolute effect carry their
    value; every layer is labelled; the title names what was patched, where and from what.
    Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    effects = result.effects.double().numpy()  # (L, H), NaN where a layer has no such head
    n_layers, n_heads = effects.shape
    bound = heatmap_bound(effects)
    # wide and tall enough for the two-line title and the colour bar's label on a small model
    size = (max(6.4, 0.42 * n_heads + 2.6), max(3.6, 0.22 * n_layers + 1.6))
    fig, ax = plt.subplots(figsize=size)
    image = ax.imshow(
        effects, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto", origin="lower"
    )
    for layer, head, value in result.top(label):
        ax.text(
            head,
            layer,
            f"{value:+.2f}",
            ha="center",
            va="center",
            fontsize=6,
            color=label_colour(value, bound),
        )
    unit = "KV head" if result.unit == "kv_head" else "head"
    ax.set_xlabel(unit)
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers), [str(x) for x in range(n_layers)], fontsize=6)
    ax.set_title("\n".join(heatmap_title(result)), fontsize=8)
    fig.colorbar(image, ax=ax, label=EFFECT_LABEL)
    return _save(fig, path)


#: what the heatmap's colour means, on its colour bar and its notebook legend
EFFECT_LABEL = "effect (share of the logit difference removed)"


def heatmap_title(result: Any) -> tuple[str, str]:
    """The heatmap's title, in the PNG and the notebook alike: what was patched, where and
    from what; then the model, the task, the logit differences and the prompts."""
    parts = {"z": "head outputs", "q": "queries", "k": "keys", "v": "values"}
    what = parts.get(result.component, result.component)
    where = "every position" if result.position is None else f"position {result.position}"
    source = {"corrupt": "the corrupted run", "mean": "the mean", "resample": "another prompt"}
    return (
        f"{result.method} patching of {what} at {where}, from "
        f"{source.get(result.source, result.source)}",
        f"{result.model}, {result.task}: LD clean {result.clean:.2f}, corrupt "
        f"{result.corrupt:.2f} ({result.n_prompts} prompts)",
    )


def composition_grid(
    table: Any, senders: list[tuple[int, int]], receivers: list[tuple[int, int]]
) -> Any:
    """``(receivers, senders)`` scores over the baseline, NaN where the sender is not in an
    earlier layer than the receiver (a pair that cannot compose: drawn grey, never as 0)."""
    import numpy as np

    return np.array(
        [[table[la, h, rl, rh] if la < rl else np.nan for la, h in senders] for rl, rh in receivers]
    )


def write_composition(
    scores: Any,
    kind: str,
    receivers: list[tuple[int, int]],
    path: str | Path,
    *,
    marked: dict[str, list[tuple[int, int]]] | None = None,
) -> Path:
    """Draw what each of ``receivers`` reads from every earlier head by ``kind``-composition
    (:class:`~headlab.causal.composition.CompositionScores`): one row a receiver, one column a
    sender head (layer by layer), each cell its score over the baseline; each row's strongest
    sender is labelled. ``marked``: senders to outline, by name (e.g. the previous-token heads
    that roles names). Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    table = scores.scores(kind).double().numpy() / scores.baseline[kind]  # (L, H, L, H)
    n_heads = table.shape[1]
    last = max(layer for layer, _ in receivers)
    senders = [(la, h) for la in range(last) for h in range(n_heads)]
    grid = composition_grid(table, senders, receivers)
    fig, ax = plt.subplots(
        figsize=(min(18.0, 0.05 * len(senders) + 3.5), 0.4 * len(receivers) + 1.8)
    )
    # a sender at or above the receiver: no such pair, grey rather than "reads 0"
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto", vmin=0.0)
    for row, values in enumerate(grid):
        best = int(np.nanargmax(values))
        la, h = senders[best]
        ax.text(best, row, f" {la}.{h}", ha="left", va="center", fontsize=7, color="white")
    colours = ("#ff5a36", "#ffd23f", "#ffffff")
    for (name, heads), colour in zip((marked or {}).items(), colours, strict=False):
        columns = [senders.index(x) for x in heads if x in senders]
        for column in columns:
            ax.axvline(column, color=colour, linewidth=0.8, alpha=0.8)
        if columns:
            ax.plot([], [], color=colour, label=name)
    if marked:
        ax.legend(loc="upper left", bbox_to_anchor=(1.12, 1.0), fontsize=7, frameon=False)
    ax.set_yticks(range(len(receivers)), [f"{la}.{h}" for la, h in receivers])
    ticks = list(range(0, len(senders), n_heads * max(1, last // 10)))
    ax.set_xticks(ticks, [str(senders[t][0]) for t in ticks])
    ax.set_xlabel("sender head (by layer)")
    ax.set_ylabel("receiver head")
    names = {"q": "Q", "k": "K", "v": "V"}
    ax.set_title(
        f"{names[kind]}-composition of {scores.model}: what each receiver reads "
        f"(score / random baseline {scores.baseline[kind]:.3f})",
        fontsize=9,
    )
    fig.colorbar(image, ax=ax, label="x baseline")
    return _save(fig, path)


#: the colour of each head class, in the figure and in the circuit's page
CLASS_COLOURS = {
    "name mover": "#d62728",
    "negative name mover": "#9467bd",
    "s-inhibition": "#ff7f0e",
    "induction": "#2ca02c",
    "duplicate token": "#17becf",
    "previous token": "#8c564b",
    "unexplained": "#9e9e9e",
}
#: a head whose class was not measured (headlab circuit --no-classes)
UNNAMED_COLOUR = "#6baed6"
#: every head carries its name in a circuit of at most this many heads; in a larger one the
#: :data:`LABEL_TOP` of largest |effect| and every head a class names do, the rest are listed
LABEL_ALL, LABEL_TOP = 60, 20


def head_effects(data: dict[str, Any]) -> dict[str, float]:
    """Each head node's effect (``headlab circuit --json``): its estimated share of the logit
    difference (the node's ``effect``); in a result written before nodes carried it, its
    direct logit attribution where classes were measured, else 0."""
    dla = {f"{h['layer']}.{h['head']}": h.get("dla") for h in data.get("heads", [])}
    out = {}
    for n in data["nodes"]:
        if n["kind"] == "head":
            value = n.get("effect")
            out[n["name"]] = float(value if value is not None else dla.get(n["name"]) or 0.0)
    return out


def labelled_heads(data: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The heads the drawing names and the heads it lists instead, each by decreasing |effect|
    (:func:`head_effects`): all named in a circuit of at most :data:`LABEL_ALL` heads; else the
    :data:`LABEL_TOP` of largest |effect| and every head a class names (not unexplained)."""
    effects = head_effects(data)
    order = sorted(effects, key=lambda name: -abs(effects[name]))
    if len(order) <= LABEL_ALL:
        return order, []
    named = {n["name"] for n in data["nodes"] if n["class"] not in (None, "unexplained")}
    top = set(order[:LABEL_TOP]) | named
    return [h for h in order if h in top], [h for h in order if h not in top]


def circuit_layout(data: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Where each node of a circuit is drawn, in head columns and layer rows: the embeddings
    below layer 0 and the logits above the last, both centred; a head at its layer's row and
    its column; the MLP of layer L in the half row above its heads (it reads after them),
    between two head columns, staggered over three so that the MLPs' edges do not run along
    one line."""
    nodes = data["nodes"]
    top = max((n["layer"] for n in nodes if n["layer"] is not None), default=0)
    width = max((n["head"] + 1 for n in nodes if n["kind"] == "head"), default=1)
    centre = (width - 1) / 2
    pos: dict[str, tuple[float, float]] = {}
    for n in nodes:
        if n["kind"] == "embed":
            pos[n["name"]] = (centre, -1.0)
        elif n["kind"] == "logits":
            pos[n["name"]] = (centre, top + 1.0)
        elif n["kind"] == "mlp":
            # between two head columns, clear of the heads' names
            x = math.floor(centre + (n["layer"] % 3 - 1) * max(1.0, width / 4)) + 0.5
            pos[n["name"]] = (max(-0.5, min(x, width - 0.5)), n["layer"] + 0.5)
        else:
            pos[n["name"]] = (float(n["head"]), float(n["layer"]))
    return pos


def _receiver_nodes(name: str, present: set[str], group: list[int]) -> list[str]:
    """The drawn nodes a receiver belongs to: ``q:L.H`` its head, ``k:L.G``/``v:L.G`` the heads
    of KV group ``G``, ``mlp L`` and ``logits`` themselves (a head that sends along no edge of
    the circuit is not drawn, nor are the edges into it)."""
    if name == "logits" or name.startswith("mlp "):
        return [name] if name in present else []
    kind, rest = name.split(":")
    layer, index = (int(x) for x in rest.split("."))
    if kind == "q":
        heads: Any = [f"{layer}.{index}"]
    else:
        size = group[layer]
        heads = (f"{layer}.{h}" for h in range(index * size, (index + 1) * size))
    return [h for h in heads if h in present]


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def circuit_notes(data: dict[str, Any], listed: list[str]) -> str:
    """The lines under the drawing: the heads of the circuit it lists instead of naming, and
    the heads left out of it that a reader should hear of (the JSON's ``left_out``)."""
    lines = []
    if listed:
        names = ", ".join(listed)
        lines.append(f"Also in the circuit, unlabelled ({len(listed)}, by |effect|): {names}")
    out = data.get("left_out") or []
    if out:
        names = "; ".join(
            f"{h['layer']}.{h['head']} (effect {h['effect']:+.2f}, {_ordinal(h['rank'])} of "
            f"{h['of']})"
            for h in out
        )
        lines.append(f"Not in the circuit: {names}")
    return "\n".join(textwrap.fill(line, 150) for line in lines)


def write_circuit(data: dict[str, Any], path: str | Path, *, max_edges: int = 400) -> Path:
    """Draw a circuit (``headlab circuit --json``) as a graph: the embeddings at the bottom, the
    logits at the top, a layer a row (:func:`circuit_layout`); heads as dots coloured by class,
    named by :func:`labelled_heads` (the rest and the heads left out listed below), MLPs as
    squares; the ``max_edges`` strongest edges as lines as wide as their |score|, orange where
    corrupting the edge lowers the logit difference, blue where it raises it. Written
    atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = data["nodes"]
    pos = circuit_layout(data)
    top = max((n["layer"] for n in nodes if n["layer"] is not None), default=0)
    width = max((n["head"] + 1 for n in nodes if n["kind"] == "head"), default=1)
    edges = data["edges"][:max_edges]
    most = max((abs(e["score"]) for e in edges), default=1.0) or 1.0
    labelled, listed = labelled_heads(data)
    notes = circuit_notes(data, listed)
    extra = 0.11 * (notes.count("\n") + 1) if notes else 0.0
    fig, ax = plt.subplots(figsize=(max(6.4, 0.55 * width + 3.4), 0.26 * top + 2.6 + extra))
    present = set(pos)
    for e in edges:
        x0, y0 = pos[e["sender"]]
        for target in _receiver_nodes(e["receiver"], present, data["group_size"]):
            x1, y1 = pos[target]
            ax.plot(
                [x0, x1], [y0, y1], color="#e6550d" if e["score"] < 0 else "#3182bd",
                linewidth=0.3 + 3.0 * abs(e["score"]) / most, alpha=0.45, zorder=1,
            )  # fmt: skip
    named = set(labelled)
    for n in nodes:
        x, y = pos[n["name"]]
        if n["kind"] == "mlp":
            ax.scatter([x], [y], marker="s", s=30, color="#bdbdbd", edgecolor="#555555", zorder=2)
            continue
        if n["kind"] == "head":
            colour = CLASS_COLOURS.get(n["class"], UNNAMED_COLOUR) if n["class"] else UNNAMED_COLOUR
        else:
            colour = "#333333"
        ax.scatter([x], [y], s=70 if n["kind"] == "head" else 140, color=colour, zorder=2)
        if n["kind"] != "head":  # the ends: their name beside them, clear of the lines
            ax.annotate(
                n["name"], (x, y), xytext=(9, 0), textcoords="offset points", fontsize=7,
                va="center", ha="left",
            )  # fmt: skip
        elif n["name"] in named:
            ax.annotate(
                n["name"], (x, y), xytext=(0, 6), textcoords="offset points", fontsize=5.5,
                va="bottom", ha="center", zorder=3,
            )  # fmt: skip
    for colour, meaning in (("#e6550d", "corrupting lowers LD"), ("#3182bd", "raises LD")):
        ax.plot([], [], color=colour, linewidth=2, label=meaning)
    ax.scatter(
        [], [], marker="s", s=30, color="#bdbdbd", edgecolor="#555555",
        label="MLP, above its layer's heads",
    )  # fmt: skip
    for name in (c for c in CLASS_COLOURS if c in data["classes"]):
        ax.scatter([], [], color=CLASS_COLOURS[name], label=name)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    ax.set_yticks(
        range(top + 1), [str(i) if i % max(1, top // 15) == 0 else "" for i in range(top + 1)]
    )
    ax.set_xticks([])
    ax.set_ylabel("layer")
    if notes:
        ax.set_xlabel(notes, fontsize=5.5, loc="left", labelpad=6)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    c = data["circuit"]
    drawn = (
        f"{len(edges)} strongest of {len(data['edges'])} edges"
        if len(data["edges"]) > len(edges)
        else f"{len(edges)} edges"
    )
    ax.set_title(
        f"{data['model']}, {data['task']}: {c['edges']} of {data['edges_total']} edges keep "
        f"{c['faithfulness']:.0%} held out ({drawn} drawn)",
        fontsize=8,
    )
    return _save(fig, path)


def _save(fig: Any, path: str | Path) -> Path:
    """``fig`` as a PNG at ``path``, written atomically; the figure is closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130)
    plt.close(fig)
    return write_bytes_atomic(Path(path), buffer.getvalue())
