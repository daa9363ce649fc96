"""``headlab heads``: where one word's attention goes, in every head of a model."""

from __future__ import annotations

import argparse
from typing import Any

from headlab.cli._args import integer, text
from headlab.cli._model import add_model_arguments, load_model
from headlab.cli._output import console, emit_json

LESSON_SENTENCE = "The chef who trained in Paris prepared the fish carefully."
LESSON_WORD = "prepared"


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
        "text",
        nargs="?",
        default=LESSON_SENTENCE,
        type=text("a sentence"),
        help="the sentence (default: the lesson's)",
    )
    p.add_argument(
        "--word",
        type=text("a word"),
        help=(
            f"the attending word; WORD#2 for its second occurrence (default: {LESSON_WORD!r} in "
            "the lesson's sentence, else the sentence's longest word, the first of equals)"
        ),
    )
    p.add_argument(
        "--model",
        type=text("a model folder"),
        help="a model folder, tiny-shakespeare, or a model name in the local Hugging Face cache (default: all-MiniLM-L6-v2)",
    )
    add_model_arguments(p)
    p.add_argument(
        "--layer", type=int, action="append", help="only this layer (0-based; repeatable)"
    )
    p.add_argument("--head", type=int, action="append", help="only this head (0-based; repeatable)")
    p.add_argument("--top", type=integer(1, 1000), default=3, help="words per head (default 3)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.errors import InputError
    from headlab.models import word_attention

    if args.top < 1:
        raise InputError(f"--top must be at least 1, got {args.top}")
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    lm = load_model(args)
    layers = args.layer or list(range(lm.n_layers))
    for layer in layers:
        if not 0 <= layer < lm.n_layers:
            raise InputError(
                f"--layer {layer} out of range: {lm.name} has layers 0..{lm.n_layers - 1}"
            )
    counts = lm.layout.heads_per_layer  # fewer in some layers of a model pruned layer by layer
    most = max(counts[layer] for layer in layers)
    for head in args.head or []:
        if not 0 <= head < most:
            raise InputError(f"--head {head} out of range: {lm.name} has heads 0..{most - 1}")
    wa = word_attention(lm, args.text, layers=layers)
    word = args.word or _default_word(args.text, wa.alignment)
    wa.alignment.word_index(word)  # a clear error if the word is missing
    rows = []
    ids = lm.head_ids()  # a pruned folder's heads keep their unpruned ids
    for layer in layers:
        for head in args.head or range(counts[layer]):
            if head >= counts[layer]:
                continue  # pruned away in this layer
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "original_head": ids[layer][head],
                    "top": [
                        {"word": w, "weight": round(x, 4)}
                        for w, x in wa.top(layer, head, word, args.top)
                    ],
                    "special": round(wa.special_mass(layer, head, word), 4),
                }
            )
    if args.json:
        emit_json({"model": lm.name, "text": args.text, "word": word, "heads": rows})
        return 0
    from rich.table import Table

    table = Table(title=f"{lm.name}: where {word!r} attends", caption=args.text)
    for col in ("layer", "head", f"top {args.top} words (weight)", "to [CLS]/[SEP]"):
        table.add_column(col)
    for r in rows:
        words = ", ".join(f"{t['word']} {t['weight']:.2f}" for t in r["top"])
        table.add_row(str(r["layer"]), str(r["head"]), words, f"{r['special']:.2f}")
    console().print(table)
    return 0


def _default_word(text: str, alignment: Any) -> str:
    """The lesson's word for the lesson's sentence; else the longest word that is not
    punctuation (content words run longer than "the" or "of"), the first of equals."""
    from headlab.errors import InputError
    from headlab.roles.geometry import is_punctuation

    if text == LESSON_SENTENCE:
        return LESSON_WORD
    words = [
        w
        for w, special in zip(alignment.words, alignment.is_special, strict=True)
        if not special and not is_punctuation(w)
    ]
    if not words:
        raise InputError(f"the sentence has no word to attend from: {text!r}")
    return max(words, key=len)  # max keeps the first of equals
