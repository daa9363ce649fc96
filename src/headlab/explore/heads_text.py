"""What ``headlab heads`` shows a person, built from the tables its ``--json`` prints: the heads
of a sentence (:mod:`headlab.explore.table`, an encoder-decoder's from
:mod:`headlab.explore.seq2seq`), of an image (:mod:`headlab.explore.images`) with each head's
patch grid shaded in block characters, and a word traced through a parse
(:class:`~headlab.roles.trace.SentenceTrace`).

Each function returns :data:`headlab.text.Part` s (tables and lines) that the CLI prints with
``headlab.cli._output.show``, except :func:`patch_grids`: its lines are drawn as they are (no
wrapping), as wide as the terminal allows. Nothing here imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headlab.text import Part, table

if TYPE_CHECKING:
    from headlab.roles.trace import SentenceTrace

#: which side of the sentence each kind of attention's keys are (an encoder-decoder's)
SIDES = {"encoder": "source", "decoder": "target", "cross": "source"}
#: shades of a patch, from under 1/8 of the head's largest patch weight to the largest; the
#: faintest is a dot, so that every grid keeps its outline however little it attends
SHADES = "·░▒▓█"
#: the space between two grids side by side
GAP = "  "


def heads_text(
    data: dict[str, Any],
    top: int,
    *,
    model: str | None = None,
    hears: bool = False,
    seconds: float | None = None,
) -> list[Part]:
    """The table of a sentence's heads (``headlab heads`` JSON): each head's ``top`` words with
    their weights, its share to special tokens and, in a causal model, to the attention sink.

    ``model``: the name in the title (default ``data["model"]``; an encoder-decoder's table
    of its encoder alone names the encoder). An encoder-decoder's table (with ``attention``:
    its kind) says which side the words are on; ``hears``: the model hears sound (Whisper),
    ``seconds``: how long the sound it heard (``data["audio"]``) lasts; its encoder's rows are
    then moments of the sound.
    """
    title = f"{model or data['model']}: where {data['word']!r} attends"
    keys = ("words", "special tokens")
    caption = data["text"]
    kind = data.get("attention")
    if kind is not None:
        side, target = SIDES[kind], data["target"]
        heard = "audio" in data
        if heard and kind != "decoder":
            side, keys = "the sound's moments", ("moments", "silence (padding)")
        if heard:
            caption = f"source: {data['audio']} ({seconds:.2f} s)\ntranscript: {target}"
        elif target is not None:
            source = "(silence)" if hears else data["text"]  # a model that hears, no sound
            caption = f"source: {source}\n{'transcript' if hears else 'target'}: {target}"
        where = side if side.startswith("the") else side + " words"
        title += f" ({kind} attention, to {where})"
    rows = data["heads"]
    sink = next((r["sink"]["word"] for r in rows if r.get("sink")), None)
    columns = ["layer", "head", f"top {top} {keys[0]} (weight)", f"to {keys[1]}"]
    if sink is not None:  # a decoder's first word: where heads park what they do not use
        columns.append(f"to the sink {sink!r}")
    cells = []
    for r in rows:
        words = ", ".join(f"{t['word']} {t['weight']:.2f}" for t in r["top"])
        cells.append([str(r["layer"]), str(r["head"]), words, f"{r['special']:.2f}"])
        if sink is not None:
            cells[-1].append(f"{r['sink']['weight']:.2f}" if r.get("sink") else "")
    return [table(columns, cells, title=title, caption=caption)]


def image_text(data: dict[str, Any], top: int) -> list[Part]:
    """The table of an image's heads (:func:`~headlab.explore.images.image_table`): each
    head's ``top`` patches and its share to the class token; then how to read the grids of
    :func:`patch_grids`."""
    query = data["query"]
    query = "class token" if query == "class" else f"patch ({query[0]},{query[1]})"
    grid = data["grid"]
    rows = [
        (
            str(r["layer"]),
            str(r["head"]),
            ", ".join(f"({t['patch'][0]},{t['patch'][1]}) {t['weight']:.2f}" for t in r["top"]),
            f"{r['class']:.2f}",
        )
        for r in data["heads"]
    ]
    return [
        table(
            ("layer", "head", f"top {top} patches (weight)", "to class token"),
            rows,
            title=f"{data['model']}: where the {query} attends",
            caption=f"{data['image']}: {grid['rows']}x{grid['cols']} patches of "
            f"{grid['patch_size']} px, (row,col) from the top left",
        ),
        f"Each head's grid: one cell per patch, shaded by its weight over the head's largest "
        f"patch weight ({SHADES[-1]} the largest, {SHADES[3]}{SHADES[2]}{SHADES[1]} lighter, "
        f"{SHADES[0]} under 1/8); the class token's share beside the head.",
    ]


def cell(level: int) -> str:
    """A patch as two characters: ``"· "`` for the faintest level, else a doubled shade."""
    return SHADES[0] + " " if level == 0 else 2 * SHADES[level]


def shade(grid: list[list[float]]) -> list[str]:
    """One text row per patch row, each patch two characters shaded by its weight over the
    grid's largest (a dot under 1/8 of it)."""
    top = max(max(row) for row in grid)
    last = len(SHADES) - 1
    if top <= 0:
        return ["".join(cell(0) for _ in row) for row in grid]
    return ["".join(cell(round(last * w / top)) for w in row) for row in grid]


