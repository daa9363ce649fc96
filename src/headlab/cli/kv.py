"""``headlab kv``: which KV heads need the whole context, and the smaller KV cache the others
allow (:mod:`headlab.experiments.kv`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headlab.cli._args import integer, listed, number, seed, text
from headlab.cli._causal import add_model, request
from headlab.cli._model import load_model
from headlab.cli._output import output
from headlab.cli._progress import progress_for


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "kv",
        help="which KV heads need the whole context: scores, and a cache that keeps less",
        description=(
            "Scores every KV head (the maximum over the query heads that share it) by the share "
            "of attention outside the first --sink and the last --window tokens on long text "
            "(DuoAttention's criterion, without training) and by copying from the needle on "
            "passkey prompts (the retrieval score of Wu et al. 2024); makes the --fraction of KV "
            "heads that score lowest on both streaming (they keep only the sink and the window) and "
            "reads one --context of text through that mixed cache and through the full one: "
            "the bytes each holds and the perplexity. Default: SmolLM2-135M on the bundled "
            "TinyShakespeare sample."
        ),
    )
    add_model(p)
    p.add_argument(
        "--score",
        choices=("outside", "retrieval", "both", "random"),
        default="both",
        help="what chooses the streaming heads: outside, retrieval, both (a head is needed when "
        "either score says so: their maximum; the default, best on SmolLM2's curve) or random",
    )
    p.add_argument(
        "--fraction",
        type=number(0.0, 1.0),
        default=0.5,
        help="share of KV heads made streaming, 0 to 1 (default 0.5)",
    )
    p.add_argument(
        "--window",
        type=integer(1, 10**7),
        default=256,
        help="the last tokens a streaming head sees, its own included (default 256)",
    )
    p.add_argument(
        "--sink", type=integer(0, 10**7), default=4, help="the first tokens it keeps (default 4)"
    )
    p.add_argument(
        "--context",
        type=integer(2, 10**7),
        default=1024,
        help="tokens per text chunk and passkey prompt (default 1024)",
    )
    p.add_argument(
        "--texts", type=integer(1, 10**5), default=2, help="text chunks scored (default 2)"
    )
    p.add_argument(
        "--passkeys", type=integer(1, 10**5), default=8, help="passkey prompts scored (default 8)"
    )
    p.add_argument(
        "--text",
        type=text("a text file"),
        help="a UTF-8 text file (default: the bundled TinyShakespeare sample)",
    )
    p.add_argument("--seed", type=seed, default=0, help="passkeys and random heads (default 0)")
    p.add_argument(
        "--heads-from",
        type=text("a JSON file"),
        metavar="FILE.json",
        help="use the streaming heads a --heads-out file names instead of choosing",
    )
    p.add_argument(
        "--heads-out",
        type=text("a .json path"),
        metavar="FILE.json",
        help="write the chosen heads as JSON (a later --heads-from reads it)",
    )
    p.add_argument(
        "--duo-out",
        type=text("a folder"),
        metavar="FOLDER",
        help="also write the set as DuoAttention's attention pattern (full_attention_heads.tsv "
        "and config.json with sink_size and recent_size)",
    )
    p.add_argument(
        "--curve",
        type=listed(number(0.0, 1.0), "fractions separated by commas", "0.25,0.5,0.75"),
        metavar="F,F,...",
        help="also measure heads chosen by --score and at random at these fractions: KV bytes, "
        "passkey accuracy (--passkeys prompts other than those scored), perplexity, ms per token",
    )
    p.add_argument(
        "--decode",
        type=integer(2, 10**5),
        default=16,
        help="with --curve: greedy tokens timed per point (default 16)",
    )
    p.add_argument("--top", type=integer(1, 10_000), default=10, help="heads listed (10)")
    p.add_argument("--json", action="store_true", help="scores per KV head, the set, the costs")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.experiments.kv import KVRequest, kv_text

    asked = request(KVRequest, args)  # every check before the model loads
    lm = load_model(args, with_lm_head=True)
    with progress_for(args, "headlab kv") as progress:
        data = asked.run(lm, progress).to_json()
    for path in (args.heads_out, args.duo_out):
        if path:
            print(f"wrote {path}", file=sys.stderr)
    output(args, data, lambda: kv_text(data, args.top))
    return 0
