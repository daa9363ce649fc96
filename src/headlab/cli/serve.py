"""``headlab serve``: the live explorer in the browser, on this machine (:mod:`headlab.serve`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headlab.cli._args import integer, text
from headlab.cli._model import model_device, quiet_downloads
from headlab.cli._output import note


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="a live explorer in the browser: your own sentence, any head, heads switched off",
        description=(
            "Serve a local web page over the library: type a sentence and see the layer x head "
            "grid, any head's pattern (for one word, and token to token), its measured role "
            "when a roles run is at hand, and what switching heads off does to a decoder's "
            "next-token prediction or an encoder's sentence embedding. The picker offers "
            "minilm, smollm2, gemma3 and tiny-shakespeare (and --model); each loads once, on first "
            "use. A JSON API answers under /api/ (docs/explorer.md)."
        ),
    )
    p.add_argument(
        "--model",
        type=text("a model"),
        help="the model the page opens on: minilm (default), smollm2, gemma3, tiny-shakespeare, a "
        "model folder, a .gguf file, or a model name in the local Hugging Face cache",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only)",
    )
    p.add_argument(
        "--port",
        type=integer(0, 65535),
        default=8000,
        help="the port (default 8000; 0: any free one)",
    )
    p.add_argument(
        "--roles",
        type=text("a file"),
        action="append",
        default=[],
        metavar="FILE",
        help="a roles run from `headlab roles --json > FILE` to show beside each head "
        "(repeatable, one per model; default: the cached one, <cache>/roles/MODEL.json)",
    )
    p.add_argument(
        "--device",
        help="where the models run: cpu, cuda, cuda:N or mps (default: cuda when available, else cpu)",
    )
    p.add_argument(
        "--threads",
        type=integer(1, 1024),
        default=1,
        help="torch threads for the models (default 1: a sentence is small matrices, which one "
        "thread multiplies fastest, and more only wait on each other when the cores are busy)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.serve.launch import Launch, ServeOptions

    options = ServeOptions(
        model=args.model,
        host=args.host,
        port=args.port,
        roles=tuple(args.roles),
        threads=args.threads,
    )
    launch = Launch(options, device=model_device(args))  # bound, before any model loads
    try:
        quiet_downloads(args)
        note("headlab serve", launch.load(), kind="")
        launch.server.serve_forever()
    except KeyboardInterrupt:  # Ctrl-C is how the explorer stops
        print("headlab serve: stopped", file=sys.stderr)
    finally:
        launch.server.server_close()
    return 0
