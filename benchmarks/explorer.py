"""How fast the live explorer answers one sentence, against the model's own forward pass.

For each sentence length, in one run and in alternating blocks (so the machine's drift hits all
alike), the median time of:

- ``forward``: the model's plain forward on the encoded sentence (no hooks);
- ``capture``: :func:`headlab.explore.sentence.capture_sentence` and ``to_json()``: the same
  forward with every head captured, word- and token-level patterns, the page's JSON;
- ``request``: ``POST /api/sentence`` to ``headlab serve``'s app on a localhost port, JSON
  encoded, sent, answered and decoded: what the page waits for.

Ratios are the medians of the blocks' ratios, against ``forward``. Run at each of ``--threads``
(``torch.set_num_threads``; ``headlab serve`` uses 1 by default). ``forward`` and ``capture``
each run in a fresh thread, as the server answers each request in one: on a busy machine a
thread's OpenMP team matters more than the work (the main thread's forward, here, took 4x to
9x a request thread's at 2 threads).

    python benchmarks/explorer.py [--models minilm smollm2] [--threads 1 2] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LESSON = "The chef who trained in Paris prepared the fish carefully."
LONG = (
    "When the old sailor finally came home after many years at sea, he found that the harbour "
    "had changed, the boats were new, and nobody in the village remembered his name, though "
    "the children still sang the songs he had taught their parents long ago."
)


def in_thread(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` called in a thread of its own, as ``ThreadingHTTPServer`` answers a request."""

    def run() -> None:
        thread = threading.Thread(target=fn)
        thread.start()
        thread.join()

    return run


def blocks(
    fns: dict[str, Callable[[], object]], repeats: int, block: int = 3
) -> dict[str, list[float]]:
    """Per-call seconds of each function, block by block (one untimed call first), the blocks
    of the functions alternating and their order turning every round."""
    for fn in fns.values():
        fn()
    names = list(fns)
    out: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(max(1, repeats // block)):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            start = time.perf_counter()
            for _ in range(block):
                fns[name]()
            out[name].append((time.perf_counter() - start) / block)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["minilm"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()

    from headlab.explore.sentence import capture_sentence
    from headlab.models import encode
    from headlab.serve import Explorer, Shelf, start_server

    shelf = Shelf()
    server = start_server(Explorer(shelf), port=0)
    print(
        f"machine: {platform.machine()} | {os.cpu_count()} cores | torch {torch.__version__} | "
        f"load average {os.getloadavg()[0]:.1f} at the start"
    )
    print(
        "| model | tokens | threads | forward ms | capture ms | request ms "
        "| capture/forward | request/forward |"
    )
    print("|---|---|---|---|---|---|---|---|")
    try:
        for key in args.models:
            lm = shelf.get(key)
            for text in (LESSON, LONG):
                inputs = encode(lm, [text])
                n_tokens = int(inputs["input_ids"].shape[1])
                body = json.dumps({"model": key, "text": text}).encode()

                def forward(inputs=inputs, lm=lm) -> None:
                    with torch.inference_mode():
                        lm.model(**inputs)

                def capture(text=text, lm=lm) -> None:
                    capture_sentence(lm, text).to_json()

                def request(body=body) -> None:
                    req = urllib.request.Request(
                        server.url + "api/sentence",
                        data=body,
                        headers={"Content-Type": "application/json"},
                    )
                    with urllib.request.urlopen(req) as response:
                        json.loads(response.read())

                for threads in args.threads:
                    torch.set_num_threads(threads)
                    times = blocks(
                        {
                            "forward": in_thread(forward),
                            "capture": in_thread(capture),
                            "request": request,
                        },
                        args.repeats,
                    )
                    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
                    ratio = {
                        k: statistics.median(
                            a / b for a, b in zip(times[k], times["forward"], strict=True)
                        )
                        for k in ("capture", "request")
                    }
                    print(
                        f"| {lm.name} | {n_tokens} | {threads} | {med['forward']:.1f} | "
                        f"{med['capture']:.1f} | {med['request']:.1f} | "
                        f"{ratio['capture']:.2f} | {ratio['request']:.2f} |",
                        flush=True,
                    )
    finally:
        server.stop()
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
