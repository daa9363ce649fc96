"""``headlab compose``: which earlier heads each head reads, by Q-, K- and V-composition."""

from __future__ import annotations

import argparse
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
    p.add_argument("--json", action="store_true", help="every pair, best first, as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.causal.composition import KINDS, composition_scores

    if args.model is None:
        args.model = DEFAULT_MODEL
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    lm = load_model(args)
    scores = composition_scores(lm)
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
