"""``headlab experiment cost``: what several thin heads cost against one wide head."""

from __future__ import annotations

import argparse

from headlab.cli._output import emit_json, show
from headlab.cli._progress import progress_for


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
    g.add_argument("--width", type=int, help="model width E (default 768)")
    g.add_argument(
        "--model",
        help="take the width of this model (a catalog name, config.json or folder, smollm2, a "
        ".gguf file) and add its head count to --heads",
    )
    g.add_argument(
        "--heads",
        type=_ints,
        help="head counts, e.g. 1,4,16 (default 1,2,4,8,12,16,32,64: those dividing the width)",
    )
    g.add_argument("--lengths", type=_ints, help="input lengths (default 512,2048)")
    g.add_argument("--batch", type=int, help="sequences per call (default 1)")
    g.add_argument("--device", help="cpu or cuda (default cpu; one-vs-many takes it too)")
    g.add_argument("--rounds", type=int, help="rounds of alternating timing blocks (default 3)")
    g.add_argument("--no-backward", action="store_true", help="time the forward only")
    g.add_argument("--figure", help="write a PNG of time and memory against heads")


def run(args: argparse.Namespace) -> int:
    from headlab.experiments.cost import run_cost
    from headlab.experiments.cost_text import cost_options, cost_text

    names = ("width", "heads", "lengths", "batch", "device", "rounds", "model", "quick")
    opts = cost_options(backward=not args.no_backward, **{n: getattr(args, n) for n in names})
    with progress_for(args, "headlab experiment cost") as progress:
        result = run_cost(opts, progress=progress).to_json()
    if args.figure:
        from headlab.report.figures import cost_figure

        cost_figure(result, args.figure)
    if args.json:
        emit_json(result)
    else:
        show(cost_text(result))
    return 0
