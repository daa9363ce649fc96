"""What the report's page shows of a patching result (``headlab patch --json``) and a circuit
(``headlab circuit --json``) beside their figures, each in its own section: every head's
effect and rank, the circuit's heads by class, and the heads patching ranks high that the
circuit leaves out. The head grid links each head that appears in them to its section.

Example:
    >>> patch = {"model": "m", "task": "ioi", "component": "z", "metric": {"clean": 3.0,
    ...     "corrupt": 0.0}, "heads": [{"layer": 0, "head": 0, "effect": 0.1},
    ...     {"layer": 1, "head": 0, "effect": -0.5}]}
    >>> [(r["layer"], r["head"], r["rank"]) for r in patched_heads(patch, [1, 1])["top"]]
    [(1, 0, 1), (0, 0, 2)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: heads of largest |effect| the patching section lists, and that the circuit's section checks
#: are in the circuit
TOP_PATCHED = 10


def _rows(patching: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The unit (``head``, or ``kv_head`` for keys and values) and the rows, by |effect|."""
    unit = "head" if "heads" in patching else "kv_head"
    rows = patching.get("heads") or patching.get("kv_heads") or []
    ranked = sorted(rows, key=lambda r: -abs(float(r["effect"])))
    return unit, [
        {"layer": int(r["layer"]), unit: int(r[unit]), "effect": float(r["effect"]), "rank": i + 1}
        for i, r in enumerate(ranked)
    ]


def patched_heads(patching: dict[str, Any], heads_in_layer: Sequence[int]) -> dict[str, Any]:
    """The page's view of a patching result: ``top``, the :data:`TOP_PATCHED` rows of largest
    |effect| (each with its rank); ``heads``, every query head of the grid with the effect and
    rank of what was patched in it (for keys and values its KV head, ``kv_head``)."""
    unit, rows = _rows(patching)
    heads = []
    kv_in_layer: dict[int, int] = {}
    for r in rows:
        kv_in_layer[r["layer"]] = max(kv_in_layer.get(r["layer"], 0), r[unit] + 1)
    for r in rows:
        if unit == "head":
            heads.append({"layer": r["layer"], "head": r["head"], **_effect(r)})
            continue
        size = max(1, heads_in_layer[r["layer"]] // kv_in_layer[r["layer"]])
        for h in range(r[unit] * size, (r[unit] + 1) * size):
            heads.append({"layer": r["layer"], "head": h, "kv_head": r[unit], **_effect(r)})
    return {
        "task": patching.get("task"),
        "component": patching.get("component", "z"),
        "unit": unit,
        "count": len(rows),
        "top": rows[:TOP_PATCHED],
        "heads": heads,
    }


def _effect(row: dict[str, Any]) -> dict[str, Any]:
    return {"effect": row["effect"], "rank": row["rank"]}


def circuit_heads(circuit: dict[str, Any], patching: dict[str, Any] | None) -> dict[str, Any]:
    """The page's view of a circuit: its size and faithfulness, every head in it with its class
    and direct logit attribution where measured, and ``left_out``: the heads among the
    :data:`TOP_PATCHED` of a patching result of the same model (query heads' outputs) that the
    circuit does not keep, with their effect and rank; without one, the circuit's own
    ``left_out`` (effects estimated from the edges; ``left_out_by`` says which)."""
    heads = [
        {
            "layer": int(h["layer"]),
            "head": int(h["head"]),
            "class": h.get("class"),
            "dla": h.get("dla"),
        }
        for h in circuit.get("heads", [])
    ]
    kept = {(h["layer"], h["head"]) for h in heads}
    if patching is not None and "heads" in patching:
        _, rows = _rows(patching)
        left_out = [r for r in rows[:TOP_PATCHED] if (r["layer"], r["head"]) not in kept]
        by = "patching"
    else:  # the circuit's own: effects estimated from the edges (headlab circuit's left_out)
        left_out = [
            {k: h[k] for k in ("layer", "head", "effect", "rank")}
            for h in circuit.get("left_out", [])
        ]
        by = "edges"
    c = circuit["circuit"]
    return {
        "task": circuit["task"],
        "edges": c["edges"],
        "edges_total": circuit["edges_total"],
        "faithfulness": c["faithfulness"],
        "heads": heads,
        "left_out": left_out,
        # what ranks them: a patching result given with the circuit, else the circuit's edges
        "left_out_by": by,
    }


def left_out_text(view: dict[str, Any]) -> str:
    """What the circuit's caption says of the heads patching ranks high that it leaves out:
    "; not in the circuit though patching gives them the effects: 27.7 +0.31 (4th), ..."."""
    if not view["left_out"]:
        return ""
    named = ", ".join(
        f"{r['layer']}.{r['head']} {r['effect']:+.2f} ({_ordinal(r['rank'])})"
        for r in view["left_out"]
    )
    if view.get("left_out_by") == "edges":
        return (
            f". Not in the circuit (effects estimated from their edges, rank by |effect|): {named}"
        )
    return f". Not in the circuit though patching ranks them in its top {TOP_PATCHED}: {named}"


def _ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
