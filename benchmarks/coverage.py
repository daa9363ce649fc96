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
README = ROOT / "README.md"
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


#: what roles (measured on text) say to a model that reads something else
NOT_TEXT = {
    "input_features": "no: hears audio (heads: --audio)",
    "pixel_values": "no: sees images (heads: a patch grid)",
}


def _roles(r: dict[str, object], kinds: list[str]) -> str:
    if r.get("roles_cli") is True:
        return "yes, encoder's heads (CLI test)" if "encoder" in kinds else "yes (CLI test)"
    return NOT_TEXT.get(str(r.get("input")), NO)


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
        roles = _roles(r, kinds)
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


def summary(results: dict[str, dict[str, object]]) -> str:
    """The README's short form: model types grouped by the same row of the full table."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    cli, other, refused = [], [], []
    for model_type, r in sorted(results.items()):
        if "refused" in r:
            refused.append(model_type)
            continue
        kinds = sorted({str(name).split()[0] for name in r.get("layers") or []})  # type: ignore[union-attr]
        ok = all(r.get(k) is True for k in ("capture", "bit_identical", "ablation_zero"))
        ok = ok and r.get("ablation_mean") is True
        heads = ("yes" if ok else "no") + ("" if kinds == ["self"] else f" ({', '.join(kinds)})")
        pruning = r.get("pruning")
        if pruning is True:
            prune = "yes"
        elif pruning:
            prune = "no: " + str(pruning).split("is not supported: ", 1)[-1]
            prune = prune.replace(" [0, 1]", "")  # the tiny model's layer list
        else:
            prune = NO
        reload = YES if r.get("reload_transformers") is True else NO
        groups.setdefault((heads, prune, reload), []).append(model_type)
        if r.get("roles_cli") is True:
            cli.append(model_type)
        elif str(r.get("input")) in NOT_TEXT:
            other.append(model_type)
    rows = [
        "| model types | capture, ablation | physical pruning | pruned folder loads in transformers |",
        "|---|---|---|---|",
    ]
    for (heads, prune, reload), types in sorted(groups.items(), key=lambda g: -len(g[1])):
        rows.append(f"| {', '.join(types)} | {heads} | {prune} | {reload} |")
    n = sum(len(t) for t in groups.values())
    lines = [
        f"{n} model types pass the test matrix (patterns against HF eager within 1e-5, head outputs,",
        "zero and mean ablation against weight surgery, outputs bit-identical with capture on);",
        "this table is written by `python benchmarks/coverage.py` from the matrix's results.",
        "",
        *rows,
        "",
        f"`headlab heads` and `headlab roles --model DIR` run end to end on all {len(cli)} text "
        "types (encoder-decoders: roles on the encoder; heads on encoder, decoder and "
        f"cross-attention); {', '.join(other)}: `headlab heads` only (`--image`, `--audio`). Refused "
        f"in one line (attention outside transformers' interface): {', '.join(refused)}.",
    ]
    return "\n".join(lines)


def write(text: str, path: Path = DOC) -> None:
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path} lacks the {BEGIN} ... {END} markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    from headlab.outputs import write_text_atomic

    write_text_atomic(path, f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", type=Path, nargs="+", help="results files of earlier runs (merged)"
    )
    parser.add_argument("--save", type=Path, help="also write the merged results to this file")
    args = parser.parse_args()
    results: dict[str, dict[str, object]] = {}
    for file in args.results or []:
        for model_type, entry in json.loads(file.read_text()).items():
            results.setdefault(model_type, {}).update(entry)
    results = results or run_matrix()
    if args.save:
        args.save.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    write(table(results))
    write(summary(results), README)
    print(f"wrote the coverage of {len(results)} model types into {DOC} and {README}")


if __name__ == "__main__":
    main()
