"""``headlab roles``: what every head of a model specializes in, measured on gold data."""

from __future__ import annotations

import argparse
from typing import Any

from headlab.cli._args import MAX_REPLICATES, integer, seed, text
from headlab.cli._causal import request
from headlab.cli._model import (
    MODEL_HELP,
    add_model_arguments,
    load_model,
    model_device,
    quiet_downloads,
)
from headlab.cli._output import data_notes, native_note, note, output
from headlab.cli._progress import progress_for
from headlab.errors import ModalityError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "roles",
        help="each head's role (positional, delimiter, syntactic, ...) on gold data",
        description=(
            "Score every head for each role the literature names (positional, delimiter, "
            "rare-token, syntactic, coreference, broad, and induction for causal models) on "
            "gold data, classify each head or leave it unclassified, and bootstrap how stable "
            "that is. Default: all-MiniLM-L6-v2 on the bundled samples (500 UD English EWT dev "
            "sentences, 300 GAP development rows)."
        ),
    )
    add_model(p)
    add_gold(p, frequencies=True)
    p.add_argument("--seed", type=seed, default=0, help="bootstrap seed (default 0)")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="the same as --dtype bfloat16: model and q k^T in bfloat16, softmax and statistics "
        "in float32 (faster on CPUs with AMX; scores move by well under 0.01, see "
        "benchmarks/HISTORY.md)",
    )
    p.add_argument(
        "--batch-tokens",
        type=integer(1, 10**9),
        default=4096,
        metavar="N",
        help="padded tokens per forward pass (default 4096)",
    )
    p.add_argument(
        "--checkpoint",
        type=text("a file"),
        help="save the sums so far to this file every --checkpoint-every batches, and resume "
        "from it when it exists (the same arguments, model and data: the same result as an "
        "uninterrupted run); deleted once the result is out. Under torchrun each rank keeps "
        "FILE.rankR-of-W",
    )
    p.add_argument(
        "--checkpoint-every",
        type=integer(1, 10**9),
        default=50,
        metavar="N",
        help="batches between checkpoints (default 50)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the full result as JSON")
    out.add_argument("--csv", action="store_true", help="one CSV row per head")
    p.set_defaults(handler=run)


def add_model(p: Any) -> None:
    """``--model`` and the options of loading it (``roles`` and ``report``)."""
    p.add_argument("--model", type=text("a model folder"), help=MODEL_HELP)
    add_model_arguments(p)


def add_gold(p: Any, *, frequencies: bool = False) -> None:
    """The gold data and statistics of a roles run (``roles``; ``report`` without
    ``frequencies``)."""
    add, file = p.add_argument, text("a file")
    add("--treebank", type=file, help="a CoNLL-U file (default: the bundled UD EWT dev sample)")
    add("--gap", type=file, help="a GAP TSV file (default: the bundled GAP sample)")
    add("--no-gap", action="store_true", help="skip the coreference probe")
    if frequencies:
        add(
            "--frequencies",
            type=file,
            help="word frequencies for the rare-token probe: word<TAB>count TSV or a .conllu "
            "(default: counts of UD English EWT train, bundled)",
        )
    add("--limit", type=integer(1, 10**9), help="use at most this many sentences and GAP rows")
    resamples = integer(0, MAX_REPLICATES)
    add(
        "--replicates",
        type=resamples,
        default=100,
        help="bootstrap resamples (default 100; 0: none)",
    )
    add(
        "--reliability",
        type=integer(0, 100),
        metavar="K",
        help="assign roles on K folds of whole documents too; a head is named only when at least "
        "80%% of the folds agree (default 5 when the data has 5 documents, else off; 0: off)",
    )


def run(args: argparse.Namespace) -> int:
    from headlab import distributed
    from headlab.roles.results import heads_csv
    from headlab.roles.summary import roles_text
    from headlab.roles.workflow import RolesRequest, keep_roles, roles_dtype

    # under torchrun (WORLD_SIZE > 1) the ranks share the corpus; rank 0 writes the result
    with distributed.group(model_device(args)):
        quiet_downloads(args)
        roles = request(RolesRequest, args)  # the gold data read, before the model loads
        args.dtype = roles_dtype(args.dtype, args.bf16)
        try:
            lm = load_model(args)  # a dual encoder (CLIP) loads its text tower alone
        except ModalityError as exc:
            raise ModalityError(
                f"headlab roles measures heads on text (a treebank, GAP); {exc}", reads=exc.reads
            ) from None
        writer = distributed.writes()
        if writer:
            native_note("headlab roles")
        # only the rank that writes draws (progress_for also checks RANK, set by torchrun)
        with progress_for(args, "headlab roles", draws=writer) as progress:
            report = roles.run(lm, progress)
        if writer:
            data_notes("headlab roles", report.data, roles.gold.folds_off, report.replicates)
            data = report.to_json()
            kept = keep_roles(data)  # where headlab serve looks for it
            if kept:
                note("headlab roles", kept)
            output(args, data, lambda: roles_text(report), lambda: heads_csv(report))
        roles.finish()
        return 0
