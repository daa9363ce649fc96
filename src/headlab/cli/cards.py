"""``headlab cards``: one card per head, joining what headlab measures of it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headlab.cli._args import integer, listed, text
from headlab.cli._causal import TASKS, add_model, request
from headlab.cli._model import load_model
from headlab.cli._output import note, output
from headlab.cli._progress import progress_for
from headlab.experiments.card_verdict import cards_text
from headlab.models.names import resolve


def _task(value: str) -> str:
    if value not in TASKS:
        raise argparse.ArgumentTypeError(f"expected {' or '.join(TASKS)}, got {value!r}")
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cards",
        help="one card per head: where it looks, what it reads, writes and does, what it costs",
        description=(
            "For every head, one card joining headlab's own measurements: its roles (the cached "
            "roles run, else one measured now), its strongest Q-, K- and V-composition senders, "
            "the tokens its OV circuit promotes and suppresses, its copying score, its direct "
            "logit attribution and activation-patching effect on the built-in tasks, its share "
            "of attention FLOPs and KV cache and its pruning importance; and a one-line verdict "
            "by stated rules. --json names the command that reproduces every field. "
            "Default: SmolLM2-135M."
        ),
    )
    add_model(p)
    p.add_argument(
        "--roles",
        type=text("a roles JSON file"),
        metavar="FILE.json",
        help="a headlab roles --json run of the model (default: its cached run, else measured)",
    )
    p.add_argument(
        "--limit",
        type=integer(1, 10_000_000),
        help="measure the roles here on this many sentences, the cached run aside (default: "
        "the cached run, else the whole bundled sample)",
    )
    p.add_argument(
        "--tasks",
        type=listed(_task, "built-in tasks", "ioi,induction"),
        default=("ioi", "induction"),
        help="built-in tasks patched (default ioi,induction)",
    )
    p.add_argument(
        "--n", type=integer(1, 100_000), default=24, help="prompts per task (default 24)"
    )
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=0, help="their seed (default 0)")
    p.add_argument(
        "--position",
        choices=("last", "all"),
        default="last",
        help="where each head is patched: the last token, where the answer is read (default; "
        "about 6x faster on SmolLM2), or every position",
    )
    p.add_argument(
        "--top", type=integer(1, 100), default=5, help="tokens promoted and suppressed listed"
    )
    p.add_argument(
        "--examples",
        type=integer(0, 10_000),
        default=40,
        help="UD EWT sentences searched for each head's top 3 examples (default 40; 0: none)",
    )
    for part, what in (
        ("roles", "the roles (no roles run read or measured)"),
        ("patch", "activation patching on the tasks (the slowest part)"),
        ("dla", "direct logit attribution on the tasks"),
        ("compose", "the composition senders"),
        ("importance", "the pruning importance"),
    ):
        p.add_argument(f"--no-{part}", action="store_true", help=f"leave out {what}")
    p.add_argument(
        "--html",
        type=text("an .html path"),
        help="write the offline atlas: a grid of heads, every card, filters, permalinks #L.H",
    )
    p.add_argument("--json", action="store_true", help="every card, as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.experiments.cards import CardsRequest
    from headlab.roles.workflow import keep_roles

    asked = request(CardsRequest, args)  # every check before the model loads
    lm = load_model(args, with_lm_head=bool(resolve(args.model).causal))
    with progress_for(args, "headlab cards") as progress:
        cards = asked.run(lm, progress, notify=lambda line: note("headlab cards", line))
    if cards.roles_measured is not None:
        kept = keep_roles(cards.roles_measured)  # as headlab roles keeps its run
        if kept:
            note("headlab cards", kept)
    data = cards.to_json()
    if args.html:  # written by the run
        print(f"wrote {args.html}", file=sys.stderr)
    output(args, data, lambda: cards_text(data))
    return 0
