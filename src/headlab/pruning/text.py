"""What ``headlab prune`` shows a person, built from a result's JSON: the pruning curve (with
what the removed KV heads save in a causal model's cache), the recovered points, what pruning
saved when a model was written, and the comparison of importance methods.

Each function returns :data:`headlab.text.Part` s (tables and lines) that the CLI prints with
``headlab.cli._output.show``; a notebook can show the same text without the CLI.
"""

from __future__ import annotations

from typing import Any

from headlab.pruning.methods import removed_within
from headlab.text import Part, human_bytes, table


def metric_label(result: dict[str, Any]) -> str:
    """``metric (unit)``, or the metric alone where its unit is its name (perplexity)."""
    metric, unit = str(result["metric"]), str(result["unit"])
    return metric if unit == metric else f"{metric} ({unit})"


def curve_text(result: dict[str, Any]) -> list[Part]:
    """The curve of :meth:`PruneResult.to_json`: one row per step (heads removed, the metric,
    its loss; for a causal model the KV cache per token and at ``kv_context`` tokens), a line
    per recovered point, then, when a model was written, what pruning saved and where."""
    curve, total = result["curve"], result["heads_before"]
    kv = "kv_bytes_per_token" in curve[0]  # causal models: what the removed KV heads save
    context = result.get("kv_context")
    columns = ["step", "heads removed", "share", metric_label(result), "loss"]
    if kv:
        columns += ["KV cache / token"] + ([f"KV cache at {context:,} tokens"] if context else [])
    rows = []
    for p in curve:
        cells = [
            str(p["step"]),
            f"{p['heads_removed']} / {total}",
            f"{100 * p['fraction']:.0f}%",
            f"{p['metric']:.2f}",
            f"{p['loss']:+.2f}",
        ]
        if kv:
            saved = 1 - p["kv_bytes_per_token"] / curve[0]["kv_bytes_per_token"]
            cells.append(f"{human_bytes(p['kv_bytes_per_token'])} (-{100 * saved:.0f}%)")
        if kv and context:
            cells.append(human_bytes(p["kv_bytes_at_context"]))
        rows.append(cells)
    title = f"{result['model']}: pruning curve ({result['importance']} importance)"
    out: list[Part] = [table(columns, rows, title=title, right=range(len(columns)))]
    metric = result["metric"]
    for r in result.get("recovered", []):
        out.append(
            f"recovered at {r['heads_removed']} heads removed ({r['steps']} steps, "
            f"{r['seconds']:.0f} s): {metric} {r['metric_before']:.2f} -> {r['metric_after']:.2f}"
        )
    if "heads_after" in result:
        out += _saved_text(result)
    return out


def _saved_text(result: dict[str, Any]) -> list[Part]:
    """What a written model saved: heads, the metric, parameters, bytes, time and FLOPs."""
    metric = result["metric"]
    out: list[Part] = [
        f"pruned {result['heads_before']} -> {result['heads_after']} heads "
        f"(per layer {result['heads_per_layer']}); {metric} "
        f"{result['metric_before']:.2f} -> {result['metric_after']:.2f}\n"
        f"parameters {result['params_before']:,} -> {result['params_after']:,}; weights "
        f"{human_bytes(result['bytes_before'])} -> {human_bytes(result['bytes_after'])}\n"
        f"forward ({result['timed_batch'][0]} x {result['timed_batch'][1]} tokens) "
        f"{result['time_before_ms']:.1f} ms -> {result['time_after_ms']:.1f} ms; "
        f"{100 * result['flops_removed_share']:.1f}% of the FLOPs removed\n"
        f"saved to {result['out']}; loads with {' and '.join(result['loads_with'])}"
    ]
    r = result.get("recovery")
    if r is not None:
        out.append(
            f"recovery ({r['steps']} steps, {r['seconds']:.0f} s): {metric} "
            f"{r['metric_before']:.2f} -> {r['metric_after']:.2f} (saved after recovery)"
        )
    return out


def compare_text(result: dict[str, Any], figure: str | None = None) -> list[Part]:
    """A comparison of importance methods (:func:`~headlab.pruning.methods.compare_methods`):
    per method, the most heads removed within 1 metric point of the unpruned model, without
    and with recovery; its notes, and the ``figure`` written."""

    total = result["heads_before"]
    rows = []
    for m in result["methods"]:
        cells = [m["importance"]]
        for curve in (m["curve"], m.get("recovered", [])):
            best = removed_within(curve, 1.0)
            removed = None if best is None else best["heads_removed"]
            cells.append(
                "-" if removed is None else f"{removed} / {total} ({100 * removed / total:.0f}%)"
            )
        rows.append(cells)
    columns = ("importance", "most heads removed within 1 point", "with recovery")
    title = f"{result['model']}: {metric_label(result)}, unpruned {result['metric_before']:.2f}"
    out: list[Part] = [table(columns, rows, title=title, right=range(3))]
    out += [f"note: {note}" for note in result.get("notes", [])]
    if figure:
        out.append(f"figure: {figure}")
    return out