def patch_grids(data: dict[str, Any], width: int) -> list[str]:
    """Every head's grid of an image's table, labelled with its layer, head and class token
    share, as many side by side as fit in ``width`` characters: per band of grids an empty
    line, the labels, then one line per patch row."""
    rows, n_rows = data["heads"], data["grid"]["rows"]
    labels = [f"{r['layer']}.{r['head']} cls {r['class']:.2f}" for r in rows]
    column = max(2 * data["grid"]["cols"], *(len(label) for label in labels))
    per_band = max(1, (width + len(GAP)) // (column + len(GAP)))
    lines = []
    for start in range(0, len(rows), per_band):
        shaded = [shade(r["grid"]) for r in rows[start : start + per_band]]
        band = [labels[start : start + per_band]] + [[s[i] for s in shaded] for i in range(n_rows)]
        lines += [""] + [GAP.join(c.ljust(column) for c in cells).rstrip() for cells in band]
    return lines


def trace_text(trace: SentenceTrace) -> list[Part]:
    """The table of a traced word (``headlab heads --trace``): per dependent in the parse, the
    heads that send it the most attention, beside the relation table's best head for its
    relation, that head's weight, rank and top word here, and whether the two agree."""
    rows = []
    for arc in trace.arcs:
        top = ", ".join(f"{h.layer}.{h.head} {h.weight:.2f}" for h in arc.top)
        if arc.gold is None:
            gold = weight = rank = target = "-"
        else:
            gold = f"{arc.gold.layer}.{arc.gold.head} ({100 * arc.gold.accuracy:.0f}%)"
            if arc.gold_relation != arc.relation:
                gold += f" as {arc.gold_relation}"
            weight, rank = f"{arc.gold_weight:.2f}", str(arc.gold_rank)
            target = str(arc.gold_target)
        rows.append((arc.relation, arc.dependent, top, gold, weight, rank, target, arc.verdict))
    columns = ("relation", "dependent", f"top {trace.k} heads (weight)", "gold head (acc.)")
    return [
        table(
            (*columns, "its weight", "its rank", "its top word", "verdict"),
            rows,
            title=f"{trace.model}: where {trace.word!r} sends its attention, dependent by "
            "dependent",
            caption=f"{' '.join(trace.sentence.words)}\n"
            f"gold head: the best head for the relation (head -> dependent) in the relation "
            f"table ({trace.table_source}); rank among {trace.n_heads} heads by the attention "
            f"to this dependent; its top word: its argmax here (self, [CLS]/[SEP] excluded)",
        )
    ]
