"""``headlab prune``: find the heads a model can lose, and write the smaller model."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path
from typing import Any

from headlab.cli._args import integer, number, text
from headlab.cli._model import add_model_arguments, load_model
from headlab.cli._output import console, emit_json, human_bytes


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "prune",
        help="prune the least important heads and save a physically smaller model",
        description=(
            "Score heads (gradient importance, Michel et al. 2019, or ablation), remove the "
            "least important in steps while re-measuring a task metric, then rewrite the weights "
            "so the heads are gone and save the model (safetensors, atomically). Default: "
            "all-MiniLM-L6-v2 on the bundled STS-B sample (CC BY-SA pairs of STS-B dev; a third "
            "of the pairs scores importance, the rest measures the metric)."
        ),
    )
    p.add_argument(
        "--model",
        type=text("a model folder"),
        help="a model folder, tiny-shakespeare, or a model name in the local Hugging Face cache (default: all-MiniLM-L6-v2)",
    )
    add_model_arguments(p)
    p.add_argument("--fraction", type=number(), help="share of heads to remove, in (0, 1)")
    p.add_argument("--curve", action="store_true", help="only the pruning curve, no model")
    p.add_argument("--out", help="folder for the pruned model (refused if it exists)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    p.add_argument(
        "--metric",
        choices=("stsb", "fidelity", "perplexity"),
        help="stsb (Spearman), fidelity (cosine to the unpruned embeddings) or perplexity "
        "(causal models; needs --text). Default: stsb for encoders, perplexity for causal models",
    )
    p.add_argument(
        "--importance",
        choices=("gradient", "ablation"),
        default="gradient",
        help="(default gradient)",
    )
    p.add_argument(
        "--step", type=number(), default=0.1, help="share of heads per step (default 0.1)"
    )
    p.add_argument(
        "--max-loss",
        type=number(0.0),
        help="stop before losing more than this (metric units)",
    )
    p.add_argument(
        "--uniform",
        action="store_true",
        help="remove the same number of heads from every layer (Llama, Mistral, Qwen2 and "
        "Qwen3 results then load in transformers too; Phi-3 results load with headlab only)",
    )
    p.add_argument(
        "--transformers-compatible",
        action="store_true",
        help="refuse results that only headlab can load (implies --uniform)",
    )
    p.add_argument(
        "--stsb",
        type=text("a file"),
        help="STS-B file to evaluate on (default: the bundled sample)",
    )
    p.add_argument(
        "--importance-stsb",
        type=text("a file"),
        help="STS-B file to score importance on (default: every third pair of --stsb)",
    )
    p.add_argument(
        "--importance-pairs",
        type=int,
        help="score importance on this many pairs, evenly spaced through the file (default all)",
    )
    p.add_argument("--text", type=text("a file"), help="held-out text file for perplexity")
    p.add_argument("--limit", type=integer(2, 10**9), help="use at most this many STS-B pairs")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output")
    out.add_argument("--csv", action="store_true", help="the curve as CSV")
    p.set_defaults(handler=run)


def _metrics(args: argparse.Namespace, lm: Any) -> tuple[Any, Any, dict[str, Any]]:
    from headlab.datasets import read_stsb, sample_path
    from headlab.errors import InputError
    from headlab.pruning.metrics import FidelityMetric, PerplexityMetric, StsbMetric

    metric = args.metric or ("perplexity" if lm.causal else "stsb")
    if metric == "perplexity":
        if not args.text:
            raise InputError("--metric perplexity needs --text FILE (held-out text)")
        try:
            text = Path(args.text).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read --text {args.text}: {exc}") from None
        half = len(text) // 2
        evaluation = PerplexityMetric.from_text(lm, text[half:])
        importance = PerplexityMetric.from_text(lm, text[:half])
        return evaluation, importance, {"input_ids": evaluation.windows[:8].to(lm.device)}
    if lm.causal:
        raise InputError(f"--metric {metric} needs an encoder; {lm.name} is a causal model")
    pairs = read_stsb(args.stsb or sample_path("stsb"), limit=args.limit)
    if args.importance_stsb:
        imp_pairs = read_stsb(args.importance_stsb, limit=args.limit)
        eval_pairs = pairs
    else:
        imp_pairs = [p for i, p in enumerate(pairs) if i % 3 == 0]
        eval_pairs = [p for i, p in enumerate(pairs) if i % 3 != 0]
    from headlab.models import encode

    if args.importance_pairs is not None:
        if args.importance_pairs < 2:
            raise InputError(f"--importance-pairs must be at least 2, got {args.importance_pairs}")
        stride = max(1, len(imp_pairs) // args.importance_pairs)
        imp_pairs = imp_pairs[::stride][: args.importance_pairs]
    probe = encode(lm, [p.first for p in eval_pairs[:64]])
    if metric == "stsb":
        return StsbMetric(eval_pairs), StsbMetric(imp_pairs), probe
    eval_texts = [p.first for p in eval_pairs] + [p.second for p in eval_pairs]
    imp_texts = [p.first for p in imp_pairs] + [p.second for p in imp_pairs]
    return (
        FidelityMetric.build(lm, eval_texts),
        FidelityMetric.build(lm, imp_texts),
        probe,
    )


def run(args: argparse.Namespace) -> int:
    from headlab.errors import InputError, OutputExistsError

    if args.curve == (args.fraction is not None):
        raise InputError("give either --fraction F (prune and save) or --curve (measure only)")
    if args.fraction is not None and not 0.0 < args.fraction < 1.0:
        raise InputError(f"--fraction must be in (0, 1), got {args.fraction}")
    if args.fraction is not None and not args.out:
        raise InputError("--fraction needs --out DIR for the pruned model")
    if args.out and Path(args.out).exists() and not args.overwrite:
        raise OutputExistsError(
            f"{args.out} already exists (choose another folder, or pass --overwrite)"
        )
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    from headlab.pruning import head_ids, prune_model, save_pruned
    from headlab.pruning.cost import count_parameters, folder_bytes, forward_flops, forward_ms
    from headlab.pruning.progressive import progressive_prune

    with_head = (args.metric or "") == "perplexity" or bool(args.text)
    lm = load_model(args, with_lm_head=with_head)
    if (
        args.transformers_compatible
        and lm.adapter.native_config(lm.model.config.to_dict(), [1], [1], lm.head_dim) is None
    ):
        from headlab.errors import PruningError

        model_type = lm.model.config.model_type
        raise PruningError(
            f"a pruned {model_type} model cannot load in transformers: its config ties the "
            "head width to hidden_size / num_attention_heads (no head_dim) and transformers 5 "
            "dropped pruned_heads; drop --transformers-compatible and load it with "
            "headlab.models.load (Llama, Mistral, Qwen2 and Qwen3 models, not Phi-3, with "
            "--uniform load in both)"
        )
    if args.out and lm.path.resolve() == Path(args.out).resolve():
        raise OutputExistsError("--out must differ from the model folder")
    evaluation, importance, probe = _metrics(args, lm)

    def progress(point: Any) -> None:
        print(
            f"step {point.step}: {point.heads_removed} heads removed, "
            f"{evaluation.name} {point.metric:.2f}",
            file=sys.stderr,
        )

    search = progressive_prune(
        lm,
        evaluation,
        importance,
        fraction=0.9 if args.curve else args.fraction,
        step=args.step,
        max_loss=args.max_loss,
        method=args.importance,
        uniform=args.uniform or args.transformers_compatible,
        on_step=progress,
    )
    curve = [
        {
            "step": p.step,
            "heads_removed": p.heads_removed,
            "fraction": round(p.fraction, 4),
            "metric": round(p.metric, 4),
            "loss": round(p.loss, 4),
        }
        for p in search.points
    ]
    result: dict[str, Any] = {
        "model": lm.name,
        "metric": search.metric,
        "unit": search.unit,
        "importance": args.importance,
        "units": search.unit_kind,
        "heads_before": search.total_heads,
        "curve": curve,
    }
    if args.curve:
        return _print(args, result, search)
    inputs = probe
    n_tokens = int(inputs["input_ids"].shape[1])
    params_before = count_parameters(lm.model)
    flops_before = forward_flops(lm, n_tokens)
    time_before = forward_ms(lm, inputs)
    original_ids = head_ids(lm)
    removed = search.chosen.removed
    small = prune_model(lm, removed)
    time_after = forward_ms(small, inputs)
    metric_after = evaluation.evaluate(small)
    result.update(
        {
            "heads_after": sum(small.layout.heads_per_layer),
            "heads_per_layer": list(small.layout.heads_per_layer),
            "removed": {
                str(layer): [original_ids[layer][h] for h in heads]
                for layer, heads in removed.items()
            },
            "params_before": params_before,
            "params_after": count_parameters(small.model),
            "metric_before": round(search.points[0].metric, 4),
            "metric_masked": round(search.chosen.metric, 4),
            "metric_after": round(metric_after, 4),
            "time_before_ms": round(time_before, 3),
            "time_after_ms": round(time_after, 3),
            "timed_batch": [int(inputs["input_ids"].shape[0]), n_tokens],
            "flops_removed_share": round(1 - forward_flops(small, n_tokens) / flops_before, 4),
            "stopped_by_max_loss": search.stopped_by_max_loss,
        }
    )
    out = Path(args.out)
    result["loads_with"] = (
        ["headlab", "transformers"]
        if getattr(small.model.config, "headlab_pruned", {}).get("native")
        else ["headlab"]
    )
    save_pruned(small, out, overwrite=args.overwrite, info=result)
    result["out"] = str(out)
    result["bytes_before"] = folder_bytes(lm.path)
    result["bytes_after"] = folder_bytes(out)
    return _print(args, result, search)


def _print(args: argparse.Namespace, result: dict[str, Any], search: Any) -> int:
    if args.json:
        emit_json(result)
        return 0
    if args.csv:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(result["curve"][0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(result["curve"])
        sys.stdout.write(buf.getvalue())
        return 0
    from rich.table import Table

    con = console()
    table = Table(title=f"{result['model']}: pruning curve ({result['importance']} importance)")
    for col in ("step", "heads removed", "share", f"{result['metric']} ({result['unit']})", "loss"):
        table.add_column(col, justify="right")
    for p in result["curve"]:
        table.add_row(
            str(p["step"]),
            f"{p['heads_removed']} / {result['heads_before']}",
            f"{100 * p['fraction']:.0f}%",
            f"{p['metric']:.2f}",
            f"{p['loss']:+.2f}",
        )
    con.print(table)
    if "heads_after" not in result:
        return 0
    con.print(
        f"pruned {result['heads_before']} -> {result['heads_after']} heads "
        f"(per layer {result['heads_per_layer']}); {result['metric']} "
        f"{result['metric_before']:.2f} -> {result['metric_after']:.2f}\n"
        f"parameters {result['params_before']:,} -> {result['params_after']:,}; weights "
        f"{human_bytes(result['bytes_before'])} -> {human_bytes(result['bytes_after'])}\n"
        f"forward ({result['timed_batch'][0]} x {result['timed_batch'][1]} tokens) "
        f"{result['time_before_ms']:.1f} ms -> {result['time_after_ms']:.1f} ms; "
        f"{100 * result['flops_removed_share']:.1f}% of the FLOPs removed\n"
        f"saved to {result['out']}; loads with {' and '.join(result['loads_with'])}"
    )
    return 0
