"""Role statistics at the speed of the model's own forward (issue #9).

For each model and sequence length, three ways over the same documents and padded batches, each
in a fresh process (peak RSS is the process's own):

- ``plain``: the model's fastest forward (sdpa, nothing kept): the floor.
- ``headlab``: every role statistic of every head, taken from headlab's own attention, which
  computes each layer in query blocks during the forward pass (nothing recomputed or kept).
- ``eager``: HF eager attention with ``output_attentions=True``, the same statistics computed
  from the returned maps (what older tools do).
- ``tlens`` (only when TransformerLens 4 is installed, an optional benchmark-only dependency):
  ``TransformerBridge.run_with_cache`` keeping only the patterns, the same statistics from them.

Documents are consecutive UD English EWT dev sentences joined (with their trees) up to the
length. Models: all-MiniLM-L6-v2, and a GQA decoder sized like a 100M-parameter model (12
layers, width 768, 12 heads, 4 KV heads; random weights built in-process).

    python benchmarks/roles.py            # the full table (several minutes)
    python benchmarks/roles.py --quick    # MiniLM at 128 tokens only
"""

from __future__ import annotations

import argparse
import json
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
    for s in read_conllu(DATA / "ud-ewt" / "en_ewt-ud-dev.conllu"):
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


def build_model(name: str, mode: str, dtype: torch.dtype) -> Any:
    """``(hf model, tokenizer)`` for ``name`` with the attention ``mode`` asks for."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from headlab.models import default_model_path

    path = str(default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    attn = "eager" if mode == "eager" else "sdpa"
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
    return model.to(dtype).eval(), tokenizer


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


def child(name: str, length: int, mode: str, n_tokens: int, bf16: bool) -> dict[str, Any]:
    from headlab.datasets import read_frequencies, sample_path
    from headlab.models import wrap
    from headlab.models.runner import Batch, _pack, encode
    from headlab.models.streaming import StreamingAttention
    from headlab.models.words import align
    from headlab.roles.bootstrap import Sums
    from headlab.roles.measure import RoleOptions, TreebankBlocks

    dtype = torch.bfloat16 if bf16 else torch.float32
    model, tokenizer = build_model(name, mode, dtype)
    docs = documents(tokenizer, length, n_tokens)
    if mode == "plain":
        lm = None
    else:
        lm = wrap(model, tokenizer, name=name)
        if mode == "eager":
            model.set_attn_implementation("eager")
    bridge = transformer_lens_bridge(model, tokenizer) if mode == "tlens" else None
    items = [(i, align(tokenizer, words=list(d.words))) for i, d in enumerate(docs)]
    items.sort(key=lambda item: item[1].n_tokens)
    batches = list(_pack(items, 4096))
    options = RoleOptions(replicates=100, dtype=dtype)
    relations = sorted({r for d in docs for r in d.relations} - {"root"})
    sums = Sums(len(docs), options.replicates, 0)
    freq = read_frequencies(sample_path("frequencies"))
    prepared = []
    for chunk in batches:
        if lm is not None:
            inputs = encode(lm, [a.text for _, a in chunk])
        else:
            enc = tokenizer([a.text for _, a in chunk], return_tensors="pt", padding=True)
            inputs = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask")}
        prepared.append((chunk, inputs))
    start = time.perf_counter()
    with torch.inference_mode():
        for chunk, inputs in prepared:
            if mode == "plain":
                model(**inputs)
                continue
            assert lm is not None
            batch = Batch(
                indices=[i for i, _ in chunk],
                alignments=[a for _, a in chunk],
                inputs=inputs,
                capture=None,
                lengths=[int(n) for n in inputs["attention_mask"].sum(1).tolist()],
            )
            blocks = TreebankBlocks(lm, batch, docs, freq, relations, sums)
            if mode == "eager":
                out = model(**inputs, output_attentions=True)
                eager_blocks(out.attentions, blocks)
            elif bridge is not None:
                _, cache = bridge.run_with_cache(
                    inputs["input_ids"],
                    attention_mask=inputs["attention_mask"],
                    names_filter=lambda hook: hook.endswith("attn.hook_pattern"),
                )
                maps = tuple(cache[f"blocks.{i}.attn.hook_pattern"] for i in range(lm.n_layers))
                del cache
                eager_blocks(maps, blocks)
                del maps
            else:
                with StreamingAttention(lm, blocks, dtype=dtype):
                    model(**inputs)
    seconds = time.perf_counter() - start
    result: dict[str, Any] = {
        "seconds": seconds,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "documents": len(docs),
        "tokens": sum(a.n_tokens for _, a in items),
    }
    if mode != "plain" and "positional.hits" in sums:
        from headlab.roles.probes import broad, delimiter, positional

        scores = {**positional.scores(sums), **delimiter.scores(sums), **broad.scores(sums)}
        result["scores"] = {
            k: scores[k][0].flatten().tolist() for k in ("positional", "delimiter", "broad")
        }
    return result


def transformer_lens_bridge(model: Any, tokenizer: Any) -> Any:
    """TransformerLens 4's ``TransformerBridge`` over the same weights (saved to a temporary
    folder first: the bridge boots from a model folder)."""
    import tempfile

    from transformer_lens.model_bridge import TransformerBridge

    folder = tempfile.mkdtemp(prefix="headlab-tlens-")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return TransformerBridge.boot_transformers(folder, tokenizer=tokenizer, device="cpu")


def run_child(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=5, metavar=("MODEL", "T", "MODE", "TOKENS", "BF16"))
    args = parser.parse_args()
    if args.child:
        name, length, mode, tokens, bf16 = args.child
        print(json.dumps(child(name, int(length), mode, int(tokens), bf16 == "1")))
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
    print(
        f"machine: {platform.machine()} | torch {torch.__version__} | threads "
        f"{torch.get_num_threads()} | {TOKENS_PER_RUN} tokens per run | 100 bootstrap replicates"
    )
    print(
        "| model | T | plain s | headlab s | eager+stats s | headlab/plain | eager/headlab "
        "| plain MiB | headlab MiB | eager MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = {}
    for name, length in grid:
        r = results[name, length] = {
            m: run_child(name, str(length), m, str(TOKENS_PER_RUN), "0")
            for m in ("plain", "headlab", "eager")
        }
        print(
            f"| {name} | {length} | {r['plain']['seconds']:.2f} | {r['headlab']['seconds']:.2f} | "
            f"{r['eager']['seconds']:.2f} | {r['headlab']['seconds'] / r['plain']['seconds']:.2f} | "
            f"{r['eager']['seconds'] / r['headlab']['seconds']:.2f} | {r['plain']['peak_mib']:.0f} | "
            f"{r['headlab']['peak_mib']:.0f} | {r['eager']['peak_mib']:.0f} |",
            flush=True,
        )
    # memory against corpus size, and bfloat16 against float32 (MiniLM, 128 tokens)
    small = run_child("minilm", "128", "headlab", str(TOKENS_PER_RUN // 4), "0")
    large = run_child("minilm", "128", "headlab", str(TOKENS_PER_RUN * 4), "0")
    print(
        f"\nmemory vs corpus (MiniLM, T=128): {small['documents']} documents "
        f"{small['peak_mib']:.0f} MiB, {large['documents']} documents {large['peak_mib']:.0f} MiB"
    )
    fp32 = run_child("minilm", "128", "headlab", str(TOKENS_PER_RUN), "0")
    bf16 = run_child("minilm", "128", "headlab", str(TOKENS_PER_RUN), "1")
    plain16 = run_child("minilm", "128", "plain", str(TOKENS_PER_RUN), "1")
    diffs = {
        k: max(abs(a - b) for a, b in zip(fp32["scores"][k], bf16["scores"][k], strict=True))
        for k in fp32["scores"]
    }
    print(
        f"bfloat16 (model and q k^T; softmax and statistics in float32): headlab {bf16['seconds']:.2f} s "
        f"vs {fp32['seconds']:.2f} s in float32; plain bf16 forward {plain16['seconds']:.2f} s; "
        "largest score change: " + ", ".join(f"{k} {v:.4f}" for k, v in diffs.items())
    )
    try:
        import transformer_lens  # noqa: F401
    except ImportError:
        print("TransformerLens: not installed (optional, benchmarks only): not measured")
        return
    print(
        "\nTransformerLens 4 (TransformerBridge, run_with_cache keeping only the patterns), the "
        "same statistics from its patterns:\n"
        "| model | T | TransformerLens s | TL / headlab | TL MiB | largest score difference |\n"
        "|---|---|---|---|---|---|"
    )
    for (name, length), r in results.items():
        try:
            tl = run_child(name, str(length), "tlens", str(TOKENS_PER_RUN), "0")
        except RuntimeError as exc:
            print(f"| {name} | {length} | failed: {str(exc).splitlines()[-1]} | | | |")
            continue
        diff = max(
            abs(a - b)
            for k in tl["scores"]
            for a, b in zip(tl["scores"][k], r["headlab"]["scores"][k], strict=True)
        )
        print(
            f"| {name} | {length} | {tl['seconds']:.2f} | "
            f"{tl['seconds'] / r['headlab']['seconds']:.2f} | {tl['peak_mib']:.0f} | {diff:.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
