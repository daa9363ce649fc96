"""The grid ``headlab experiment cost`` chooses from its options, and the tables it prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from headlab.errors import InputError
from headlab.experiments.cost_text import cost_options, cost_text
from headlab.text import TextTable


def test_cost_options_fill_the_grid_from_what_is_given(tmp_path: Path) -> None:
    assert cost_options().heads == (1, 2, 4, 8, 12, 16, 32, 64)
    assert cost_options(width=96).heads == (1, 2, 4, 8, 12, 16, 32)  # those dividing 96
    quick = cost_options(quick=True, lengths=(16,), backward=False)
    assert (quick.width, quick.heads, quick.lengths, quick.backward) == (
        256,
        (1, 4, 16),
        (16,),
        False,
    )
    assert cost_options(width=7).heads == (1,)
    config = tmp_path / "config.json"
    config.write_text(
        '{"model_type": "gpt2", "n_embd": 48, "n_head": 6, "n_layer": 2, "vocab_size": 10}'
    )
    named = cost_options(model=str(config), quick=True)
    assert (named.width, named.heads) == (48, (1, 4, 6, 16))  # its 6 heads joined the quick ones
    with pytest.raises(InputError, match="or --width, not both"):
        cost_options(model=str(config), width=64)


def _row(heads: int) -> dict[str, Any]:
    flops = {"projections": 2_000_000, "scores": 3000, "softmax": 40, "values": 3000, "output": 5}
    return {
        "length": 16,
        "heads": heads,
        "head_dim": 64 // heads,
        "params": {"headlab": 16640, "torch": 16640 if heads == 1 else 16000},
        "flops": flops,
        "spec_flops": 1_342_177_280,
        "forward_s": {"fused": 0.0012, "weights": 0.002, "loop": 0.004},
        "forward_backward_s": {"fused": None, "weights": 0.005},
        "ratios": {
            "fused_vs_torch": 1.234,
            "weights_vs_torch": None,
            "fused_vs_torch_fb": None,
            "weights_vs_torch_fb": 2.0,
            "loop_vs_fused": 3.333,
        },
        "weights_bytes": 131072,
        "memory_forward": {k: 1024 for k in ("fused", "weights", "torch", "torch_weights", "loop")},
        "memory_forward_backward": {"fused": None, "weights": 2048},
    }


def test_cost_text_has_the_three_tables_and_how_they_were_measured() -> None:
    data = {
        "options": {"width": 64, "batch": 1},
        "device": "cpu",
        "rows": [_row(1), _row(4)],
        "memory_method": "the profiler",
        "timing_method": "alternating blocks",
        "wall_s": 12.4,
    }
    flops, timing, memory, *lines = cost_text(data)
    assert isinstance(flops, TextTable) and isinstance(timing, TextTable)
    assert isinstance(memory, TextTable)
    assert flops.title is not None and "width 64, batch 1" in flops.title
    assert flops.rows[0] == (
        "16",
        "1 x 64",
        "16,640",
        "2.00 M",
        "3.00 k",
        "40",
        "3.00 k",
        "5",
        "1.34 G",
    )
    assert (
        flops.rows[1][2] == "16,640 / 16,000"
    )  # headlab's count against torch's where they differ
    assert timing.columns[-2:] == ("loop fwd", "loop / fused")
    assert timing.rows[0] == (
        "16",
        "1",
        "1.2",
        "1.23x",
        "2.0",
        "-",
        "-",
        "-",
        "5.0",
        "2.00x",
        "4.0",
        "3.33x",
    )
    assert memory.rows[0][2:4] == ("128.0 KiB", "1.0 KiB") and memory.rows[0][-2:] == (
        "-",
        "2.0 KiB",
    )
    assert flops.right == frozenset(range(9)) and memory.right == frozenset(range(10))
    assert lines == ["memory: the profiler", "timing: alternating blocks; 12 s in all"]
