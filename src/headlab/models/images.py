"""Where an image's patches attend: the grid of one query token's attention in every head.

A vision transformer (ViT, CLIP's vision tower) cuts a ``image_size x image_size`` image into
``patch_size x patch_size`` patches, ``rows x cols`` of them in reading order, and puts one or
more special tokens first (the class token ``[CLS]``, whose final state is the image's
summary). Token ``n_special + r * cols + c`` is the patch in row ``r``, column ``c``. So one
query's attention over the tokens ``(S,)`` is its share to the special tokens plus a
``(rows, cols)`` grid over the image: the picture of what the head looks at.

Dimensions: ``H`` heads, ``S = n_special + rows * cols`` tokens, ``C`` channels.

Example:
    >>> from headlab.models import load
    >>> from headlab.models.images import open_image, patch_attention, pixel_values
    >>> lm = load("vit-base-patch16-224", reads="images")
    >>> pixels = pixel_values(lm.path, open_image("cat.png"))  # (1, C, 224, 224)
    >>> pa = patch_attention(lm, pixels)  # the class token's attention
    >>> pa.grid(11, 0).shape  # (rows, cols)
    torch.Size([14, 14])
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headlab.errors import InputError, ModelLoadError, ShapeError
from headlab.models.capture import HeadCapture
from headlab.models.loading import LoadedModel


@dataclass(frozen=True, kw_only=True)
class PatchGrid:
    """How a model cuts an image into patch tokens.

    Attributes:
        rows, cols: patches down and across.
        patch_size: pixels per patch side.
        n_special: tokens before the patches (1: the class token).
    """

    rows: int
    cols: int
    patch_size: int
    n_special: int = 1

    def __post_init__(self) -> None:
        if min(self.rows, self.cols, self.patch_size) < 1 or self.n_special < 0:
            raise ShapeError(
                f"a patch grid needs rows, cols and patch_size >= 1 and n_special >= 0, got "
                f"{self.rows}x{self.cols} patches of {self.patch_size} px, {self.n_special} special"
            )

    @property
    def n_tokens(self) -> int:
        return self.n_special + self.rows * self.cols

    def token(self, patch: tuple[int, int] | None) -> int:
        """The token index of patch ``(row, col)`` (0-based), or of the class token for ``None``.

        Raises:
            InputError: a patch outside the grid (naming the grid's ranges).
        """
        if patch is None:
            return 0
        row, col = patch
        if not (0 <= row < self.rows and 0 <= col < self.cols):
            raise InputError(
                f"patch ({row},{col}) is outside the {self.rows}x{self.cols} grid: rows "
                f"0..{self.rows - 1}, columns 0..{self.cols - 1}"
            )
        return self.n_special + row * self.cols + col


def _side(value: Any, what: str) -> int:
    """One side of a square size: ``16``, ``[16, 16]`` or ``{"height": 16, "width": 16}``."""
    if isinstance(value, int):
        return value
    sides = list(value.values()) if isinstance(value, dict) else list(value)
    if len(set(sides)) != 1:
        raise ShapeError(f"headlab reads square images and patches; the config's {what} is {value}")
    return int(sides[0])


def patch_grid(config: Any) -> PatchGrid:
    """The grid of a vision config (``image_size``, ``patch_size``; a CLIP config's
    ``vision_config``), with one special token (the class token) before the patches.

    Raises:
        ShapeError: a config without ``image_size``/``patch_size``, or non-square ones.
    """
    config = getattr(config, "vision_config", None) or config
    image_size, patch_size = (
        getattr(config, "image_size", None),
        getattr(config, "patch_size", None),
    )
    if image_size is None or patch_size is None:
        raise ShapeError(
            f"{type(config).__name__} has no image_size and patch_size: not a patch-based "
            "vision model"
        )
    side, patch = _side(image_size, "image_size"), _side(patch_size, "patch_size")
    if side % patch:
        raise ShapeError(f"image_size {side} is not a multiple of patch_size {patch}")
    return PatchGrid(rows=side // patch, cols=side // patch, patch_size=patch)


def open_image(path: str | Path) -> Any:
    """The image file at ``path`` as an RGB :class:`PIL.Image.Image` (any format PIL reads).

    Raises:
        InputError: a missing file, or one PIL cannot read as an image.
    """
    from PIL import Image, UnidentifiedImageError

    file = Path(path)
    if not file.is_file():
        raise InputError(
            f"image {file} does not exist"
            if not file.exists()
            else f"{file} is not a file (expected an image)"
        )
    try:
        with Image.open(file) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        why = " ".join(str(exc).split())[:160]
        raise InputError(f"cannot read {file} as an image (PNG, JPEG...): {why}") from None


def image_processor(folder: str | Path) -> Any:
    """The image processor saved in a model folder (``preprocessor_config.json``).

    Raises:
        ModelLoadError: the folder has none (or one transformers cannot build).
    """
    from transformers import AutoImageProcessor

    folder = Path(folder)
    if not (folder / "preprocessor_config.json").is_file():
        raise ModelLoadError(
            f"{folder} has no image processor (preprocessor_config.json): headlab needs it "
            "to resize and normalise an image the way the model was trained"
        )
    try:
        return AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        why = " ".join(str(exc).split())[:200]
        raise ModelLoadError(
            f"{folder}: cannot load the image processor ({type(exc).__name__}: {why})"
        ) from None


def pixel_values(folder: str | Path, image: Any) -> torch.Tensor:
    """``image`` (a PIL image) resized and normalised by the folder's image processor.

    Shape:
        returns ``(1, C, image_size, image_size)``, float32.
    """
    batch = image_processor(folder)(images=image, return_tensors="pt")
    return batch["pixel_values"].float()


@dataclass(frozen=True, kw_only=True)
class PatchAttention:
    """One query token's attention in every head, as patch grids.

    Attributes:
        grid: the model's patch grid.
        query: the attending patch ``(row, col)``, or ``None`` for the class token.
        weights: ``{layer: (H, S)}``; the query's attention over every token (sums to 1).
    """

    grid: PatchGrid
    query: tuple[int, int] | None
    weights: dict[int, torch.Tensor]

    def patches(self, layer: int, head: int) -> torch.Tensor:
        """The query's attention to each patch, laid out as the image.

        Shape:
            returns ``(rows, cols)``; with :meth:`class_share` it sums to 1.
        """
        row = self.weights[layer][head, self.grid.n_special :]  # (rows * cols,)
        return row.reshape(self.grid.rows, self.grid.cols)  # (rows, cols)

    def class_share(self, layer: int, head: int) -> float:
        """The share of the query's attention that goes to the class token (to every token
        before the patches, where a model has more than one)."""
        return float(self.weights[layer][head, : self.grid.n_special].sum())

    def top(self, layer: int, head: int, k: int = 3) -> list[tuple[tuple[int, int], float]]:
        """The ``k`` patches the query attends to most, as ``((row, col), weight)``."""
        flat = self.patches(layer, head).flatten()  # (rows * cols,)
        values, order = torch.topk(flat, min(k, flat.numel()))
        return [
            (divmod(int(i), self.grid.cols), float(v))
            for v, i in zip(values.tolist(), order.tolist(), strict=True)
        ]


def patch_attention(
    lm: LoadedModel,
    pixels: torch.Tensor,
    *,
    patch: tuple[int, int] | None = None,
    layers: Iterable[int] | None = None,
) -> PatchAttention:
    """Run one image once and return where ``patch`` (default: the class token) attends in
    every head of ``layers`` (default all).

    ``lm`` is an image model (``load(folder, reads="images")``: ViT, CLIP's vision tower);
    the grid comes from its config, and the weights are recomputed from the queries and keys
    the model's own attention saw (:class:`~headlab.models.capture.HeadCapture`), only for the
    query's row.

    Shape:
        pixels: ``(1, C, image_size, image_size)`` (:func:`pixel_values`).

    Raises:
        InputError: a patch outside the grid, or a batch of more than one image.
        ShapeError: pixels of another size than the config's, or a token count that does
            not match the grid.
    """
    grid = patch_grid(lm.model.config)
    side = grid.rows * grid.patch_size
    if pixels.dim() != 4 or pixels.shape[0] != 1:
        raise InputError(f"pixels must be one image (1, C, H, W), got {tuple(pixels.shape)}")
    if tuple(pixels.shape[-2:]) != (side, side):
        raise ShapeError(
            f"{lm.name} takes {side}x{side} pixels (image_size in its config), the image "
            f"processor gave {pixels.shape[-2]}x{pixels.shape[-1]}"
        )
    query = grid.token(patch)
    with torch.inference_mode(), HeadCapture(lm, layers=layers, record_head_outputs=False) as cap:
        lm.model(pixel_values=pixels.to(device=lm.device, dtype=lm.dtype))
    weights: dict[int, torch.Tensor] = {}
    for layer in cap.records:
        rows = cap.pattern(layer, rows=(query, query + 1))[0, :, 0]  # (H, S)
        if rows.shape[-1] != grid.n_tokens:
            raise ShapeError(
                f"{lm.name} layer {layer} has {rows.shape[-1]} tokens; its {grid.rows}x"
                f"{grid.cols} patch grid and class token make {grid.n_tokens}"
            )
        weights[layer] = rows.float().cpu()
    return PatchAttention(grid=grid, query=patch, weights=weights)
