"""``headlab heads``: where one word's attention goes, in every head of a model; with
``--trace``, which heads carry it to each of the word's dependents, beside the relation table."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headlab.cli._args import chosen_layers, integer, text
from headlab.cli._model import MODEL_HELP, add_model_arguments, load_model
from headlab.cli._output import console, emit_json
from headlab.cli.heads_image import add_image_arguments, run_image
from headlab.explore.table import (
    LESSON_SENTENCE,
    LESSON_WORD,
    heads_table,
)

INSTALL_HINT = "pip install 'headlab[parse]'"
TRACE_ONLY = ("conllu", "sentence_id", "spacy", "roles")


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
        type=text("a sentence"),
        help="the sentence (default: the lesson's)",
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
    p.add_argument(
        "--model",
        type=text("a model folder"),
        help=MODEL_HELP,
    )
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
    add_image_arguments(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.errors import InputError

    if args.image is not None or args.patch is not None:
        return run_image(args)
    if args.top < 1:
        raise InputError(f"--top must be at least 1, got {args.top}")
    if args.trace:
        if args.target or args.kind:
            raise InputError(
                "--trace follows the sentence's parse through an encoder's heads; --target and "
                "--kind do not go with it"
            )
        return run_trace(args)
    for name in TRACE_ONLY:
        if getattr(args, name):
            raise InputError(f"--{name.replace('_', '-')} goes with --trace")
    sound = None
    if args.audio is not None:  # before the model loads
        from headlab.models.audio import read_wav

        if args.text is None:
            raise InputError("--audio needs the transcript: headlab heads 'TEXT' --audio FILE")
        sound = read_wav(args.audio)
    if args.text is None:
        args.text = LESSON_SENTENCE
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    lm = load_model(args)
    from headlab.models.seq2seq import is_encoder_decoder

    if is_encoder_decoder(lm):
        return run_seq2seq(args, lm, sound)
    if args.target or args.kind or sound is not None:
        raise InputError(
            f"--target, --kind and --audio go with encoder-decoder models (T5, BART, "
            f"Whisper...); {lm.name} has one stack of layers"
        )
    layers = chosen_layers(args, lm, list(range(lm.n_layers)))
    table = heads_table(lm, args.text, word=args.word, layers=layers, heads=args.head, top=args.top)
    if args.json:
        emit_json(table)
        return 0
    title = f"{lm.name}: where {table['word']!r} attends"
    _print(args, table["heads"], title=title, caption=args.text)
    return 0


def run_seq2seq(args: argparse.Namespace, lm: Any, sound: Any = None) -> int:
    """An encoder-decoder: the encoder's heads on the sentence, or the decoder's self- and
    cross-attention heads on ``--target``; Whisper's on its transcript and ``--audio``."""
    from headlab.explore.seq2seq import SIDES, seq2seq_table
    from headlab.models.seq2seq import reads_audio

    table = seq2seq_table(
        lm,
        args.text,
        target=args.target,
        kind=args.kind,
        word=args.word,
        layers=args.layer,
        heads=args.head,
        top=args.top,
        sound=sound,
        audio=args.audio,
    )
    if args.json:
        emit_json(table)
        return 0
    kind, target, heard = table["attention"], table["target"], sound is not None
    side = SIDES[kind]
    keys = ("words", "special tokens")
    if heard and kind != "decoder":
        side, keys = "the sound's moments", ("moments", "silence (padding)")
    if heard:
        caption = f"source: {args.audio} ({sound.seconds:.2f} s)\ntranscript: {target}"
    elif target is None:
        caption = args.text
    elif reads_audio(lm):  # a model that hears, shown without sound
        caption = f"source: (silence)\ntranscript: {target}"
    else:
        caption = f"source: {args.text}\ntarget: {target}"
    where = side if side.startswith("the") else side + " words"
    title = f"{lm.name}: where {table['word']!r} attends ({kind} attention, to {where})"
    _print(args, table["heads"], keys=keys, title=title, caption=caption)
    return 0


