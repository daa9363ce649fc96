"""Activation patching of every head: headlab's batched run against a one-forward-per-head
hook loop, in the same run, with peak memory (issue 42).

Both patch each query head's output (its slice of the output projection's input) from the
corrupted IOI run into the clean one, at every position, over the same prompts:

- ``loop``: what a user writes with hooks (TransformerLens' ``get_act_patch_attn_head_out``
  does the same): for each layer and head, a forward pre-hook on that layer's ``o_proj`` swaps
  the head's slice, then one full forward of all prompts; logits at the last position only
  (``logits_to_keep=1``, as headlab's run, so the ratio is the batching and not the head).
- ``loop-prompts``: the same loop with one prompt a forward (6,480 forwards for 270 heads and
  24 prompts), how the issue's reference of 1,408 s was measured.
- ``batched-last``: the same at the last position only, where headlab runs only the last
  token above the patched layer, over the clean run's keys and values (a hook loop costs the
  same at one position as at all: compare it with ``loop``).
- ``batched``: :func:`headlab.causal.patching.run_patching`: all heads of a layer on the batch
  axis, each layer's patches run from that layer's clean residual upward.

Each runs in a fresh process (peak RSS, ``VmHWM``, minus the RSS after loading is what it
needed); the parent checks that both give the same effects and writes a JSON line a run to
``--out`` as it goes. Usage::

    python benchmarks/patching.py                     # SmolLM2, 24 IOI prompts, all 270 heads
    python benchmarks/patching.py --n 4 --layers 3    # a small run: 4 prompts, layers 0..2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODES = ("batched", "batched-last", "loop", "loop-prompts")


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    with contextlib.suppress(OSError):  # Linux only: the peak mark then starts here
        Path("/proc/self/clear_refs").write_text("5")


def one(mode: str, n: int, layers: int | None, threads: int) -> dict[str, Any]:
    import torch

    from headlab.causal.patching import as_task, last_logits, logit_difference, run_patching
    from headlab.models.loading import load

    torch.set_num_threads(threads)
    lm = load("smollm2", with_lm_head=True)
    task = as_task(lm, "ioi", n=n, seed=0)
    chosen = list(range(lm.n_layers if layers is None else layers))
    n_heads = lm.layout.heads_per_layer[0]
    with torch.inference_mode():
        last_logits(lm, task.batches[0].clean[:1])  # first-use allocations
    _reset_peak()
    base = _status("VmRSS")
    start = time.perf_counter()
    if mode.startswith("batched"):
        position = -1 if mode == "batched-last" else None
        result = run_patching(lm, task, layers=chosen, position=position)
        effects = result.effects[chosen].tolist()
        clean, corrupt = result.clean, result.corrupt
    else:
        if mode == "loop-prompts":  # one prompt a batch: the same loop, a forward per prompt
            from headlab.causal.tasks import Batch, Task

            task = Task(
                name=task.name,
                prompts=task.prompts,
                batches=tuple(
                    Batch(
                        clean=b.clean[i : i + 1],
                        corrupt=b.corrupt[i : i + 1],
                        answer=b.answer[i : i + 1],
                        distractor=b.distractor[i : i + 1],
                        index=(b.index[i],),
                    )
                    for b in task.batches
                    for i in range(len(b.index))
                ),
            )
        projs = [h.out_proj for h in lm.layers]
        patched = torch.zeros(len(chosen), n_heads, dtype=torch.float64)
        clean = corrupt = 0.0
        with torch.inference_mode():
            for batch in task.batches:
                seen: dict[int, torch.Tensor] = {}
                hooks = [
                    projs[i].register_forward_pre_hook(
                        lambda m, a, i=i: seen.__setitem__(i, a[0].clone())  # noqa: B023
                    )
                    for i in chosen
                ]
                corrupt += float(
                    logit_difference(
                        last_logits(lm, batch.corrupt), batch.answer, batch.distractor
                    ).sum()
                )
                for h in hooks:
                    h.remove()
                clean += float(
                    logit_difference(
                        last_logits(lm, batch.clean), batch.answer, batch.distractor
                    ).sum()
                )
                for j, layer in enumerate(chosen):
                    width = seen[layer].shape[-1] // n_heads
                    for head in range(n_heads):
                        cols = slice(head * width, (head + 1) * width)

                        def swap(m: Any, a: Any, layer: int = layer, cols: slice = cols) -> Any:
                            x = a[0].clone()
                            x[..., cols] = seen[layer][..., cols]  # noqa: B023
                            return (x,)

                        hook = projs[layer].register_forward_pre_hook(swap)
                        ld = logit_difference(
                            last_logits(lm, batch.clean), batch.answer, batch.distractor
                        )
                        hook.remove()
                        patched[j, head] += float(ld.sum())
        clean, corrupt = clean / n, corrupt / n
        effects = ((clean - patched / n) / (clean - corrupt)).tolist()
    seconds = time.perf_counter() - start
    return {
        "mode": mode,
        "seconds": seconds,
        "peak_bytes": _status("VmHWM") - base,
        "effects": effects,
        "clean": clean,
        "corrupt": corrupt,
        "heads": len(chosen) * n_heads,
        "prompts": n,
        "threads": threads,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=24, help="IOI prompts (default 24)")
    parser.add_argument("--layers", type=int, help="patch layers 0..N-1 only (default all)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=Path("/tmp/headlab-patching.jsonl"))
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"which runs (default {','.join(MODES)})"
    )
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.n, args.layers, args.threads)))
        return 0
    runs = {}
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        cmd = [sys.executable, __file__, "--one", mode, "--n", str(args.n)]
        cmd += ["--threads", str(args.threads)]
        if args.layers:
            cmd += ["--layers", str(args.layers)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        runs[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        with args.out.open("a") as f:
            f.write(json.dumps({k: v for k, v in runs[mode].items() if k != "effects"}) + "\n")
        print(f"{mode}: {runs[mode]['seconds']:.1f} s", file=sys.stderr, flush=True)
    import torch

    from headlab.causal.patching import spearman

    first = runs[modes[0]]
    print(f"SmolLM2-135M, {first['heads']} heads, {args.n} IOI prompts, all positions, ")
    print(f"{first['threads']} threads\n")
    print("| run | seconds | peak beyond the weights | batched is |")
    print("|---|---|---|---|")
    for mode in modes:
        r = runs[mode]
        ratio = r["seconds"] / runs["batched"]["seconds"] if "batched" in runs else float("nan")
        print(f"| {mode} | {r['seconds']:.1f} | {r['peak_bytes'] / 2**20:.0f} MiB | {ratio:.1f}x |")
    a = torch.tensor(first["effects"], dtype=torch.float64)
    for mode in [m for m in modes[1:] if m != "batched-last"]:
        b = torch.tensor(runs[mode]["effects"], dtype=torch.float64)
        print(
            f"\n{modes[0]} against {mode}: max |difference| {float((a - b).abs().max()):.2e}, "
            f"Spearman {spearman(a, b):.4f}"
        )
    print(f"LD clean {first['clean']:.3f}, corrupt {first['corrupt']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
