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

    from headlab.outputs import write_bytes_atomic

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
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130)
    plt.close(fig)
    return write_bytes_atomic(Path(path), buffer.getvalue())
