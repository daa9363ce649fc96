"""``headlab roles`` on MiniLM over all of UD EWT dev plus GAP development: time and memory.

Target (issue #4): under 3 minutes on the 2-core machine, with peak memory that does not grow
with the corpus. Each size runs in a fresh process; peak RSS is the process's own maximum.

    python benchmarks/roles_corpus.py
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

CHILD = """
import json, resource, sys, time
from headlab.datasets import read_conllu, read_gap, read_frequencies, sample_path
from headlab.models import load
from headlab.roles import measure_roles
limit = None if sys.argv[1] == "all" else int(sys.argv[1])
t0 = time.perf_counter()
lm = load()
tb = read_conllu(sys.argv[2], limit=limit)
gap = read_gap(sys.argv[3], limit=limit)
report = measure_roles(lm, tb, gap=gap, frequencies=read_frequencies(sample_path("frequencies")))
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"sentences": len(tb), "gap": len(gap.examples), "seconds": seconds,
                  "peak_mib": peak}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.parse_args()
    tb = DATA / "ud-ewt" / "en_ewt-ud-dev.conllu"
    gap = DATA / "gap" / "gap-development.tsv"
    rows = []
    for limit in ("250", "1000", "all"):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, limit, str(tb), str(gap)],
            capture_output=True,
            text=True,
            check=True,
            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"machine: {platform.machine()} | torch {torch.__version__} | "
        f"threads {torch.get_num_threads()} | 100 bootstrap replicates"
    )
    print("| UD EWT dev sentences | GAP examples | seconds | peak RSS MiB |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['sentences']} | {r['gap']} | {r['seconds']:.1f} | {r['peak_mib']:.0f} |")


if __name__ == "__main__":
    main()
