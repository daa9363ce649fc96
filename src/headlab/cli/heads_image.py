"""``headlab heads --image FILE``: where the class token (or one patch) of an image attends,
in every head of a vision transformer (ViT, CLIP's vision tower), as patch grids.

The library does the work (:mod:`headlab.explore.images`); this module checks the options,
prints a table of each head's top patches and its share to the class token, then each head's
grid shaded in block characters, one text row per patch row.
"""

from __future__ import annotations

import argparse
from typing import Any

from headlab.cli._args import chosen_layers
from headlab.cli._model import load_model
from headlab.cli._output import console, emit_json

#: options of the sentence path that an image does not take, and why
TEXT_ONLY = {
    "word": "--word picks a word of a sentence; with --image the query is the class token "
    "or --patch ROW,COL",
    "trace": "--trace follows a sentence's parse; it does not go with --image",
    "conllu": "--conllu goes with --trace on a sentence, not with --image",
    "sentence_id": "--sentence-id goes with --trace on a sentence, not with --image",
    "spacy": "--spacy goes with --trace on a sentence, not with --image",
    "roles": "--roles goes with --trace on a sentence, not with --image",
    "target": "--target is the sentence an encoder-decoder's decoder reads, not for --image",
    "kind": "--kind picks an encoder-decoder's heads, not for --image",
}
#: shades of a patch, from under 1/8 of the head's largest patch weight to the largest; the
#: faintest is a dot, so that every grid keeps its outline however little it attends
SHADES = "·░▒▓█"
GAP = "  "


def patch_position(value: str) -> tuple[int, int]:
    """``ROW,COL`` (0-based) as a pair of integers."""
    parts = value.replace(" ", "").split(",")
    try:
        row, col = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected ROW,COL (two 0-based integers), got {value!r}"
        ) from None
    if row < 0 or col < 0:
        raise argparse.ArgumentTypeError(f"expected ROW,COL of 0 or more, got {value!r}")
    return row, col


def add_image_arguments(p: argparse.ArgumentParser) -> None:
    """``--image`` and ``--patch`` of ``headlab heads``."""
    p.add_argument(
        "--image",
        metavar="FILE",
        help="an image (PNG, JPEG...) for a vision model folder (ViT, CLIP): shows where its "
        "class token (or --patch) attends, as a grid of patches per head",
    )
    p.add_argument(
        "--patch",
        type=patch_position,
        metavar="ROW,COL",
        help="with --image: the attending patch, 0-based (default: the class token)",
    )


def run_image(args: argparse.Namespace) -> int:
    """``headlab heads --image FILE``: the options first (quick errors), then the image, the
    model, its image processor, one forward pass."""
    from headlab.errors import InputError, ModalityError
    from headlab.explore.images import image_table
    from headlab.models.images import open_image

    if args.image is None:
        raise InputError("--patch ROW,COL picks a patch of an image: give one with --image FILE")
    if args.text is not None:
        raise InputError("give a sentence or --image FILE, not both")
    for name, why in TEXT_ONLY.items():
        if getattr(args, name, None):
            raise InputError(why)
    if args.top < 1:
        raise InputError(f"--top must be at least 1, got {args.top}")
    image = open_image(args.image)
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    try:
        lm = load_model(args, reads="images")
    except ModalityError as exc:
        raise ModalityError(
            f"{exc}: --image needs a vision model folder (ViT, CLIP)", reads=exc.reads
        ) from None
    layers = chosen_layers(args, lm, list(range(lm.n_layers)))
    table = image_table(
        lm, image, str(args.image), patch=args.patch, layers=layers, heads=args.head, top=args.top
    )
    if args.json:
        emit_json(table)
        return 0
    query = "class token" if args.patch is None else f"patch ({args.patch[0]},{args.patch[1]})"
    print_patches(lm.name, str(args.image), query, table["grid"], table["heads"], args.top)
    return 0


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


def print_patches(
    model: str, image: str, query: str, grid: dict[str, int], rows: list[dict[str, Any]], k: int
) -> None:
    """The table of top patches, then every head's grid (``grid``: its ``rows``, ``cols`` and
    ``patch_size``), as many side by side as fit."""
    from rich.table import Table

    con = console()
    table = Table(
        title=f"{model}: where the {query} attends",
        caption=f"{image}: {grid['rows']}x{grid['cols']} patches of {grid['patch_size']} px, "
        "(row,col) from the top left",
    )
    for col in ("layer", "head", f"top {k} patches (weight)", "to class token"):
        table.add_column(col)
    for r in rows:
        patches = ", ".join(
            f"({t['patch'][0]},{t['patch'][1]}) {t['weight']:.2f}" for t in r["top"]
        )
        table.add_row(str(r["layer"]), str(r["head"]), patches, f"{r['class']:.2f}")
    con.print(table)
    con.print(
        f"Each head's grid: one cell per patch, shaded by its weight over the head's largest "
        f"patch weight ({SHADES[-1]} the largest, {SHADES[3]}{SHADES[2]}{SHADES[1]} lighter, "
        f"{SHADES[0]} under 1/8); the class token's share beside the head.",
        markup=False,
    )
    labels = [f"{r['layer']}.{r['head']} cls {r['class']:.2f}" for r in rows]
    width = max(2 * grid["cols"], *(len(label) for label in labels))
    per_band = max(1, (con.width + len(GAP)) // (width + len(GAP)))
    for start in range(0, len(rows), per_band):
        band = rows[start : start + per_band]
        lines = [GAP.join(label.ljust(width) for label in labels[start : start + per_band])]
        shaded = [shade(r["grid"]) for r in band]
        for i in range(grid["rows"]):
            lines.append(GAP.join(s[i].ljust(width) for s in shaded))
        con.print("")
        for line in lines:
            con.print(line.rstrip(), markup=False, no_wrap=True, crop=False)
