"""``headlab serve``: the live explorer in the browser, on this machine (:mod:`headlab.serve`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headlab.cli._args import integer, text


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="a live explorer in the browser: your own sentence, any head, heads switched off",
        description=(
            "Serve a local web page over the library: type a sentence and see the layer x head "
            "grid, any head's pattern (for one word, and token to token), its measured role "
            "when a roles run is at hand, and what switching heads off does to a decoder's "
            "next-token prediction or an encoder's sentence embedding. The picker offers "
            "minilm, smollm2 and tiny-shakespeare (and --model); each loads once, on first "
            "use. A JSON API answers under /api/ (docs/explorer.md)."
        ),
    )
    p.add_argument(
        "--model",
        type=text("a model"),
        help="the model the page opens on: minilm (default), smollm2, tiny-shakespeare, a "
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
    import torch

    from headlab.cli._model import model_device
    from headlab.serve import Explorer, RoleSources, Shelf, make_server

    device = model_device(args)  # a one-line error before anything loads
    torch.set_num_threads(args.threads)
    roles = RoleSources(args.roles)  # a bad file fails now, not on the page
    shelf = Shelf(args.model, device=device)
    server = make_server(Explorer(shelf, roles), args.host, args.port)  # the port, before loading
    try:
        if not args.verbose:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        lm = shelf.get()  # the first sentence should not wait for the model
        roles.check_known(
            [lm.name, *(c.label for c in shelf.choices.values() if c.key != shelf.default)]
        )
        host, port = server.server_address[:2]
        note = "" if _loopback(str(host)) else " (reachable from other machines)"
        print(
            f"headlab serve: {lm.name} on http://{_shown(str(host))}:{port}/{note} (Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
        server.serve_forever()
    except KeyboardInterrupt:  # Ctrl-C is how the explorer stops
        print("headlab serve: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0


def _loopback(host: str) -> bool:
    from headlab.serve.http import is_loopback

    return is_loopback(host)


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host
