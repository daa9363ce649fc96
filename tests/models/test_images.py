"""``headlab heads --image``: patch grids of ViT, CLIP's vision tower and a full CLIP folder
against Hugging Face's eager attention; the one-line errors; ``roles`` on image models.

Each folder is a tiny random model saved with its image processor (16 x 16 pixels, 4 x 4
patches of 4 px; weights drawn wide enough that heads look somewhere in particular), read by
the CLI from a PNG on disk. The oracle is the same folder loaded with transformers' eager
attention and ``output_attentions=True``, on pixel values from the folder's processor.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.models.architectures import build_model, config

from headlab.cli import main

GRID = 4  # image_size 16 / patch_size 4
N_LAYERS, N_HEADS = 2, 4


def _processor(model_type: str) -> Any:
    from transformers import CLIPImageProcessor, ViTImageProcessor

    if model_type == "vit":
        return ViTImageProcessor(size={"height": 16, "width": 16})
    return CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})


def _full_clip() -> Any:
    from transformers import CLIPConfig, CLIPModel

    text = config("clip_text_model", bos_token_id=101).to_dict()
    cfg = CLIPConfig(
        text_config=text,
        vision_config=config("clip_vision_model").to_dict(),
        projection_dim=16,
        initializer_factor=5.0,
    )
    torch.manual_seed(0)
    model = CLIPModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and p.dim() == 1:
                p.normal_(std=0.1)
    return model.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A saved tiny folder of each kind, and ``image``: a 20 x 24 PNG (the processor resizes)."""
    from PIL import Image
    from tests.models.tiny import tokenizer_path
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("vision")
    out: dict[str, Path] = {}
    models = {
        "vit": build_model("vit", initializer_range=0.2),
        "clip_vision_model": build_model("clip_vision_model", initializer_factor=5.0),
        "clip": _full_clip(),
    }
    for name, model in models.items():
        folder = root / name
        model.save_pretrained(folder, safe_serialization=True)
        _processor("vit" if name == "vit" else "clip").save_pretrained(folder)
        out[name] = folder
    tok = AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True)
    tok.save_pretrained(out["clip"])
    gen = torch.Generator().manual_seed(3)
    pixels = (torch.rand(20, 24, 3, generator=gen) * 255).to(torch.uint8).numpy()
    out["image"] = root / "picture.png"
    Image.fromarray(pixels).save(out["image"])
    return out


def _oracle(folder: Path, model_type: str, image: Path) -> list[torch.Tensor]:
    """Each layer's eager attention ``(H, S, S)`` on the folder's own preprocessing."""
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModel, CLIPModel

    processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    pixels = processor(images=Image.open(image).convert("RGB"), return_tensors="pt")
    if model_type == "clip":
        model: Any = CLIPModel.from_pretrained(str(folder), attn_implementation="eager")
        model = model.vision_model
    else:
        model = AutoModel.from_pretrained(str(folder), attn_implementation="eager")
    with torch.no_grad():
        out = model.eval()(pixel_values=pixels["pixel_values"], output_attentions=True)
    return [a[0] for a in out.attentions]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("headlab: error: ") and "\n" not in err, err
    return err


