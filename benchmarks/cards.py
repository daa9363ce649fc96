"""Every head's card (``headlab cards``), timed on SmolLM2's 270 heads and MiniLM's 72 (issue 56).

Runs, each in a fresh process (its peak RSS is its own):

- ``smollm2-cached``: ``headlab cards``' defaults on SmolLM2 (IOI and induction, 24 prompts each,
  patched at the last position; DLA; composition; OV tokens; gradient importance) with its roles
  run read from headlab's cache (a run is measured and kept first where none is cached);
- ``smollm2-fresh``: the same with nothing cached but the converted model: the roles run is
  measured too (the cache pointed at an empty folder once the model is loaded);
- ``smollm2-all``: as ``smollm2-cached`` with ``--position all`` (every position patched);
- ``minilm``: MiniLM's 72 cards from nothing cached (roles measured; no task: an encoder;
  gradient importance on the bundled STS-B sample).

Each prints one JSON line: the seconds of the model's load and of the cards, each stage's
seconds (as the progress reporter sees them), the CPU seconds of the cards (user and system:
on a shared machine, wall time counts the other tenants too) and the peak RSS (``VmHWM``).
Usage::

    python benchmarks/cards.py                          # all four runs, 2 threads
    python benchmarks/cards.py --runs minilm --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RUNS = ("smollm2-cached", "smollm2-fresh", "smollm2-all", "minilm")


class Stages:
    """A progress reporter that keeps each stage's wall time (summed over its repeats)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._name, self._start = "", 0.0

    def start(self, name: str, total: int | None = None, unit: str = "items") -> None:
        self._name, self._start = name, time.perf_counter()

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        pass

    def end(self) -> None:
        spent = time.perf_counter() - self._start
        self.seconds[self._name] = round(self.seconds.get(self._name, 0.0) + spent, 2)


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def one(run: str, threads: int) -> dict[str, Any]:
    import torch

    from headlab.cache import cached_roles_path
    from headlab.experiments.cards import CardsRequest
    from headlab.models import load
    from headlab.roles.workflow import RolesRequest, keep_roles

    torch.set_num_threads(threads)
    model = "minilm" if run == "minilm" else "smollm2"
    start = time.perf_counter()
    lm = load(model, with_lm_head=model == "smollm2")
    loaded = time.perf_counter() - start
    rss_loaded = _status("VmRSS")
    if run in ("smollm2-fresh", "minilm"):
        os.environ["HEADLAB_CACHE"] = tempfile.mkdtemp(prefix="cards-bench-")
    elif not cached_roles_path(lm.name).is_file():  # measured once, not timed
        keep_roles(RolesRequest().run(lm).to_json())
    stages = Stages()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    position = "all" if run == "smollm2-all" else "last"
    start = time.perf_counter()
    cards = CardsRequest(model=model, position=position).run(lm, stages)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    data = cards.to_json()
    return {
        "run": run,
        "heads": len(data["cards"]),
        "threads": threads,
        "load_s": round(loaded, 1),
        "cards_s": round(seconds, 1),
        "cards_cpu_s": round(cpu_s, 1),
        "stages_s": stages.seconds,
        "roles_from": "measured" if data["roles_from"] == "measured" else "cache",
        "peak_mib": round(_status("VmHWM") / 2**20),
        "rss_after_load_mib": round(rss_loaded / 2**20),
        "skipped": data["skipped"],
        "unexplained": sum(c["verdict"].startswith("unexplained") for c in data["cards"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", default=",".join(RUNS), help="comma-separated, of " + ", ".join(RUNS)
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.threads)), flush=True)
        return
    for run in args.runs.split(","):
        if run not in RUNS:
            raise SystemExit(f"--runs: unknown run {run!r}; expected {', '.join(RUNS)}")
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        argv = [sys.executable, __file__, "--one", run, "--threads", str(args.threads)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        print(
            done.stdout.strip() or f'{{"run": "{run}", "error": {json.dumps(done.stderr[-400:])}}}'
        )


if __name__ == "__main__":
    main()
