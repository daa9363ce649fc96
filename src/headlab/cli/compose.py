"""``headlab compose``: which earlier heads each head reads, by Q-, K- and V-composition."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headlab.cli._args import integer, text
from headlab.cli._model import MODEL_HELP, add_model_arguments, load_model
from headlab.cli._output import console, emit_json
from headlab.models.names import DECODER

DEFAULT_MODEL = DECODER


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "compose",
        help="which earlier heads each head reads: Q-, K- and V-composition scores",
        description=(
            "Composition scores (Elhage et al. 2021) of every pair of heads in layers l1 < l2: "
            "how much of what the earlier head writes (its OV circuit) the later head reads "
            "through its queries, keys or values, as ||W(h2) W_OV(h1)||_F / (||W(h2)||_F "
            "||W_OV(h1)||_F), against a baseline of random matrices of the same shapes. Weights "
            "only: no data, no forward pass. Default: SmolLM2-135M."
        ),
    )
    p.add_argument("--model", type=text("a model"), help=f"{MODEL_HELP}; here default smollm2")
    add_model_arguments(p)
    p.add_argument("--top", type=integer(1, 10_000), default=10, help="pairs listed (default 10)")
    p.add_argument(
        "--receivers",
        type=text("heads such as 17.3,17.4"),
        help="list, for each of these heads (LAYER.HEAD, comma-separated), the earlier heads it "
        "reads most by --kind composition",
    )
    p.add_argument(
        "--kind", choices=("q", "k", "v"), default="k", help="with --receivers (default k)"
    )
    p.add_argument(
        "--figure",
        type=text("a file"),
        help="with --receivers: a PNG of what each receiver reads from every earlier head",
    )
    p.add_argument("--json", action="store_true", help="every pair, best first, as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.causal.composition import (
        KINDS,
        check_receivers,
        composition_scores,
        parse_heads,
    )
    from headlab.errors import InputError

    if args.model is None:
        args.model = DEFAULT_MODEL
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    receivers = parse_heads(args.receivers) if args.receivers else None
    if args.figure and receivers is None:
        raise InputError("--figure draws the heads of --receivers: add --receivers L.H,...")
    lm = load_model(args)
    if receivers is not None:
        check_receivers(lm, receivers)
    scores = composition_scores(lm)
    if receivers is not None:
        return _run_receivers(args, lm, scores, receivers)
    if args.json:
        emit_json(scores.to_json())
        return 0
    from rich.table import Table

    out = console()
    names = {"q": "Q-composition", "k": "K-composition", "v": "V-composition"}
    for kind in KINDS:
        base = scores.baseline[kind]
        table = Table(title=f"{names[kind]} of {lm.name}: top {args.top} (baseline {base:.3f})")
        for column in ("sender", "receiver", "score", "x baseline"):
            table.add_column(column, justify="right")
        for pair in scores.top_pairs(kind, args.top):
            s, r = pair["sender"], pair["receiver"]
            table.add_row(
                f"{s['layer']}.{s['head']}",
                f"{r['layer']}.{r['head']}",
                f"{pair['score']:.3f}",
                f"{pair['score'] / base:.2f}",
            )
        out.print(table)
    return 0


def _run_receivers(
    args: argparse.Namespace, lm: Any, scores: Any, receivers: list[tuple[int, int]]
) -> int:
    """Each receiver's strongest senders by ``--kind`` composition (JSON, a table, a figure)."""
    from headlab.causal.composition import receiver_senders

    base = scores.baseline[args.kind]
    out = receiver_senders(lm, scores, args.kind, receivers, args.top)
    if args.figure:
        from headlab.causal.figure import write_composition

        write_composition(scores, args.kind, receivers, args.figure)
        print(f"wrote {args.figure}", file=sys.stderr)
    if args.json:
        emit_json({"model": lm.name, "kind": args.kind, "baseline": base, "receivers": out})
        return 0
    from rich.table import Table

    title = (
        f"{args.kind.upper()}-composition of {lm.name}: what each head reads (baseline {base:.3f})"
    )
    shown = Table(title=title)
    for column in ("receiver", f"top {args.top} senders (x baseline)"):
        shown.add_column(column)
    for row in out:
        r = row["receiver"]
        senders = ", ".join(
            f"{s['layer']}.{s['head']} {s['x_baseline']:.1f}" for s in row["senders"]
        )
        shown.add_row(f"{r['layer']}.{r['head']}", senders)
    console().print(shown)
    return 0
