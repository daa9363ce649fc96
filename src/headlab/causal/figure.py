"""The patching heatmap: layers x heads, each cell a head's signed effect (PNG, atomically)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any


def write_heatmap(result: Any, path: str | Path, *, label: int = 5) -> Path:
    """Draw ``result`` (a :class:`~headlab.causal.patching.PatchingResult`) as a layers x heads
    heatmap, red where a head carries the behaviour, blue where it works against it; the
    ``label`` heads of largest absolute effect carry their value. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    effects = result.effects.double().numpy()  # (L, H), NaN where a layer has no such head
    n_layers, n_heads = effects.shape
    bound = float(abs(effects[effects == effects]).max(initial=0.0)) or 1.0
    fig, ax = plt.subplots(figsize=(0.42 * n_heads + 2.6, 0.22 * n_layers + 1.6))
    image = ax.imshow(
        effects, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto", origin="lower"
    )
    for layer, head, value in result.top(label):
        ax.text(head, layer, f"{value:+.2f}", ha="center", va="center", fontsize=6)
    unit = "KV head" if result.unit == "kv_head" else "head"
    ax.set_xlabel(unit)
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    step = max(1, n_layers // 15)
    ax.set_yticks(range(0, n_layers, step))
    ax.set_title(
        f"{result.method} patching, {result.model}, {result.task}\n"
        f"LD clean {result.clean:.2f}, corrupt {result.corrupt:.2f} ({result.n_prompts} prompts)",
        fontsize=8,
    )
    fig.colorbar(image, ax=ax, label="effect (share of the logit difference removed)")
    return _save(fig, path)


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
    grid = np.array([[table[la, h, rl, rh] for la, h in senders] for rl, rh in receivers])
    fig, ax = plt.subplots(
        figsize=(min(18.0, 0.05 * len(senders) + 3.5), 0.4 * len(receivers) + 1.8)
    )
    image = ax.imshow(np.nan_to_num(grid, nan=0.0), cmap="viridis", aspect="auto", vmin=0.0)
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


def _save(fig: Any, path: str | Path) -> Path:
    """``fig`` as a PNG at ``path``, written atomically; the figure is closed."""
    import matplotlib.pyplot as plt

    from headlab.outputs import write_bytes_atomic

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130)
    plt.close(fig)
    return write_bytes_atomic(Path(path), buffer.getvalue())
