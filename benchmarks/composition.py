"""Composition scores of every pair of SmolLM2's heads: headlab's low-rank products against the
definition with dense ``E x E`` matrices, in the same run (issue 43).

- ``headlab``: :func:`headlab.causal.composition.composition_scores`, all 270 x 270 pairs of
  heads in layers l1 < l2, Q, K and V (each receiver one ``(D, E)`` factor, each sender one
  ``(E, D)``; all pairs of two layers one matrix product), float64.
- ``dense``: the definition as written (Elhage et al. 2021): each head's ``W_QK = W_Q^T W_K``
  and ``W_OV = W_O W_V`` as ``E x E`` float64 matrices (the input norm's gain folded in, GQA's
  key and value rows shared by a group), then ``|W_QK^T W_OV|_F / (|W_QK|_F |W_OV|_F)`` per
  pair. All pairs would take hours on 2 cores, so it runs the pairs into the heads of one
  receiving layer (``--layer``), checks them against headlab's, and its time for all pairs is
  that layer's time per pair times the number of pairs (marked as extrapolated).

Usage::

    python benchmarks/composition.py                 # SmolLM2, receivers of layer 6 for dense
    python benchmarks/composition.py --layer 3 --out composition.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from headlab.causal.composition import composition_scores
from headlab.models import load


def dense_matrices(lm: Any, upto: int) -> list[dict[str, list[torch.Tensor]]]:
    """Per-head W_QK and W_OV (E x E, float64) of layers ``0..upto``, Llama-style modules."""
    n_heads, n_kv, d = lm.layout.heads_per_layer[0], lm.layout.kv_heads_per_layer[0], lm.head_dim
    group = n_heads // n_kv
    out = []
    base = getattr(lm.model, "model", lm.model)  # a model with a head, or the base model
    for layer in base.layers[: upto + 1]:
        gain = layer.input_layernorm.weight.double()
        attn = layer.self_attn
        q, k, v = (m.weight.double() * gain for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        o = attn.o_proj.weight.double()  # (E, H*D)
        qk, ov = [], []
        for h in range(n_heads):
            g = h // group
            qk.append(q[h * d : (h + 1) * d].T @ k[g * d : (g + 1) * d])  # (E, E)
            ov.append(o[:, h * d : (h + 1) * d] @ v[g * d : (g + 1) * d])  # (E, E)
        out.append({"qk": qk, "ov": ov})
    return out


def _score(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.norm(a @ b) / (torch.linalg.norm(a) * torch.linalg.norm(b)))


def dense_layer(mats: list[dict[str, list[torch.Tensor]]], layer: int) -> dict[str, Any]:
    """Q, K and V scores of every sender below ``layer`` into each of its heads."""
    scores: dict[str, dict[tuple[int, int, int], float]] = {"q": {}, "k": {}, "v": {}}
    for h2, (qk, ov2) in enumerate(zip(mats[layer]["qk"], mats[layer]["ov"], strict=True)):
        for l1 in range(layer):
            for h1, ov1 in enumerate(mats[l1]["ov"]):
                scores["q"][(l1, h1, h2)] = _score(qk.T, ov1)
                scores["k"][(l1, h1, h2)] = _score(qk, ov1)
                scores["v"][(l1, h1, h2)] = _score(ov2, ov1)
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--layer", type=int, default=6, help="receiving layer of the dense run")
    parser.add_argument("--out", type=Path, help="append the result as a JSON line")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    lm = load(args.model)

    start = time.perf_counter()
    ours = composition_scores(lm)
    ours_s = time.perf_counter() - start

    torch.set_grad_enabled(False)
    start = time.perf_counter()
    mats = dense_matrices(lm, args.layer)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    dense = dense_layer(mats, args.layer)
    layer_s = time.perf_counter() - start

    worst = 0.0
    for kind, got in dense.items():
        table = getattr(ours, kind)  # (L, H, L, H)
        for (l1, h1, h2), value in got.items():
            worst = max(worst, abs(float(table[l1, h1, args.layer, h2]) - value))
    heads = lm.layout.heads_per_layer
    all_pairs = sum(
        heads[a] * heads[b] for a in range(len(heads)) for b in range(a + 1, len(heads))
    )
    layer_pairs = len(dense["k"])
    built = sum(heads[: args.layer + 1])  # heads whose E x E matrices were built
    dense_all_s = build_s / built * sum(heads) + layer_s / layer_pairs * all_pairs
    result = {
        "model": lm.name,
        "threads": torch.get_num_threads(),
        "pairs": all_pairs,
        "headlab_s": round(ours_s, 2),
        "dense_layer": args.layer,
        "dense_layer_pairs": layer_pairs,
        "dense_build_s": round(build_s, 2),
        "dense_layer_s": round(layer_s, 2),
        "dense_all_s_extrapolated": round(dense_all_s, 1),
        "ratio_extrapolated": round(dense_all_s / ours_s, 1),
        "max_abs_diff": worst,
        "baseline": {k: round(v, 4) for k, v in ours.baseline.items()},
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with args.out.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
