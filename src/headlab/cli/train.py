"""``headlab train``: train a small causal language model with headlab's own attention."""

from __future__ import annotations

import argparse
from typing import Any

from headlab.cli._args import integer, seed, text
from headlab.cli._model import quiet_downloads
from headlab.cli._output import emit_json
from headlab.cli._progress import progress_for


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="train a small causal language model on a text file",
        description=(
            "Train a GPT-2-style model built on headlab's MultiHeadAttention (AdamW, warm-up and "
            "cosine schedule, seeded and deterministic on CPU) on the first 90% of a text file, "
            "with a byte-level BPE tokenizer trained on the same part; report perplexity on the "
            "rest. The folder loads with headlab (roles, heads, prune) and with transformers."
        ),
    )
    add = p.add_argument
    add(
        "--text", required=True, type=text("a file"), help="a UTF-8 text file, e.g. TinyShakespeare"
    )
    add("--out", required=True, type=text("a folder"), help="output folder (refused if it exists)")
    add("--overwrite", action="store_true", help="replace an --out folder headlab wrote")
    add("--d-model", type=integer(1, 4096), default=128, help="model width (default 128)")
    add("--layers", type=integer(1, 64), default=4, help="transformer blocks (default 4)")
    add("--heads", type=integer(1, 4096), default=4, help="attention heads per block (default 4)")
    window = integer(2, 4096)
    add("--context", type=window, default=128, help="tokens per training window (default 128)")
    add(
        "--vocab",
        type=integer(257, 65536),
        default=1024,
        help="BPE vocabulary size, 257 (bytes and an end token) or more (default 1024)",
    )
    add("--steps", type=integer(1, 10_000_000), default=2000, help="optimizer steps (default 2000)")
    add("--seed", type=seed, default=0, help="seed of data order and weights (default 0)")
    add("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.training.language_model import train_file, trained_text

    quiet_downloads(args)  # the saving step's shard bar
    with progress_for(args, "headlab train") as progress:
        info = train_file(
            args.text,
            args.out,
            overwrite=args.overwrite,
            progress=progress,
            d_model=args.d_model,
            n_layers=args.layers,
            n_heads=args.heads,
            d_ff=4 * args.d_model,
            context=args.context,
            vocab_size=args.vocab,
            steps=args.steps,
            seed=args.seed,
        )
    if args.json:
        emit_json(info)
    else:
        print(*trained_text(args.out, info), sep="\n")
    return 0
