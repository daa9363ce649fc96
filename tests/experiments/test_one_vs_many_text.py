"""What ``headlab experiment one-vs-many`` prints of its result, and the data it reads."""

from __future__ import annotations

from pathlib import Path

from headlab.experiments.one_vs_many import GridConfig, data_folder, one_vs_many_text
from headlab.text import TextTable


def _binding(n_heads: int, seed: int) -> dict[str, object]:
    heads = [
        {"head": h, "mass_on_subject": 0.5, "mass_on_object": 0.25, "entropy": 1.0 + h}
        for h in range(n_heads)
    ]
    return {"task": "binding", "n_heads": n_heads, "seed": seed, "diagnostic": {"heads": heads}}


def test_the_summary_table_and_where_the_first_seeds_heads_look() -> None:
    result = {
        "setting": "small",
        "device": "cpu",
        "wall_s": 41.6,
        "config": {"seeds": [3, 4]},
        "summary": [
            {
                "task": "binding",
                "n_heads": 1,
                "metric": "accuracy",
                "mean": 0.28,
                "std": None,
                "seeds": 1,
            },
            {
                "task": "binding",
                "n_heads": 2,
                "metric": "accuracy",
                "mean": 0.9912,
                "std": 0.0104,
                "seeds": 2,
            },
        ],
        "runs": [_binding(1, 3), _binding(2, 3), _binding(2, 4)],
    }
    summary, *lines = one_vs_many_text(result)
    assert isinstance(summary, TextTable)
    assert summary.title == "one head vs many, same width and parameters (small setting, cpu, 42 s)"
    assert summary.columns == ("task", "heads", "metric", "mean", "spread (sd)", "seeds")
    assert summary.rows == (
        ("binding", "1", "accuracy", "0.280", "\u2013", "1"),
        ("binding", "2", "accuracy", "0.991", "0.010", "2"),
    )
    assert lines == [  # seed 3 alone, the first of the grid
        "1 head(s), last layer, from the query token: head 0: subject 0.50, object 0.25, entropy 1.00",
        "2 head(s), last layer, from the query token: head 0: subject 0.50, object 0.25, entropy "
        "1.00; head 1: subject 0.50, object 0.25, entropy 2.00",
    ]


def test_the_binding_task_alone_reads_no_data(tmp_path: Path) -> None:
    assert data_folder(GridConfig.quick()) == Path(".")
    assert data_folder(GridConfig(), tmp_path) == tmp_path
