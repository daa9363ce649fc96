"""The ledger's verdicts follow their documented rules, on numbers chosen around each bar."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from headlab.report.ledger import HOLDS, MISSING, PART, SCALE, build_ledger, ledger_markdown

CLAIMS = [
    "One head averages competing needs",
    "Heads specialize: syntax, coreference, position, delimiters, rare tokens",
    "Roles are tendencies; many heads are not interpretable",
    "Outputs are concatenated and mixed by a projection",
    "Many heads are redundant and can be pruned",
    "Several heads beat one at equal width",
    "Multi-head costs about the same",
    "Heads run in parallel",
]


def _verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    return {r["claim"]: r["verdict"] for r in rows}


def _cell(task: str, heads: int, mean: float, std: float | None, metric: str = "accuracy") -> dict:
    return {"task": task, "n_heads": heads, "metric": metric, "mean": mean, "std": std, "seeds": 3}


def _binding(one: float, many: float, split: tuple[float, float], std: float = 0.05) -> dict:
    s, o = split
    return {
        "setting": "small",
        "summary": [_cell("binding", 1, one, std), _cell("binding", 8, many, std)],
        "runs": [
            {
                "task": "binding",
                "n_heads": 1,
                "seed": 0,
                "diagnostic": {"heads": [{"mass_on_subject": s, "mass_on_object": o}]},
            }
        ],
    }


def _roles(roles_of_heads: list[list[str]], relation_accuracies: list[float]) -> dict:
    return {
        "thresholds": {"min_relation_count": 100},
        "heads": [{"role": (r[0] if r else "unclassified"), "roles": r} for r in roles_of_heads],
        "relations": [{"accuracy": a, "count": 500} for a in relation_accuracies]
        + [{"accuracy": 0.1, "count": 5}],  # too few arcs: left out of the median
    }


def _cost(times: list[float], loop: float, diff: float = 1e-7) -> dict:
    rows = []
    for heads, t in zip((1, 4, 16), times, strict=True):
        rows.append(
            {
                "heads": heads,
                "head_dim": 256 // heads,
                "length": 256,
                "params": {"headlab": 263168, "torch": 263168},
                "spec_flops": 1000,
                "forward_s": {"fused": t},
                "ratios": {"loop_vs_fused": loop if heads == 16 else 1.0},
                "loop_max_abs_diff": diff,
            }
        )
    return {"device": "cpu", "rows": rows}


def _pruning(losses: list[float]) -> dict:
    curve = [
        {"heads_removed": 9 * i, "fraction": i / 8, "metric": 80.0 - loss, "loss": loss}
        for i, loss in enumerate(losses)
    ]
    return {"metric": "stsb", "unit": "Spearman x100", "curve": curve}


def test_nothing_given_every_claim_not_measured_in_the_lessons_order() -> None:
    rows = build_ledger(roles=None)
    assert [r["claim"] for r in rows] == CLAIMS
    assert {r["verdict"] for r in rows} == {MISSING}
    assert all(r["section"] and r["rule"] and r["command"] for r in rows)


def test_everything_holds() -> None:
    rows = build_ledger(
        roles=_roles(
            [["syntactic"], ["coreference"], ["positional"], ["delimiter"], ["rare-token"]]
            + [[]] * 5,
            [0.6, 0.7, 0.8],
        ),
        pruning=_pruning([0.0, 1.0, 2.0, 3.9, 10.0]),  # 3/8 removed within 5% of 80
        cost=_cost([0.010, 0.011, 0.014], loop=3.0),
        experiments=[_binding(0.3, 1.0, (0.49, 0.48))],
    )
    assert set(_verdicts(rows).values()) == {HOLDS}
    prune = rows[4]["figure"]
    assert "27 heads (38%)" in prune


def test_verdicts_in_part_and_not_at_this_scale_at_their_bars() -> None:
    lm = {
        "setting": "large",
        "summary": [
            _cell("language-model", 1, 6.00, 0.02, "perplexity"),
            _cell("language-model", 8, 5.97, 0.02, "perplexity"),  # within 1%: not better
        ],
    }
    rows = build_ledger(
        roles=_roles([["syntactic", "positional"], [], []], [0.95, 0.92, 0.5]),
        pruning=_pruning([0.0, 3.9, 9.0]),  # 1/8 removed within 5% (4.0 of 80)
        cost=_cost([0.010, 0.012, 0.016], loop=1.3, diff=2e-4),
        experiments=[_binding(0.3, 1.0, (1.0, 0.0)), lm],  # the single head commits
    )
    v = _verdicts(rows)
    assert v[CLAIMS[0]] == PART  # several beat one on binding, but the one head does not average
    assert v[CLAIMS[1]] == PART  # 1 of 5 families (a head counts for its reported role)
    assert v[CLAIMS[2]] == PART  # 67% unclassified, but the median best head is right 92%
    assert v[CLAIMS[3]] == PART  # 2e-4 > 1e-4
    assert v[CLAIMS[4]] == PART
    assert v[CLAIMS[5]] == PART  # binding yes, language model no
    assert v[CLAIMS[6]] == PART  # 1.6x slowest / fastest
    assert v[CLAIMS[7]] == PART  # 1.3x
    rows = build_ledger(
        roles=_roles([["broad"]] * 4, [0.95]),
        pruning=_pruning([0.0, 5.0]),
        cost=_cost([0.01, 0.01, 0.01], loop=1.1),
        experiments=[_binding(0.5, 0.52, (0.5, 0.5), std=0.2)],  # gap inside the seeds' spread
    )
    v = _verdicts(rows)
    assert [v[c] for c in (CLAIMS[0], CLAIMS[1], CLAIMS[2], CLAIMS[4], CLAIMS[5], CLAIMS[7])] == [
        SCALE
    ] * 6


def test_perplexity_gap_must_clear_twice_the_seed_spread() -> None:
    def lm(sd: float) -> dict:
        return {
            "summary": [
                _cell("language-model", 1, 6.0, sd, "perplexity"),
                _cell("language-model", 16, 5.8, sd, "perplexity"),
            ]
        }

    assert _verdicts(build_ledger(roles=None, experiments=[lm(0.05)]))[CLAIMS[5]] == HOLDS
    assert _verdicts(build_ledger(roles=None, experiments=[lm(0.11)]))[CLAIMS[5]] == SCALE


def test_markdown_has_one_row_per_claim_with_its_command() -> None:
    rows = build_ledger(roles=None, cost=_cost([0.01, 0.01, 0.01], loop=2.5))
    md = ledger_markdown(rows).splitlines()
    assert md[0] == "| claim | measured | verdict | command |" and len(md) == 2 + len(CLAIMS)
    assert "**holds**" in md[2 + 7] and "`headlab experiment cost --quick --json`" in md[2 + 7]


def test_report_writes_the_ledger_from_result_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from headlab.cli import main
    from headlab.experiments.cost import CostOptions, run_cost
    from headlab.models.names import DEFAULT_MODEL_NAME

    cost = run_cost(CostOptions.quick(heads=(1, 8), lengths=(32,), rounds=2, backward=False))
    files = {
        "cost": cost.to_json(),
        "ovm": _binding(0.3, 1.0, (0.5, 0.45)),
        "prune": {
            **_pruning([0.0, 1.0, 2.0, 3.0]),
            "model": DEFAULT_MODEL_NAME,  # the report's model: another model's is refused
            "importance": "gradient",
        },
    }
    for name, content in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(content))
    out, md = tmp_path / "r", tmp_path / "ledger.md"
    argv = ["report", "--out", str(out), "--limit", "8", "--replicates", "0", "--no-gap"]
    argv += ["--cost", str(tmp_path / "cost.json"), "--one-vs-many", str(tmp_path / "ovm.json")]
    assert main([*argv, "--pruning", str(tmp_path / "prune.json"), "--ledger-md", str(md)]) == 0
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["schema"] == "headlab.ledger/1"
    v = _verdicts(ledger["claims"])
    assert v[CLAIMS[3]] == v[CLAIMS[4]] == v[CLAIMS[0]] == HOLDS
    assert v[CLAIMS[6]] in (HOLDS, PART) and v[CLAIMS[7]] in (HOLDS, PART, SCALE)  # timings
    assert v[CLAIMS[1]] != MISSING and v[CLAIMS[2]] != MISSING  # the roles of this run
    assert "with 8" in ledger["claims"][5]["figure"]
    assert md.read_text() == (out / "ledger.md").read_text()
    assert md.read_text().count("\n") == 2 + len(CLAIMS)
    page = (out / "index.html").read_text()
    assert 'src="figures/cost.png"' in page
    for row in ledger["claims"]:  # each link names a section of the page
        assert f'id="{row["section"]}"' in page


def test_only_roles_the_folds_tested_count() -> None:
    """A head named on the whole data but by fewer than 4 of 5 folds is reported unclassified,
    and a bar a head clears besides its role was never tested across folds: neither counts."""
    roles = _roles([["delimiter", "coreference"], ["syntactic"], ["delimiter"]], [0.95])
    roles["folds"] = 5
    roles["heads"][1].update(role="unclassified", measured_role="syntactic", stable=False)
    figure = build_ledger(roles=roles)[1]["figure"]
    assert "replicate in 5 folds" in figure
    assert "coreference 0" in figure and "syntax 0" in figure and "delimiters 2" in figure
    roles["folds"] = 0  # without folds the figure says nothing was checked
    assert "no folds: not checked for replication" in build_ledger(roles=roles)[1]["figure"]
