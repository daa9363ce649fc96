"""PNG figures for papers and slides (matplotlib, Agg backend; no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.models.analysis import pattern_from_bytes
from headlab.page.styles import role_styles


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def role_grid(data: dict[str, Any], path: Path) -> Path:
    """Layers x heads, coloured by primary role, stability as the letter's opacity."""
    plt = _plt()
    from matplotlib.patches import Patch

    roles = data["roles"]
    styles = role_styles(list(roles["role_counts"]))
    n_layers, n_heads = roles["layers"], roles["heads_per_layer"]
    fig, ax = plt.subplots(figsize=(0.5 * n_heads + 2.5, 0.45 * n_layers + 1.6))
    for h in roles["heads"]:
        x, y = h["head"], h["layer"]
        style = styles[h["role"]]
        ax.add_patch(plt.Rectangle((x, y), 1, 1, facecolor=style["colour"], edgecolor="#666666"))
        alpha = 1.0 if h["stability"] is None else 0.3 + 0.7 * h["stability"]
        ax.text(x + 0.5, y + 0.5, style["letter"], ha="center", va="center", alpha=alpha)
    ax.set_xlim(0, n_heads)
    ax.set_ylim(n_layers, 0)
    ax.set_xticks([i + 0.5 for i in range(n_heads)], [str(i) for i in range(n_heads)])
    ax.set_yticks([i + 0.5 for i in range(n_layers)], [str(i) for i in range(n_layers)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"{data['model']}: primary role of each head (faint letter = unstable)")
    present = [r for r in styles if roles["role_counts"].get(r)]
    ax.legend(
        handles=[
            Patch(facecolor=styles[r]["colour"], edgecolor="#666666", label=r) for r in present
        ],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def heatmap(sentence: dict[str, Any], layer: int, head: int, path: Path, title: str) -> Path:
    """One head's word-level pattern on one sentence."""
    plt = _plt()
    words = sentence["words"]

    p = pattern_from_bytes(sentence["patterns"][layer], head, len(words)).numpy()
    size = max(4.0, 0.35 * len(words) + 1.5)
    fig, ax = plt.subplots(figsize=(size, size))
    image = ax.imshow(p, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    ax.set_xticks(range(len(words)), words, rotation=90, fontsize=8)
    ax.set_yticks(range(len(words)), words, fontsize=8)
    ax.set_xlabel("attended word")
    ax.set_ylabel("attending word")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def pruning_curve(pruning: dict[str, Any], path: Path) -> Path:
    """Metric against the share of heads removed; beside it, when every point carries
    ``kv_bytes_per_token`` (a decoder's curve), the metric against the KV cache it leaves."""
    plt = _plt()
    curve = pruning["curve"]
    kv = all(isinstance(p.get("kv_bytes_per_token"), int | float) for p in curve)
    fig, axes = plt.subplots(1, 2 if kv else 1, figsize=(9.4 if kv else 5, 3.4), squeeze=False)
    ax = axes[0][0]
    metric = [p["metric"] for p in curve]
    ax.plot([100 * p["fraction"] for p in curve], metric, marker="o")
    ax.set_xlabel("heads removed (%)")
    ax.set_ylabel(f"{pruning['metric']} ({pruning['unit']})")
    ax.set_title(
        f"{pruning['model']}: pruning curve ({pruning['importance']} importance)", fontsize=10
    )
    ax.grid(alpha=0.3)
    if pruning["metric"] == "perplexity":  # it grows about exponentially as heads go
        ax.set_yscale("log")
    if kv:
        right = axes[0][1]
        right.plot([p["kv_bytes_per_token"] / 1024 for p in curve], metric, marker="o")
        right.invert_xaxis()  # pruning moves right, as on the left
        right.set_xlabel("KV-cache KiB per token (all layers)")
        right.set_title("the same curve against the KV cache left", fontsize=10)
        right.grid(alpha=0.3)
        right.set_yscale(ax.get_yscale())
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
