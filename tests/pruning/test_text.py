"""What ``headlab prune`` prints: the curve, what a written model saved, the comparison of
importance methods, built from results' JSON without a model."""

from __future__ import annotations

from typing import Any

from headlab.pruning.text import compare_text, curve_text
from headlab.text import TextTable


def _point(step: int, removed: int, metric: float, **extra: Any) -> dict[str, Any]:
    return {
        "step": step,
        "heads_removed": removed,
        "fraction": removed / 8,
        "metric": metric,
        "loss": 30.0 - metric,
        **extra,
    }


def _decoder_curve() -> dict[str, Any]:
    curve = [
        _point(0, 0, 30.0, kv_bytes_per_token=256, kv_bytes_at_context=32768),
        _point(1, 4, 31.5, kv_bytes_per_token=128, kv_bytes_at_context=16384),
    ]
    return {
        "model": "llama",
        "importance": "gradient",
        "metric": "perplexity",
        "unit": "perplexity",
        "heads_before": 8,
        "kv_context": 128,
        "curve": curve,
    }


def test_a_decoder_curve_shows_what_the_kv_cache_saves() -> None:
    result = _decoder_curve()
    result["recovered"] = [
        {
            "heads_removed": 4,
            "steps": 20,
            "seconds": 3.4,
            "metric_before": 31.5,
            "metric_after": 30.2,
        }
    ]
    table, recovered = curve_text(result)
    assert isinstance(table, TextTable)
    assert table.title == "llama: pruning curve (gradient importance)"
    assert table.columns == (
        "step",
        "heads removed",
        "share",
        "perplexity",  # its unit is its name: said once
        "loss",
        "KV cache / token",
        "KV cache at 128 tokens",
    )
    assert table.rows[1] == ("1", "4 / 8", "50%", "31.50", "-1.50", "128 B (-50%)", "16.0 KiB")
    assert table.right == frozenset(range(7))  # numbers line up on the right
    assert recovered == "recovered at 4 heads removed (20 steps, 3 s): perplexity 31.50 -> 30.20"


def test_an_encoder_curve_and_the_model_written() -> None:
    result = {
        "model": "bert",
        "importance": "ablation",
        "metric": "stsb",
        "unit": "Spearman x100",
        "heads_before": 8,
        "curve": [_point(0, 0, 80.0), _point(1, 2, 79.25)],
        "heads_after": 6,
        "heads_per_layer": [3, 3],
        "metric_before": 80.0,
        "metric_after": 79.25,
        "params_before": 1_234_567,
        "params_after": 1_200_000,
        "bytes_before": 4 * 1024**2,
        "bytes_after": 3 * 1024**2,
        "timed_batch": [10, 14],
        "time_before_ms": 12.34,
        "time_after_ms": 10.0,
        "flops_removed_share": 0.0512,
        "out": "small",
        "loads_with": ["headlab", "transformers"],
        "recovery": {"steps": 5, "seconds": 7.6, "metric_before": 79.25, "metric_after": 79.9},
    }
    table, saved, recovery = curve_text(result)
    assert isinstance(table, TextTable)
    assert table.columns == ("step", "heads removed", "share", "stsb (Spearman x100)", "loss")
    assert table.rows[1] == ("1", "2 / 8", "25%", "79.25", "-49.25")
    assert saved.splitlines() == [
        "pruned 8 -> 6 heads (per layer [3, 3]); stsb 80.00 -> 79.25",
        "parameters 1,234,567 -> 1,200,000; weights 4.0 MiB -> 3.0 MiB",
        "forward (10 x 14 tokens) 12.3 ms -> 10.0 ms; 5.1% of the FLOPs removed",
        "saved to small; loads with headlab and transformers",
    ]
    assert recovery == "recovery (5 steps, 8 s): stsb 79.25 -> 79.90 (saved after recovery)"


def test_the_comparison_counts_heads_removed_within_one_point() -> None:
    def method(name: str, losses: list[float], recovered: list[float]) -> dict[str, Any]:
        curve = [{"heads_removed": 2 * i, "loss": x} for i, x in enumerate(losses)]
        points = [{"heads_removed": 2 * i, "loss_after": x} for i, x in enumerate(recovered)]
        return {"importance": name, "curve": curve, "recovered": points}

    result = {
        "model": "bert",
        "metric": "stsb",
        "unit": "Spearman x100",
        "metric_before": 80.0,
        "heads_before": 8,
        "methods": [
            method("gradient", [0.0, 0.5, 2.0], [0.0, 0.1, 0.9]),
            method("ablation", [0.0, 1.5], []),
        ],
        "notes": ["l0 gates trained on few sentences"],
    }
    table, note, figure = compare_text(result, "compare.png")
    assert isinstance(table, TextTable)
    assert table.title == "bert: stsb (Spearman x100), unpruned 80.00"
    assert table.rows == (
        ("gradient", "2 / 8 (25%)", "4 / 8 (50%)"),
        ("ablation", "-", "-"),  # no point within 1, none recovered
    )
    assert (note, figure) == ("note: l0 gates trained on few sentences", "figure: compare.png")
    assert len(compare_text(result)) == 2  # no figure line without a figure
