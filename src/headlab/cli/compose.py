"""``headlab compose``: which earlier heads each head reads, by Q-, K- and V-composition."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headlab.cli._args import integer, text
from headlab.cli._causal import add_model, add_outputs, request
from headlab.cli._model import load_model
from headlab.cli._output import output


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
    add_model(p)
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
    add_outputs(
        p,
        "with --receivers: a PNG of what each receiver reads from every earlier head",
        json="every pair, best first, as JSON",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.causal.request import ComposeRequest
    from headlab.causal.text import compose_text

    composing = request(ComposeRequest, args)  # --receivers parsed before the model loads
    result = composing.run(load_model(args))
    if args.figure and composing.heads is not None:
        print(f"wrote {args.figure}", file=sys.stderr)
    output(args, result.to_json(), lambda: compose_text(result, args.top))
    return 0
