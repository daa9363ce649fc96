"""``headlab experiment cost``: what several thin heads cost against one wide head."""

from __future__ import annotations

import argparse
from typing import Any

from headlab.cli._output import console, emit_json, human_bytes, human_count
from headlab.errors import InputError


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers separated by commas, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one number, got {text!r}")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``experiment cost`` (ignored by the other experiments)."""
    g = p.add_argument_group("cost")
    g.add_argument("--width", type=int, default=None, help="model width E (default 768)")
    g.add_argument(
        "--model",
        default=None,
        help="take the width of this model (a catalog name, config.json or folder, smollm2, a "
        ".gguf file) and add its head count to --heads",
    )
    g.add_argument(
        "--heads",
        type=_ints,
        default=None,
        help="head counts, e.g. 1,4,16 (default 1,2,4,8,12,16,32,64: those dividing the width)",
    )
    g.add_argument("--lengths", type=_ints, default=None, help="input lengths (default 512,2048)")
    g.add_argument("--batch", type=int, default=None, help="sequences per call (default 1)")
    g.add_argument(
        "--device", default=None, help="cpu or cuda (default cpu; one-vs-many takes it too)"
    )
    g.add_argument(
        "--rounds", type=int, default=None, help="rounds of alternating timing blocks (default 2)"
    )
    g.add_argument("--no-backward", action="store_true", help="time the forward only")
    g.add_argument("--figure", default=None, help="write a PNG of time and memory against heads")


def run(args: argparse.Namespace) -> int:
    from headlab.cli._progress import progress_for
    from headlab.experiments.cost import CostOptions, run_cost

    given: dict[str, Any] = {}
    for name in ("width", "heads", "lengths", "batch", "device", "rounds"):
        if getattr(args, name) is not None:
            given[name] = getattr(args, name)
    if args.no_backward:
        given["backward"] = False
    if getattr(args, "model", None):
        from headlab.layout import layout_from_config
        from headlab.models.names import config_of

        if "width" in given:
            raise InputError("give --model (its width) or --width, not both")
        label, config = config_of(args.model)
        layout = layout_from_config(config)
        given["width"] = layout.d_model
        if layout.d_model != layout.n_heads * layout.head_dim:
            raise InputError(
                f"{label}: heads x head width ({layout.n_heads} x {layout.head_dim}) is not the "
                f"model width {layout.d_model}; the cost experiment splits the width into heads"
            )
        quick = tuple(h for h in (1, 4, 16) if layout.d_model % h == 0)
        heads = given.get("heads") or (
            quick if args.quick else CostOptions.default_heads(layout.d_model)
        )
        given["heads"] = tuple(sorted({*heads, layout.n_heads}))
    if "width" in given and "heads" not in given and not args.quick:
        given["heads"] = CostOptions.default_heads(given["width"])
        if not given["heads"]:
            raise InputError(f"none of the default head counts divides width {given['width']}")
    opts = CostOptions.quick(**given) if args.quick else CostOptions(**given)

    with progress_for(args, "headlab experiment cost") as progress:
        result = run_cost(opts, progress=progress)
    if args.figure:
        from headlab.report.figures import cost_figure

        cost_figure(result.to_json(), args.figure)
    if args.json:
        emit_json(result.to_json())
        return 0
    _print_tables(result.to_json())
    return 0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _print_tables(data: dict[str, Any]) -> None:
    from rich.table import Table

    con = console()
    o = data["options"]
    rows = data["rows"]
    flops = Table(
        title=f"parameters and FLOPs by part, width {o['width']}, batch {o['batch']} "
        "(matrix products as headlab spec counts them; softmax beside)"
    )
    for col in (
        "T",
        "heads x D",
        "params (headlab = torch)",
        "projections",
        "scores",
        "softmax",
        "values",
        "output",
        "spec total",
    ):
        flops.add_column(col, justify="right")
    for r in rows:
        f = r["flops"]
        ours, theirs = r["params"]["headlab"], r["params"]["torch"]
        flops.add_row(
            str(r["length"]),
            f"{r['heads']} x {r['head_dim']}",
            f"{ours:,}" if ours == theirs else f"{ours:,} / {theirs:,}",
            *(human_count(f[k]) for k in ("projections", "scores", "softmax", "values", "output")),
            human_count(r["spec_flops"]),
        )
    con.print(flops)

    timing = Table(
        title=f"time (ms, medians) and ratios measured in the same run, on {data['device']}"
    )
    for col in (
        "T",
        "heads",
        "fused fwd",
        "vs torch",
        "weights fwd",
        "vs torch",
        "fused fwd+bwd",
        "vs torch",
        "weights fwd+bwd",
        "vs torch",
        "loop fwd",
        "loop / fused",
    ):
        timing.add_column(col, justify="right")
    for r in rows:
        t, b, q = r["forward_s"], r["forward_backward_s"], r["ratios"]
        timing.add_row(
            str(r["length"]),
            str(r["heads"]),
            _ms(t["fused"]),
            _x(q["fused_vs_torch"]),
            _ms(t["weights"]),
            _x(q["weights_vs_torch"]),
            _ms(b["fused"]),
            _x(q["fused_vs_torch_fb"]),
            _ms(b["weights"]),
            _x(q["weights_vs_torch_fb"]),
            _ms(t["loop"]),
            _x(q["loop_vs_fused"]),
        )
    con.print(timing)

    mem = Table(title="peak memory of one call, beyond its inputs and weights")
    for col in (
        "T",
        "heads",
        "H x T x T fp32",
        "fused fwd",
        "weights fwd",
        "torch fwd",
        "torch weights fwd",
        "loop fwd",
        "fused fwd+bwd",
        "weights fwd+bwd",
    ):
        mem.add_column(col, justify="right")
    for r in rows:
        m, mb = r["memory_forward"], r["memory_forward_backward"]
        mem.add_row(
            str(r["length"]),
            str(r["heads"]),
            human_bytes(r["weights_bytes"]),
            human_bytes(m["fused"]),
            human_bytes(m["weights"]),
            human_bytes(m["torch"]),
            human_bytes(m["torch_weights"]),
            human_bytes(m["loop"]),
            "-" if mb["fused"] is None else human_bytes(mb["fused"]),
            "-" if mb["weights"] is None else human_bytes(mb["weights"]),
        )
    con.print(mem)
    con.print(f"memory: {data['memory_method']}")
    con.print(f"timing: {data['timing_method']}; {data['wall_s']:.0f} s in all")