def _print(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    *,
    title: str,
    caption: str,
    keys: tuple[str, str] = ("words", "special tokens"),
) -> None:
    """The table of heads; ``keys``: what the attended items and the apart share are."""
    from rich.table import Table

    table = Table(title=title, caption=caption)
    sink = next((r["sink"]["word"] for r in rows if r.get("sink")), None)
    columns = ["layer", "head", f"top {args.top} {keys[0]} (weight)", f"to {keys[1]}"]
    if sink is not None:  # a decoder's first word: where heads park what they do not use
        columns.append(f"to the sink {sink!r}")
    for col in columns:
        table.add_column(col)
    for r in rows:
        words = ", ".join(f"{t['word']} {t['weight']:.2f}" for t in r["top"])
        cells = [str(r["layer"]), str(r["head"]), words, f"{r['special']:.2f}"]
        if sink is not None:
            cells.append(f"{r['sink']['weight']:.2f}" if r.get("sink") else "")
        table.add_row(*cells)
    console().print(table)


def run_trace(args: argparse.Namespace) -> int:
    """``--trace``: the parse first (quick errors), then the model, the table, the trace."""
    from headlab.datasets import sample_path
    from headlab.errors import InputError
    from headlab.roles.trace import (
        check_text,
        check_word,
        choose_sentence,
        lesson_parse,
        measure_relation_table,
        read_relation_table,
        trace_word,
    )

    if args.layer or args.head:
        raise InputError("--trace ranks every head; --layer and --head do not go with it")
    if args.conllu or args.sentence_id:
        if args.spacy:
            raise InputError("--spacy parses the text; it does not go with --conllu/--sentence-id")
        sentence = choose_sentence(args.conllu or sample_path("treebank"), args.sentence_id)
        if args.text is not None:
            check_text(sentence, args.text)
    elif args.spacy or args.text not in (None, LESSON_SENTENCE):
        from headlab.datasets.parse import parse_sentence

        sentence = parse_sentence(args.text or LESSON_SENTENCE)
    else:
        sentence = lesson_parse()
    lesson = "".join(sentence.words) == "".join(LESSON_SENTENCE.split())
    word = args.word or (LESSON_WORD if lesson else sentence.words[sentence.heads.index(-1)])
    check_word(sentence, word)  # before the model loads
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    lm = load_model(args)
    from headlab.models.seq2seq import is_encoder_decoder, text_encoder

    if is_encoder_decoder(lm):  # the parse is of the source sentence: the encoder's heads
        lm = text_encoder(lm, why="--trace follows a text's parse")
    if args.roles:
        relations = read_relation_table(args.roles, lm)
        source = args.roles
    else:
        print(
            "headlab heads: measuring the relation table on the bundled UD EWT sample "
            "(about 20 s; --roles FILE from `headlab roles --json` skips this)",
            file=sys.stderr,
            flush=True,
        )
        relations = measure_relation_table(lm, sample_path("treebank"))
        source = "bundled UD EWT dev sample (500 sentences)"
    trace = trace_word(lm, sentence, word, relations, k=args.top, table_source=source)
    if args.json:
        emit_json(trace.to_json())
        return 0
    print_trace(trace)
    return 0


def print_trace(trace: Any) -> None:
    from rich.table import Table

    table = Table(
        title=f"{trace.model}: where {trace.word!r} sends its attention, dependent by dependent",
        caption=(
            f"{' '.join(trace.sentence.words)}\n"
            f"gold head: the best head for the relation (head -> dependent) in the relation "
            f"table ({trace.table_source}); rank among {trace.n_heads} heads by the attention "
            f"to this dependent; its top word: its argmax here (self, [CLS]/[SEP] excluded)"
        ),
    )
    for col in (
        "relation",
        "dependent",
        f"top {trace.k} heads (weight)",
        "gold head (acc.)",
        "its weight",
        "its rank",
        "its top word",
        "verdict",
    ):
        table.add_column(col)
    for arc in trace.arcs:
        top = ", ".join(f"{h.layer}.{h.head} {h.weight:.2f}" for h in arc.top)
        if arc.gold is None:
            gold = weight = rank = target = "-"
        else:
            gold = f"{arc.gold.layer}.{arc.gold.head} ({100 * arc.gold.accuracy:.0f}%)"
            if arc.gold_relation != arc.relation:
                gold += f" as {arc.gold_relation}"
            weight = f"{arc.gold_weight:.2f}"
            rank = str(arc.gold_rank)
            target = str(arc.gold_target)
        table.add_row(arc.relation, arc.dependent, top, gold, weight, rank, target, arc.verdict)
    console().print(table)
