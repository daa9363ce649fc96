"""Forward time of a 50%-pruned MiniLM against the unpruned model, in one run (issue #5).

The heads to remove are chosen as ``headlab prune --fraction 0.5`` chooses them (gradient
importance on the bundled STS-B sample). Both models are timed alternately on the same random
token batches. Target: the measured time saved reaches at least 80% of the share of FLOPs the
removed heads account for.

    python benchmarks/pruning.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from headlab.datasets import read_stsb, sample_path
from headlab.models import load
from headlab.pruning import prune_model
from headlab.pruning.cost import count_parameters, forward_flops
from headlab.pruning.metrics import StsbMetric
from headlab.pruning.progressive import progressive_prune

SHAPES = [(64, 32), (32, 128), (8, 512)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    full, small = load(), load()
    pairs = read_stsb(sample_path("stsb"))
    evaluation = StsbMetric([p for i, p in enumerate(pairs) if i % 3 != 0])
    importance = StsbMetric([p for i, p in enumerate(pairs) if i % 3 == 0])
    search = progressive_prune(small, evaluation, importance, fraction=0.5)
    small = prune_model(small, search.chosen.removed)
    print(
        f"machine: {platform.machine()} | torch {torch.__version__} | threads "
        f"{torch.get_num_threads()} | heads 72 -> {sum(small.layout.heads_per_layer)} | params "
        f"{count_parameters(full.model):,} -> {count_parameters(small.model):,}"
    )
    print(
        "| batch x tokens | unpruned ms | pruned ms | time saved | FLOPs removed | saved / removed |"
    )
    print("|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for batch, tokens in SHAPES:
        ids = torch.randint(1000, 30000, (batch, tokens), generator=gen)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        times: dict[str, list[float]] = {"full": [], "small": []}
        with torch.inference_mode():
            for _ in range(2):
                full.model(**inputs)
                small.model(**inputs)
            for _ in range(args.repeats):
                for name, lm in (("full", full), ("small", small)):
                    start = time.perf_counter()
                    lm.model(**inputs)
                    times[name].append(time.perf_counter() - start)
        t_full = 1000 * statistics.median(times["full"])
        t_small = 1000 * statistics.median(times["small"])
        saved = 1 - t_small / t_full
        removed = 1 - forward_flops(small, tokens) / forward_flops(full, tokens)
        print(
            f"| {batch} x {tokens} | {t_full:.1f} | {t_small:.1f} | {100 * saved:.1f}% | "
            f"{100 * removed:.1f}% | {saved / removed:.2f} |"
        )


if __name__ == "__main__":
    main()
