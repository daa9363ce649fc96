"""What the causal figures show (#59): a fixed colour scale, readable labels, every layer
named, a title that says what was patched, and no colour for pairs that cannot exist."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from headlab.causal.figure import composition_grid, heatmap_bound, label_colour, write_heatmap
from headlab.causal.result import PatchingResult


def test_the_scale_is_the_share_of_the_logit_difference() -> None:
    """A run whose largest effect is 0.013 is drawn on the same +-1 scale as one of 0.55, so
    it looks pale, not as dark; an effect above 1 widens the scale to fit it."""
    assert heatmap_bound(np.array([[0.013, -0.002], [np.nan, 0.0]])) == 1.0
    assert heatmap_bound(np.array([[0.55, -0.2]])) == 1.0
    assert heatmap_bound(np.array([[1.4, -0.3]])) == 1.4
    assert label_colour(0.55, 1.0) == "black" and label_colour(0.76, 1.0) == "white"
    assert label_colour(-0.9, 1.0) == "white"


def test_pairs_that_cannot_compose_are_not_zero() -> None:
    table = np.arange(3 * 2 * 3 * 2, dtype=float).reshape(3, 2, 3, 2) + 1.0  # (L, H, L, H)
    senders = [(la, h) for la in range(2) for h in range(2)]
    grid = composition_grid(table, senders, [(1, 0), (2, 1)])
    assert math.isnan(grid[0, 2]) and math.isnan(grid[0, 3])  # layer 1 reads no layer-1 head
    assert grid[0, 0] == table[0, 0, 1, 0] and grid[1, 3] == table[1, 1, 2, 1]
    assert not np.isnan(grid[1]).any()


def test_the_heatmap_says_what_was_patched(tmp_path: Path, monkeypatch) -> None:
    import matplotlib.axes

    titles: list[str] = []
    ticks: list[list[int]] = []
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda self, t, **k: titles.append(t))
    real = matplotlib.axes.Axes.set_yticks
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "set_yticks",
        lambda self, t, *a, **k: (ticks.append(list(t)), real(self, t, *a, **k))[1],
    )
    effects = torch.zeros(30, 3, dtype=torch.float64)
    effects[23, 1] = 0.55
    result = PatchingResult(
        model="m",
        task="induction",
        method="activation",
        position=-1,
        n_prompts=4,
        clean=3.0,
        corrupt=-0.5,
        effects=effects,
        patched=effects,
        seconds=1.0,
        component="v",
    )
    write_heatmap(result, tmp_path / "h.png")
    assert titles and "values at position -1, from the corrupted run" in titles[0]
    assert ticks == [list(range(30))]  # odd layers too: key heads sit in 17 and 23
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("component", "says"),
    [("z", "a head's corrupted output"), ("v", "a KV head's corrupted values")],
)
def test_the_reports_caption_names_what_was_patched(
    tmp_path: Path, component: str, says: str
) -> None:
    """#59: a --component v run is captioned for KV heads, not query heads."""
    from headlab.report.folder import _patching_figure

    effects = torch.zeros(2, 2, dtype=torch.float64)
    effects[1, 0] = 0.4
    result = PatchingResult(
        model="m",
        task="ioi",
        method="activation",
        position=None,
        n_prompts=4,
        clean=3.0,
        corrupt=-0.5,
        effects=effects,
        patched=effects,
        seconds=1.0,
        component=component,
    )
    _, caption = _patching_figure(result.to_json(), tmp_path / "p.png", None)  # type: ignore[arg-type]
    carriers = "heads" if component == "z" else "KV heads"
    assert (
        caption.startswith(f"Which {carriers} carry ioi")
        and f"difference {says} removes" in caption
    )
