"""PNG figures for papers and slides (matplotlib, Agg backend; no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROLE_COLOURS = {
    "positional": "#4e79a7",
    "delimiter": "#bab0ac",
    "rare-token": "#edc948",
    "syntactic": "#59a14f",
    "coreference": "#e15759",
    "broad": "#f28e2b",
    "induction": "#b07aa1",
    "unclassified": "#ffffff",
}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def role_grid(data: dict[str, Any], path: Path) -> Path:
    """Layers x heads, coloured by dominant role, stability as the letter's opacity."""
    plt = _plt()
    from matplotlib.patches import Patch

    from headlab.roles.classify import LETTERS

    roles = data["roles"]
    n_layers, n_heads = roles["layers"], roles["heads_per_layer"]
    fig, ax = plt.subplots(figsize=(0.5 * n_heads + 2.5, 0.45 * n_layers + 1.6))
    for h in roles["heads"]:
        x, y = h["head"], h["layer"]
        ax.add_patch(
            plt.Rectangle((x, y), 1, 1, facecolor=ROLE_COLOURS[h["role"]], edgecolor="#666666")
        )
        alpha = 1.0 if h["stability"] is None else 0.3 + 0.7 * h["stability"]
        ax.text(x + 0.5, y + 0.5, LETTERS[h["role"]], ha="center", va="center", alpha=alpha)
    ax.set_xlim(0, n_heads)
    ax.set_ylim(n_layers, 0)
    ax.set_xticks([i + 0.5 for i in range(n_heads)], [str(i) for i in range(n_heads)])
    ax.set_yticks([i + 0.5 for i in range(n_layers)], [str(i) for i in range(n_layers)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"{data['model']}: dominant role of each head (faint letter = unstable)")
    present = [r for r in ROLE_COLOURS if roles["role_counts"].get(r)]
    ax.legend(
        handles=[Patch(facecolor=ROLE_COLOURS[r], edgecolor="#666666", label=r) for r in present],
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
    p = sentence["patterns"][layer][head]
    size = max(4.0, 0.35 * len(words) + 1.5)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(p, cmap="Blues", vmin=0.0, vmax=1.0)
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
    """Metric against the share of heads removed."""
    plt = _plt()
    curve = pruning["curve"]
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.plot([100 * p["fraction"] for p in curve], [p["metric"] for p in curve], marker="o")
    ax.set_xlabel("heads removed (%)")
    ax.set_ylabel(f"{pruning['metric']} ({pruning['unit']})")
    ax.set_title(f"{pruning['model']}: pruning curve ({pruning['importance']} importance)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
