"""Write the architecture coverage table into docs/models.md from the test matrix's results.

Runs ``tests/models/test_architectures.py`` with ``HEADLAB_COVERAGE_OUT`` set (or reads a results
file given with ``--results``), then replaces the text between the ``coverage:begin`` and
``coverage:end`` markers of docs/models.md. Nothing in the table is written by hand: a mark means
that type's test passed in this run.

    python benchmarks/coverage.py            # run the matrix (a few minutes on 2 cores), write
    python benchmarks/coverage.py --results /tmp/a.json /tmp/b.json   # merged
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "models.md"
BEGIN, END = "<!-- coverage:begin -->", "<!-- coverage:end -->"
YES, NO = "yes", "-"


def run_matrix() -> dict[str, dict[str, object]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "coverage.json"
        env = {**os.environ, "HEADLAB_COVERAGE_OUT": str(out)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly"]
        cmd.append("tests/models/test_architectures.py")
        subprocess.run(cmd, cwd=ROOT, env=env, check=False)
        return json.loads(out.read_text())


def _mark(value: object) -> str:
    return YES if value is True else NO


def table(results: dict[str, dict[str, object]]) -> str:
    rows = [
        "| model type | layers found | q/k/v layout | capture | ablation | roles | "
        "physical pruning | loads back in transformers |",
        "|---|---|---|---|---|---|---|---|",
    ]
    refused = []
    for model_type, r in sorted(results.items()):
        if "refused" in r:
            refused.append(f"`{model_type}`")
            continue
        layers = r.get("layers") or []
        kinds = sorted({str(name).split()[0] for name in layers})  # type: ignore[union-attr]
        capture = r.get("capture") is True and r.get("bit_identical") is True
        ablation = r.get("ablation_zero") is True and r.get("ablation_mean") is True
        if r.get("roles_cli") is True:
            roles = "yes (CLI test)"
        elif capture and kinds == ["self"] and r.get("text") is True:
            roles = "text model, not run"
        else:
            roles = NO
        pruning = r.get("pruning")
        why = str(pruning).split("is not supported: ", 1)[-1]  # the reason, without the class
        prune_cell = YES if pruning is True else f"no: {why}" if pruning else NO
        rows.append(
            f"| `{model_type}` | {len(layers)} ({', '.join(kinds)}) | "
            f"{', '.join(r.get('qkv') or [])} | {_mark(capture)} | {_mark(ablation)} | "
            f"{roles} | {prune_cell} | {_mark(r.get('reload_transformers'))} |"  # type: ignore[arg-type]
        )
    lines = [
        f"{len(rows) - 2} model types pass the matrix (`python benchmarks/coverage.py`, tiny "
        "random models, float32).",
        "",
        *rows,
    ]
    if refused:
        lines += [
            "",
            f"Refused in one line (attention outside transformers' interface): {', '.join(refused)}.",
        ]
    return "\n".join(lines)


def write(text: str) -> None:
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC} lacks the {BEGIN} ... {END} markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    from headlab.outputs import write_text_atomic

    write_text_atomic(DOC, f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", type=Path, nargs="+", help="results files of earlier runs (merged)"
    )
    args = parser.parse_args()
    results: dict[str, dict[str, object]] = {}
    for file in args.results or []:
        for model_type, entry in json.loads(file.read_text()).items():
            results.setdefault(model_type, {}).update(entry)
    results = results or run_matrix()
    write(table(results))
    print(f"wrote the coverage of {len(results)} model types into {DOC}")


if __name__ == "__main__":
    main()
