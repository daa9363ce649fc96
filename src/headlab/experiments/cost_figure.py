"""``headlab experiment cost``'s figure: forward time and peak forward memory against the head
count, one line per path (matplotlib, Agg backend; no display needed). The request writes it
(:class:`headlab.experiments.cost_request.CostRequest`), and the report draws it in its folder.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from headlab.outputs import write_bytes_atomic

#: each path's label, colour and line style
COST_PATHS = {
    "torch": ("torch, no weights", "#bab0ac", "--"),
    "fused": ("headlab fused", "#4e79a7", "-"),
    "torch_weights": ("torch, weights", "#f28e2b", "--"),
    "weights": ("headlab, weights kept", "#e15759", "-"),
    "loop": ("loop over heads", "#59a14f", ":"),
}


def cost_figure(data: dict[str, Any], path: str | Path) -> Path:
    """``headlab experiment cost``'s JSON as a PNG: for each length, forward time and peak
    forward memory against the head count (log x), one line per path; written atomically."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = list(dict.fromkeys(r["length"] for r in data["rows"]))
    fig, axes = plt.subplots(2, len(lengths), figsize=(5.0 * len(lengths), 7.0), squeeze=False)
    for col, length in enumerate(lengths):
        rows = [r for r in data["rows"] if r["length"] == length]
        heads = [r["heads"] for r in rows]
        for key, (label, colour, style) in COST_PATHS.items():
            times = [1000 * r["forward_s"][key] for r in rows]
            mib = [r["memory_forward"][key] / 2**20 for r in rows]
            axes[0][col].plot(heads, times, style, marker="o", color=colour, label=label)
            axes[1][col].plot(heads, mib, style, marker="o", color=colour, label=label)
        weights = [r["weights_bytes"] / 2**20 for r in rows]
        axes[1][col].plot(heads, weights, color="#999999", lw=0.8, label="H x T x T fp32")
        for row, ylabel in ((0, "forward time (ms)"), (1, "peak forward memory (MiB)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(heads, [str(h) for h in heads])
            ax.set_xlabel("heads (same width: thinner as they multiply)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        axes[0][col].set_title(
            f"width {data['options']['width']}, {length} tokens, {data['device']}", fontsize=9
        )
    axes[0][0].legend(fontsize=8)
    axes[1][0].legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    return write_bytes_atomic(path, buffer.getvalue())
