"""The figure of ``headlab prune --curve --compare``, as PNG, written atomically: one curve per
importance method (gradient, ablation, L0), each with its recovered points."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from headlab.outputs import write_bytes_atomic

#: each importance method's colour (another method: green)
METHOD_COLOURS = {"gradient": "#4e79a7", "ablation": "#f28e2b", "l0": "#e15759"}


def pruning_compare(data: dict[str, Any], path: str | Path) -> Path:
    """``headlab prune --curve --compare``'s JSON as a PNG, written atomically: the metric
    against the share of heads removed (or KV-cache bytes per token, ``x: kv-bytes``), one line
    per importance method, its recovered points as open markers joined to the curve point they
    started from; the unpruned model's metric and one point below it as guides."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kv = data.get("x") == "kv-bytes"
    fig, ax = plt.subplots(figsize=(6.4, 4.2))

    def x_of(method: dict[str, Any], point: dict[str, Any]) -> float:
        if not kv:
            return 100 * point["fraction"]
        by_step = {p["step"]: p for p in method["curve"]}
        return by_step[point["step"]]["kv_bytes_per_token"]

    for method in data["methods"]:
        name = method["importance"]
        colour = METHOD_COLOURS.get(name, "#59a14f")
        curve = method["curve"]
        ax.plot(
            [x_of(method, p) for p in curve],
            [p["metric"] for p in curve],
            marker="o",
            ms=3,
            color=colour,
            label=name,
        )
        rec = method.get("recovered", [])
        for p in rec:
            x = x_of(method, p)
            ax.plot([x, x], [p["metric_before"], p["metric_after"]], ":", color=colour, lw=1)
        if rec:
            ax.plot(
                [x_of(method, p) for p in rec],
                [p["metric_after"] for p in rec],
                "D",
                mfc="white",
                color=colour,
                label=f"{name} + recovery ({rec[0]['steps']} steps)",
            )
    base = data["metric_before"]
    sign = -1 if data.get("higher_is_better", True) else 1
    ax.axhline(base, color="#777777", lw=0.8)
    ax.axhline(base + sign, color="#777777", lw=0.8, ls="--", label="1 point from unpruned")
    if kv:
        ax.set_xlabel("KV-cache bytes per token")
        ax.invert_xaxis()
    else:
        ax.set_xlabel("heads removed (%)")
    ax.set_ylabel(f"{data['metric']} ({data['unit']})")
    ax.set_title(f"{data['model']}: importance methods compared", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130)
    plt.close(fig)
    return write_bytes_atomic(Path(path), buffer.getvalue())
