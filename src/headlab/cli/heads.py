"""``headlab heads``: where one word's attention goes, in every head of a model; with
``--trace``, which heads carry it to each of the word's dependents, beside the relation table;
with ``--image``, where an image's class token (or one patch) attends, as patch grids.

The request, its result and their text are the library's (:mod:`headlab.explore.request`):
this module parses, calls, prints.
"""

from __future__ import annotations

import argparse
from typing import Any

from headlab.cli._args import integer, listed, text
from headlab.cli._causal import request
from headlab.cli._model import MODEL_HELP, add_model_arguments, load_model
from headlab.cli._output import console, note, output
from headlab.cli._progress import progress_for
from headlab.datasets.lesson import LESSON_WORD
from headlab.datasets.parse import INSTALL_HINT
from headlab.explore.request import HeadsRequest


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "heads",
        help="where a word's attention goes, head by head",
        description=(
            "Run a sentence through a model (default: the bundled all-MiniLM-L6-v2) and print, "
            "for every head, the three words a chosen word attends to most. Weights are "
            "word-level (Clark et al. 2019: sum over a word's tokens, mean over the attending "
            "word's tokens); the share going to special tokens such as [CLS]/[SEP] is shown apart."
        ),
    )
    p.add_argument(
        "text", nargs="?", type=text("a sentence"), help="the sentence (default: the lesson's)"
    )
    p.add_argument(
        "--word",
        type=text("a word"),
        help=(
            f"the attending word; WORD#2 for its second occurrence (default: {LESSON_WORD!r} in "
            "the lesson's sentence, else the sentence's longest word, the first of equals; a "
            "causal model's last word, whose attention predicts the next token; with --trace, "
            "the parse's root)"
        ),
    )
    p.add_argument("--model", type=text("a model folder"), help=MODEL_HELP)
    add_model_arguments(p)
    pair = p.add_argument_group(
        "encoder-decoders",
        "T5, BART, Marian, mBART, Pegasus, M2M-100, Whisper have three head sets: the "
        "encoder's self-attention (on the sentence), the decoder's self-attention and its "
        "cross-attention (on --target, read by the decoder after its start token; cross: "
        "where each target word's attention goes among the source words)",
    )
    pair.add_argument(
        "--target",
        type=text("a target sentence"),
        help="the sentence the decoder reads (a translation, a summary...)",
    )
    pair.add_argument(
        "--audio",
        type=text("a .wav file"),
        help="Whisper: the sound its encoder hears (a PCM .wav; the sentence is the "
        "transcript its decoder reads); cross: where each word listens, in seconds",
    )
    pair.add_argument(
        "--kind",
        choices=("encoder", "decoder", "cross"),
        help="which heads (default: cross with --target, else encoder; Whisper: decoder, on "
        "the text as the transcript, its encoder hearing silence)",
    )
    p.add_argument(
        "--layer",
        type=int,
        action="append",
        help="only this layer (0-based, within --kind for an encoder-decoder; repeatable)",
    )
    p.add_argument("--head", type=int, action="append", help="only this head (0-based; repeatable)")
    p.add_argument(
        "--top",
        type=integer(1, 1000),
        default=3,
        help="words per head (default 3); with --trace, heads per dependent",
    )
    trace = p.add_argument_group(
        "trace",
        "--trace ranks every head by the attention the word sends to each of its dependents "
        "in a dependency parse, beside the head that headlab roles' relation table names best "
        "for that relation (head -> dependent) on gold data; 'agree' when that head is among "
        "the --top heads here",
    )
    trace.add_argument("--trace", action="store_true", help="trace the word's dependents")
    trace.add_argument(
        "--conllu",
        type=text("a file"),
        help="the sentence's parse: a CoNLL-U file with one sentence (or choose with "
        "--sentence-id); default: the lesson's hand-made UD parse, or spaCy's for another text",
    )
    trace.add_argument(
        "--sentence-id",
        type=text("a sentence id"),
        help="the sentence of --conllu (default: the bundled UD EWT dev sample) with this sent_id",
    )
    trace.add_argument(
        "--spacy",
        action="store_true",
        help=f"parse with spaCy even the lesson's sentence (needs {INSTALL_HINT})",
    )
    trace.add_argument(
        "--roles",
        type=text("a file"),
        help="the relation table from `headlab roles --json > FILE` (default: measured now "
        "on the bundled UD EWT sample, about 20 s)",
    )
    p.add_argument(
        "--image",
        metavar="FILE",
        help="an image (PNG, JPEG...) for a vision model folder (ViT, CLIP): shows where its "
        "class token (or --patch) attends, as a grid of patches per head",
    )
    p.add_argument(
        "--patch",
        type=listed(integer(0, 100_000), "ROW,COL (two 0-based integers)", "3,4", count=2),
        metavar="ROW,COL",
        help="with --image: the attending patch, 0-based (default: the class token)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """A sentence's heads (an encoder-decoder's of ``--kind``; Whisper's hearing ``--audio``),
    an image's with ``--image``, or a word traced through a parse with ``--trace``."""
    heads = request(HeadsRequest, args)  # checked; the image, parse or sound read first
    lm = heads.ready(lambda **options: load_model(args, **options))
    with progress_for(args, "headlab heads") as progress:
        result = heads.run(lm, progress, notify=None if args.quiet else _note)
    output(args, result.to_json(), result.text)
    if not args.json:
        con = console()
        for line in result.grids(con.width):
            con.print(line, markup=False, no_wrap=True, crop=False)
    return 0


def _note(line: str) -> None:
    note("headlab heads", line, kind="")
