"""``headlab spec``: a model's heads in numbers, from its config.json alone (no torch)."""

from __future__ import annotations

import argparse
from typing import Any

from headlab.cli._args import integer, text
from headlab.cli._output import note, output
from headlab.layout import sheet
from headlab.layout.sheet import DEFAULT_CONTEXT
from headlab.models.names import DEFAULT_MODEL_NAME, named_config

#: with no model named: headlab's bundled default model (its catalog entry: no torch, no files)
DEFAULT_MODEL = DEFAULT_MODEL_NAME


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


def run(args: argparse.Namespace) -> int:
    options = sheet.SpecOptions(
        context=args.context,
        dtype=args.dtype,
        compare=bool(args.compare),
        listing=args.list,
        plan=args.plan,
        batch=args.batch,
        model_dtype=args.model_dtype,
    )
    names = [*(args.compare or []), *([args.model] if args.model else [])] or [DEFAULT_MODEL]
    data: Any
    text: Any  # what builds the lines a person reads from data
    if args.list:
        data, text = sheet.catalog_json(), sheet.catalog_text
    elif args.plan:
        data, text = sheet.plan_json(named_config(names[0], full=True), options), sheet.plan_text
    else:
        data, text = sheet.spec_json(names, options, resolve=named_config), sheet.spec_text
        for line in sheet.spec_notes(data):
            note("headlab spec", line)
    output(args, data, lambda: text(data))
    return 0