@pytest.mark.parametrize("patch", [None, (2, 1)], ids=["class-token", "patch-2-1"])
@pytest.mark.parametrize("model_type", ["vit", "clip_vision_model", "clip"])
def test_every_head_grid_equals_eager_attention(
    model_type: str,
    patch: tuple[int, int] | None,
    folders: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The grid of every head is the query's row of HF eager attention laid out as the image
    (<= 1e-5); with the class share it sums to 1; ``--patch`` picks that patch's row."""
    folder = folders[model_type]
    argv = ["heads", "--image", str(folders["image"]), "--model", str(folder), "--json"]
    argv += ["--device", "cpu"]  # the oracle runs on the CPU
    if patch is not None:
        argv += ["--patch", f"{patch[0]},{patch[1]}"]
    result = _json(capsys, argv)
    assert result["grid"] == {"rows": GRID, "cols": GRID, "patch_size": 4}
    assert result["query"] == ("class" if patch is None else list(patch))
    query = 0 if patch is None else 1 + patch[0] * GRID + patch[1]
    oracle = _oracle(folder, model_type, folders["image"])
    assert len(result["heads"]) == N_LAYERS * N_HEADS
    for row in result["heads"]:
        expected = oracle[row["layer"]][row["head"], query]  # (S,)
        grid = torch.tensor(row["grid"])  # (rows, cols)
        assert grid.shape == (GRID, GRID)
        assert torch.allclose(grid, expected[1:].reshape(GRID, GRID), atol=1e-5, rtol=0)
        assert abs(row["class"] - float(expected[0])) <= 1e-5
        assert abs(row["class"] + float(grid.sum()) - 1) <= 1e-5
        best = divmod(int(expected[1:].argmax()), GRID)
        assert row["top"][0]["patch"] == list(best)


def test_the_query_row_changes_with_the_patch(
    folders: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Two patches of the same image attend differently (the rows are not all the same)."""
    base = ["heads", "--image", str(folders["image"]), "--model", str(folders["vit"]), "--json"]
    one = _json(capsys, [*base, "--patch", "0,0", "--layer", "0"])
    other = _json(capsys, [*base, "--patch", "3,3", "--layer", "0"])
    differences = [
        (torch.tensor(a["grid"]) - torch.tensor(b["grid"])).abs().max()
        for a, b in zip(one["heads"], other["heads"], strict=True)
    ]
    assert max(differences) > 1e-2


def test_the_terminal_draws_every_head_as_a_grid(
    folders: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """One text row per patch row for every head, the top patch of each head drawn darkest,
    next to a table of the top patches and the class token's share."""
    from headlab.explore.heads_text import GAP, SHADES

    base = ["heads", "--image", str(folders["image"]), "--model", str(folders["vit"])]
    result = _json(capsys, [*base, "--json"])
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "vit: where the class token attends" in out
    lines = out.splitlines()
    labels = [f"{r['layer']}.{r['head']} cls {r['class']:.2f}" for r in result["heads"]]
    header = next(i for i, line in enumerate(lines) if line.startswith(labels[0]))
    assert lines[header].split(GAP) == labels  # all eight fit side by side in 200 columns
    width = len(labels[0]) + len(GAP)
    rows = lines[header + 1 : header + 1 + GRID]
    assert all(set(row) <= {*SHADES, " "} for row in rows)
    for i, head in enumerate(result["heads"]):
        r, c = head["top"][0]["patch"]
        cell = rows[r].ljust(i * width + 2 * GRID)[i * width + 2 * c : i * width + 2 * c + 2]
        assert cell == SHADES[-1] * 2


def test_one_line_errors(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.models.tiny import build

    image, vit = str(folders["image"]), str(folders["vit"])
    missing = _error(capsys, ["heads", "--image", str(tmp_path / "no.png"), "--model", vit])
    assert "no.png does not exist" in missing
    text_file = tmp_path / "notes.png"
    text_file.write_text("not an image")
    assert "cannot read" in _error(capsys, ["heads", "--image", str(text_file), "--model", vit])
    bare = tmp_path / "bare"
    shutil.copytree(vit, bare)
    (bare / "preprocessor_config.json").unlink()
    no_processor = _error(capsys, ["heads", "--image", image, "--model", str(bare)])
    assert "no image processor (preprocessor_config.json)" in no_processor
    on_vit = _error(capsys, ["heads", "A cat sat.", "--model", vit])
    assert "vit reads images, not text" in on_vit and "--image FILE" in on_vit
    bert = build("bert", tmp_path / "bert")
    on_bert = _error(capsys, ["heads", "--image", image, "--model", str(bert)])
    assert "bert reads text, not images" in on_bert
    outside = _error(capsys, ["heads", "--image", image, "--model", vit, "--patch", "4,0"])
    assert "patch (4,0) is outside the 4x4 grid: rows 0..3, columns 0..3" in outside
    assert "--image FILE" in _error(capsys, ["heads", "--model", vit, "--patch", "1,1"])
    both = _error(capsys, ["heads", "A cat.", "--image", image, "--model", vit])
    assert "not both" in both
    target = _error(capsys, ["heads", "--image", image, "--model", vit, "--target", "Ein Hund."])
    assert "--target" in target
    roles = _error(capsys, ["roles", "--model", vit, "--no-gap", "--limit", "5"])
    assert "roles measures heads on text" in roles and "vit reads images" in roles


def test_a_full_clip_folder_reads_a_sentence_with_its_text_tower(
    folders: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``heads`` on a sentence and ``roles`` run the text tower alone: its 2 layers of 4 heads
    (the vision tower's layers are neither loaded nor counted)."""
    from headlab.models import load

    clip = str(folders["clip"])
    lm = load(clip)
    assert type(lm.model).__name__ == "CLIPTextModel" and lm.n_layers == N_LAYERS
    assert type(load(clip, reads="images").model).__name__ == "CLIPVisionModel"
    result = _json(capsys, ["heads", "A cat sat on the mat.", "--model", clip, "--json"])
    assert len(result["heads"]) == N_LAYERS * N_HEADS
    for row in result["heads"]:
        assert sum(t["weight"] for t in row["top"]) + row["special"] <= 1 + 1e-3
    argv = ["roles", "--model", clip, "--no-gap", "--replicates", "0", "--limit", "20", "--json"]
    table = _json(capsys, argv)
    assert (table["layers"], table["heads_per_layer"], len(table["heads"])) == (2, 4, 8)


def test_pixels_of_another_size_than_the_config_are_refused() -> None:
    """A processor that resizes to another size than ``image_size`` (a mismatched folder) gets
    one line naming both sizes, not a failure deep inside the model."""
    from headlab.errors import ShapeError
    from headlab.models import wrap
    from headlab.models.images import patch_attention

    lm = wrap(build_model("vit"), None, name="vit")
    with pytest.raises(ShapeError, match=r"takes 16x16 pixels .* gave 32x32"):
        patch_attention(lm, torch.zeros(1, 3, 32, 32))
    pa = patch_attention(lm, torch.zeros(1, 3, 16, 16), patch=(3, 3), layers=[1])
    assert list(pa.weights) == [1] and tuple(pa.weights[1].shape) == (N_HEADS, 1 + GRID * GRID)
