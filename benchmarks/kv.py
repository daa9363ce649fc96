"""The mixed KV cache's curve on SmolLM2-135M: KV heads streaming against bytes, passkeys,
perplexity and decode time, for heads chosen by headlab's scores and at random (issue #57).

Every point runs the model through :class:`headlab.models.kv_mixed.MixedKVCache` (the full
cache, the point at fraction 0, is transformers' own ``DynamicCache``): the bytes are read from
the cache's tensors after one ``--context`` of TinyShakespeare (held out from the scoring
chunks), the perplexity is that chunk's, the passkeys are ``--passkeys`` prompts of about
``--context`` tokens with the needle at depths 0.1 to 0.9 (keys drawn at seed 1, the scoring
used seed 0), and the time is per greedy token decoded after the chunk. The scores come from
``headlab kv --json`` (``--scores``) or are computed here as ``headlab kv`` computes them.

Results are written after every point (``--out``), so a run cut short keeps what it measured.

    python benchmarks/kv.py --scores kv.json --out kv-curve.json [--figure curve.png]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from headlab.datasets.passkey import passkeys
from headlab.experiments.kv import DEPTHS, KVRequest, choose, random_heads, text_ids
from headlab.experiments.kv_measure import curve_point
from headlab.experiments.kv_scores import (
    encode_passkey,
    fillers_for,
    outside_scores,
    retrieval_scores,
)
from headlab.models import LoadedModel, load
from headlab.outputs import write_text_atomic

TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus" / "tinyshakespeare"


def _scores(lm: LoadedModel, request: KVRequest, given: str | None) -> dict[str, torch.Tensor]:
    if given:
        data = json.loads(Path(given).read_text(encoding="utf-8"))
        scores = {k: torch.tensor(v) for k, v in data["scores"].items()}
    else:
        chunks = text_ids(lm, request)[:2]
        fillers = fillers_for(lm, request.context)
        prompts = [encode_passkey(lm, p) for p in passkeys(request.passkeys, fillers, DEPTHS)]
        scores = {
            "outside": outside_scores(lm, chunks, sink=request.sink, window=request.window),
            "retrieval": retrieval_scores(lm, prompts),
        }
    scores["both"] = torch.maximum(scores["outside"], scores["retrieval"])
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scores", help="a headlab kv --json output (default: score here)")
    parser.add_argument("--text", default=str(TEXT / "input.txt"))
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--sink", type=int, default=4)
    parser.add_argument("--fractions", default="0.5,0.25,0.75")
    parser.add_argument("--choices", default="outside,retrieval,both,random")
    parser.add_argument("--passkeys", type=int, default=20)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--out", default="kv-curve.json")
    parser.add_argument("--figure")
    parser.add_argument(
        "--all", action=argparse.BooleanOptionalAction, default=True, help="every head streaming"
    )
    parser.add_argument(
        "--full", action=argparse.BooleanOptionalAction, default=True, help="the full cache"
    )
    args = parser.parse_args()
    lm = load("smollm2", with_lm_head=True)
    request = KVRequest(
        context=args.context, window=args.window, sink=args.sink, text=args.text, texts=3
    )
    scores = _scores(lm, request, args.scores)
    held_out = text_ids(lm, request)[2]  # the scores read chunks 0 and 1
    fillers = fillers_for(lm, args.context)
    prompts = [encode_passkey(lm, p) for p in passkeys(args.passkeys, fillers, DEPTHS, seed=1)]
    n_layers, n_kv = scores["outside"].shape
    every = [(layer, h) for layer in range(n_layers) for h in range(n_kv)]
    run: dict[str, Any] = {
        "machine": f"{platform.machine()} | torch {torch.__version__} | threads "
        f"{torch.get_num_threads()}",
        "model": lm.name,
        "context": args.context,
        "sink": args.sink,
        "window": args.window,
        "passkey_tokens": [p.ids.shape[1] for p in prompts],
        "curve": [],
    }
    plan: list[tuple[str, list[tuple[int, int]]]] = [("full", [])] if args.full else []
    for fraction in (float(f) for f in args.fractions.split(",")):
        for choice in args.choices.split(","):
            heads = (
                random_heads(n_layers, n_kv, fraction, seed=0)
                if choice == "random"
                else choose(scores[choice], fraction)
            )
            plan.append((choice, list(heads)))
    if args.all:
        plan.append(("all", every))
    for choice, heads in plan:
        began = time.perf_counter()
        point = curve_point(
            lm,
            heads,
            sink=args.sink,
            window=args.window,
            text=held_out,
            prompts=prompts,
            decode_tokens=args.decode,
        )
        point = {"choice": choice, **point, "seconds": round(time.perf_counter() - began, 1)}
        run["curve"].append(point)
        write_text_atomic(args.out, json.dumps(run, indent=1) + "\n")
        print(json.dumps(point), flush=True)
    if args.figure:
        figure(run, args.figure)


def figure(run: dict[str, Any], path: str) -> None:
    """Passkey accuracy and perplexity against the share of KV bytes kept, one line a choice."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = run["curve"]
    full = next(p for p in curve if p["choice"] == "full")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for choice in dict.fromkeys(p["choice"] for p in curve if p["choice"] not in ("full", "all")):
        points = [
            full,
            *sorted((p for p in curve if p["choice"] == choice), key=lambda p: p["fraction"]),
        ]
        points += [p for p in curve if p["choice"] == "all"]
        kept = [p["kv_bytes"] / full["kv_bytes"] for p in points]
        axes[0].plot(kept, [p["passkey"] for p in points], marker="o", label=choice)
        axes[1].plot(kept, [p["perplexity"] for p in points], marker="o", label=choice)
    axes[0].set(xlabel="KV bytes kept (share of the full cache)", ylabel="passkey accuracy")
    axes[1].set(xlabel="KV bytes kept (share of the full cache)", ylabel="perplexity")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.invert_xaxis()
        ax.legend()
    fig.suptitle(
        f"{run['model']}, {run['context']} tokens, sink {run['sink']} + window {run['window']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
