"""Check `headlab spec --plan roles` against measured peaks (issue #22, item 4).

Each measurement runs in a fresh process: build the model (MiniLM from its package, or the
random 100M-parameter Llama-shaped decoder of ``benchmarks/roles.py``), run one short warm-up
forward (libraries' first-use allocations), prepare the batch, reset the kernel's peak-RSS mark
(``/proc/self/clear_refs``, Linux), take the RSS as the baseline, run one forward pass, and read
the peak RSS (``VmHWM``) back: peak minus baseline is what the pass needed beyond the weights.
tracemalloc cannot see torch's allocations; RSS sees everything the process touched.

- ``roles``: headlab's streaming role statistics (the treebank consumer, 100 bootstrap
  replicates) over ``B`` documents of dev-treebank sentences of up to ``T`` tokens.
- ``eager``: the eager forward returning every layer's ``H x T x T`` patterns
  (``output_attentions=True``) over the same batch.

The plan is computed for the batch's padded length. Usage::

    python benchmarks/plan.py                       # the grid below; exit 1 if any error > 20%
    python benchmarks/plan.py --only minilm:512:8   # one point
    python benchmarks/plan.py --trace decoder-100M:1024:2:roles  # what is alive at the peak

``--trace`` runs the second pass under a ``TorchDispatchMode`` that adds up every storage the
pass creates (freed through a weak reference) and lists the tensors alive at the peak, by the
line of code that made them: the terms a plan must count. Tensors that existed before the pass
(the bootstrap sums, allocated by the first) show up when an in-place op returns them; they
are not part of the peak.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GRID = [
    ("minilm", 256, 8),
    ("minilm", 512, 8),
    ("decoder-100M", 512, 2),
    ("decoder-100M", 1024, 2),
]
MODES = ("roles", "eager")
TOLERANCE = 0.20


def _status(field: str) -> int:
    """A ``/proc/self/status`` size in bytes (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no {field} in /proc/self/status (Linux only)")


def _reset_peak() -> int:
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    return _status("VmRSS")


def _made_by() -> str:
    """The innermost line outside torch that is running (for ``--trace``)."""
    frame = sys._getframe(2)
    while frame is not None and (
        "torch/" in frame.f_code.co_filename or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}:{frame.f_lineno}"


def trace(one_pass: Any) -> dict[str, Any]:
    """Run ``one_pass`` counting the storages it creates: the peak of their sum and what was
    alive then, largest first (``[MiB, op, shape, where]``)."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Live(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, tuple[int, str, tuple[int, ...], str]] = {}
            self.total = self.peak = 0
            self.at_peak: list[tuple[int, str, tuple[int, ...], str]] = []

        def _free(self, key: int) -> None:
            self.total -= self.live.pop(key)[0]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if not isinstance(t, torch.Tensor):
                    continue
                storage = t.untyped_storage()
                if id(storage) in self.live or storage.nbytes() == 0:
                    continue
                self.live[id(storage)] = (storage.nbytes(), str(func), tuple(t.shape), _made_by())
                self.total += storage.nbytes()
                weakref.finalize(storage, self._free, id(storage))
                if self.total > self.peak:
                    self.peak, self.at_peak = self.total, list(self.live.values())
            return out

    mode = Live()
    with mode:
        one_pass()
    alive = sorted(mode.at_peak, key=lambda x: -x[0])
    return {
        "traced_peak": mode.peak,
        "alive": [[round(b / 2**20, 2), op, list(shape), at] for b, op, shape, at in alive],
    }


def child(name: str, length: int, batch: int, mode: str, traced: bool = False) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(HERE))
    from headlab.datasets import read_frequencies, sample_path
    from headlab.models import wrap
    from headlab.models.runner import Batch, encode
    from headlab.models.streaming import StreamingAttention
    from headlab.models.words import align
    from headlab.roles.bootstrap import Sums
    from headlab.roles.passes import TreebankBlocks
    from roles import build_model, documents  # the models and documents of benchmarks/roles.py

    torch.set_num_threads(1)
    model, tokenizer = build_model(name, "eager" if mode == "eager" else "plain", torch.float32)
    lm = wrap(model, tokenizer, name=name)  # switches to headlab's attention function
    if mode == "eager":
        model.set_attn_implementation("eager")
    docs = documents(tokenizer, length, length * batch * 3)
    docs = sorted(docs, key=lambda d: -len(d.words))[:batch]
    items = [(i, align(tokenizer, words=list(d.words))) for i, d in enumerate(docs)]
    inputs = encode(lm, [a.text for _, a in items])
    freq = read_frequencies(sample_path("frequencies"))
    relations = sorted({r for d in docs for r in d.relations} - {"root"})
    sums = Sums(len(docs), 100, 0)

    def one_pass() -> None:
        with torch.inference_mode():
            if mode == "eager":
                out = model(**inputs, output_attentions=True)
                if len(out.attentions) != lm.n_layers:
                    raise SystemExit("the eager forward returned no patterns")
                del out
                return
            record = Batch(
                indices=[i for i, _ in items],
                alignments=[a for _, a in items],
                inputs=inputs,
                capture=None,
                lengths=[int(n) for n in inputs["attention_mask"].sum(1).tolist()],
            )
            blocks = TreebankBlocks(lm, record, docs, freq, relations, sums)
            with StreamingAttention(lm, blocks, stop_after_last=True):
                model(**inputs)

    # the first pass of a shape pays one-time costs (kernels' caches, the libraries'
    # first-use allocations); a corpus run's peak is every later batch's: the second pass
    base = _reset_peak()
    one_pass()
    cold = _status("VmHWM") - base
    if traced:
        return trace(one_pass)
    base = _reset_peak()
    one_pass()
    peak = _status("VmHWM") - base
    return {
        "config": model.config.to_dict(),
        "tokens": int(inputs["input_ids"].shape[1]),
        "batch": int(inputs["input_ids"].shape[0]),
        "words": max(len(a.words) for _, a in items),
        "measured": peak,
        "cold": cold,
    }


def measure(name: str, length: int, batch: int, mode: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", name, str(length), str(batch), mode]
    # glibc hands every freed block of 64 KiB or more back at once: RSS then follows the live
    # tensors (by default, it keeps freed memory for reuse, and RSS shows its high-water mark)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 << 10)}
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "T", "B", "MODE"))
    parser.add_argument("--only", help="MODEL:T:B, one point of the grid")
    parser.add_argument("--trace", help="MODEL:T:B:MODE, the tensors alive at that pass's peak")
    args = parser.parse_args()
    if args.child:
        name, length, batch, mode = args.child
        print(json.dumps(child(name, int(length), int(batch), mode)))
        return
    if args.trace:
        name, length, batch, mode = args.trace.split(":")
        got = child(name, int(length), int(batch), mode, traced=True)
        print(f"peak of the tensors the pass made: {got['traced_peak'] / 2**20:.1f} MiB")
        for mib, op, shape, at in got["alive"]:
            if mib >= 0.1:
                print(f"{mib:9.2f} MiB  {op:28s} {shape!s:22s} {at}")
        return
    from headlab.layout.plan import plan_memory

    grid = GRID
    if args.only:
        name, length, batch = args.only.split(":")
        grid = [(name, int(length), int(batch))]
    worst = 0.0
    print(
        "| model | T (padded) | B | what | predicted MiB | measured MiB | error | first pass MiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, length, batch in grid:
        for mode in MODES:
            got = measure(name, length, batch, mode)
            plan = plan_memory(got["config"], context=got["tokens"], batch=got["batch"])
            predicted = plan.streaming_peak if mode == "roles" else plan.eager_peak
            error = (predicted - got["measured"]) / got["measured"]
            worst = max(worst, abs(error))
            what = "roles (streaming)" if mode == "roles" else "eager capture"
            print(
                f"| {name} | {got['tokens']} | {got['batch']} | {what} | "
                f"{predicted / 2**20:.1f} | {got['measured'] / 2**20:.1f} | {100 * error:+.1f}% | "
                f"{got['cold'] / 2**20:.1f} |",
                flush=True,
            )
    print(f"\nlargest error {100 * worst:.1f}% (target <= {100 * TOLERANCE:.0f}%)")
    if worst > TOLERANCE:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
