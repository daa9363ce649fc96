"""What ``headlab experiment cost`` asks for and shows: the grid chosen from the options given
(a model's width and head count, the quick grid), and the tables a person reads of its JSON.

Example:
    >>> from headlab.experiments.cost import run_cost
    >>> from headlab.experiments.cost_text import cost_options, cost_text
    >>> opts = cost_options(width=64, heads=(1, 4), lengths=(16,))
    >>> parts = cost_text(run_cost(opts).to_json())  # three tables and two lines
"""

from __future__ import annotations

from typing import Any

from headlab.errors import InputError
from headlab.experiments.cost import CostOptions
from headlab.layout import layout_from_config
from headlab.models.names import config_of
from headlab.text import Part, human_bytes, human_count, table


def cost_options(
    *,
    width: int | None = None,
    heads: tuple[int, ...] | None = None,
    lengths: tuple[int, ...] | None = None,
    batch: int | None = None,
    device: str | None = None,
    rounds: int | None = None,
    backward: bool = True,
    model: str | None = None,
    quick: bool = False,
) -> CostOptions:
    """The grid of a cost run: what is given (``None``: the default), the width and head count
    of ``model`` (a catalog name, config.json or folder, a .gguf file) where one is named, and
    for a width without head counts the default counts that divide it; ``quick`` starts from
    :meth:`CostOptions.quick`.

    Raises:
        InputError: both a model and a width; a model whose heads do not split its width; a
            width none of the default head counts divides.
    """
    named = {"width": width, "heads": heads, "lengths": lengths, "batch": batch}
    given: dict[str, Any] = {k: v for k, v in named.items() if v is not None}
    given |= {k: v for k, v in {"device": device, "rounds": rounds}.items() if v is not None}
    if not backward:
        given["backward"] = False
    if model:
        if "width" in given:
            raise InputError("give --model (its width) or --width, not both")
        label, config = config_of(model)
        layout = layout_from_config(config)
        given["width"] = layout.d_model
        if layout.d_model != layout.n_heads * layout.head_dim:
            raise InputError(
                f"{label}: heads x head width ({layout.n_heads} x {layout.head_dim}) is not the "
                f"model width {layout.d_model}; the cost experiment splits the width into heads"
            )
        few = tuple(h for h in (1, 4, 16) if layout.d_model % h == 0)
        counts = given.get("heads") or (few if quick else CostOptions.default_heads(layout.d_model))
        given["heads"] = tuple(sorted({*counts, layout.n_heads}))
    if "width" in given and "heads" not in given and not quick:
        given["heads"] = CostOptions.default_heads(given["width"])
        if not given["heads"]:
            raise InputError(f"none of the default head counts divides width {given['width']}")
    return CostOptions.quick(**given) if quick else CostOptions(**given)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _bytes(n: int | None) -> str:
    return "-" if n is None else human_bytes(n)


def cost_text(data: dict[str, Any]) -> list[Part]:
    """What ``headlab experiment cost`` prints of its JSON (:meth:`CostResult.to_json`):
    parameters and FLOPs by part, times and ratios, peak memory (one row per head count and
    length each), then how memory and time were measured."""
    o, rows = data["options"], data["rows"]
    parts = ("projections", "scores", "softmax", "values", "output")
    flops = []
    for r in rows:
        ours, theirs = r["params"]["headlab"], r["params"]["torch"]
        flops.append(
            (
                r["length"],
                f"{r['heads']} x {r['head_dim']}",
                f"{ours:,}" if ours == theirs else f"{ours:,} / {theirs:,}",
                *(human_count(r["flops"][k]) for k in parts),
                human_count(r["spec_flops"]),
            )
        )
    timing = []
    for r in rows:
        t, b, q = r["forward_s"], r["forward_backward_s"], r["ratios"]
        timing.append(
            (
                *(r["length"], r["heads"], _ms(t["fused"]), _x(q["fused_vs_torch"])),
                *(_ms(t["weights"]), _x(q["weights_vs_torch"])),
                *(_ms(b["fused"]), _x(q["fused_vs_torch_fb"])),
                *(_ms(b["weights"]), _x(q["weights_vs_torch_fb"])),
                *(_ms(t["loop"]), _x(q["loop_vs_fused"])),
            )
        )
    memory = []
    for r in rows:
        m, mb = r["memory_forward"], r["memory_forward_backward"]
        paths = ("fused", "weights", "torch", "torch_weights", "loop")
        memory.append(
            (
                *(r["length"], r["heads"], human_bytes(r["weights_bytes"])),
                *(human_bytes(m[k]) for k in paths),
                *(_bytes(mb["fused"]), _bytes(mb["weights"])),
            )
        )
    vs = "vs torch"
    return [
        table(
            ("T", "heads x D", "params (headlab = torch)", *parts, "spec total"),
            flops,
            title=f"parameters and FLOPs by part, width {o['width']}, batch {o['batch']} "
            "(matrix products as headlab spec counts them; softmax beside)",
            right=range(9),
        ),
        table(
            (
                *("T", "heads", "fused fwd", vs, "weights fwd", vs, "fused fwd+bwd", vs),
                *("weights fwd+bwd", vs, "loop fwd", "loop / fused"),
            ),
            timing,
            title=f"time (ms, medians) and ratios measured in the same run, on {data['device']}",
            right=range(12),
        ),
        table(
            (
                *("T", "heads", "H x T x T fp32", "fused fwd", "weights fwd", "torch fwd"),
                *("torch weights fwd", "loop fwd", "fused fwd+bwd", "weights fwd+bwd"),
            ),
            memory,
            title="peak memory of one call, beyond its inputs and weights",
            right=range(10),
        ),
        f"memory: {data['memory_method']}",
        f"timing: {data['timing_method']}; {data['wall_s']:.0f} s in all",
    ]
