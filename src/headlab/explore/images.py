"""The heads table of one image: for every head of a vision transformer, the patches its class
token (or one patch) attends to most, its share to the class token and its whole patch grid.

This is what ``headlab heads --image FILE --json`` prints::

    {"model": "vit", "image": "cat.png", "grid": {"rows": 14, "cols": 14, "patch_size": 16},
     "query": "class", "heads": [{"layer": 0, "head": 0, "original_head": 0,
     "top": [{"patch": [3, 4], "weight": 0.21}, ...], "class": 0.05, "grid": [[...], ...]}]}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headlab.explore.table import each_head

if TYPE_CHECKING:
    from headlab.models.loading import LoadedModel


def image_table(
    lm: LoadedModel,
    image: Any,
    source: str,
    *,
    patch: tuple[int, int] | None = None,
    layers: Sequence[int],
    heads: Sequence[int] | None = None,
    top: int = 3,
) -> dict[str, Any]:
    """The table of ``image`` (a PIL image, read from ``source``) through ``lm``: one forward
    pass, then each head of ``layers`` (``heads``, default all) with its ``top`` patches.

    Raises:
        InputError: a ``patch`` outside the grid (from :func:`~headlab.models.images.
            patch_attention`).
    """
    from headlab.models.images import patch_attention, pixel_values

    pixels = pixel_values(lm.path, image)  # (1, C, image_size, image_size)
    pa = patch_attention(lm, pixels, patch=patch, layers=list(layers))
    rows = [
        {
            **row,
            "top": [
                {"patch": list(where), "weight": round(weight, 4)}
                for where, weight in pa.top(layer, head, top)
            ],
            "class": pa.class_share(layer, head),
            "grid": pa.patches(layer, head).tolist(),
        }
        for layer, head, row in each_head(lm, {layer: layer for layer in layers}, heads)
    ]
    return {
        "model": lm.name,
        "image": source,
        "grid": {"rows": pa.grid.rows, "cols": pa.grid.cols, "patch_size": pa.grid.patch_size},
        "query": "class" if patch is None else list(patch),
        "heads": rows,
    }
