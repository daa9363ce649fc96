"""Q-, K- and V-composition scores between every pair of heads (Elhage et al. 2021).

A head of a later layer *composes* with a head of an earlier one when it reads what the earlier
head wrote: its queries (Q-composition), its keys (K-composition) or its values
(V-composition) are computed from the subspace the earlier head's OV circuit writes to.
Elhage et al. ("A Mathematical Framework for Transformer Circuits", section "Virtual Attention
Heads" and "Composition") measure it with Frobenius norms of the weight products, for a
sender head ``h1`` of layer ``l1`` and a receiver head ``h2`` of layer ``l2 > l1``::

    Q:  |W_QK^{h2 T} W_OV^{h1}|_F / (|W_QK^{h2 T}|_F |W_OV^{h1}|_F)
    K:  |W_QK^{h2}   W_OV^{h1}|_F / (|W_QK^{h2}|_F   |W_OV^{h1}|_F)
    V:  |W_OV^{h2}   W_OV^{h1}|_F / (|W_OV^{h2}|_F   |W_OV^{h1}|_F)

with ``W_QK = W_Q^T W_K`` (the score of query position ``t`` for key ``s`` is
``x_t^T W_QK x_s``) and ``W_OV = W_O W_V``, each ``E x E``. Each head's reading weights
``W_Q``, ``W_K``, ``W_V`` carry its layer's input-norm gain (``W diag(gain)``); under GQA a
query head uses its KV group's key and value rows. A score lies in ``[0, 1]``; it is near
``sqrt(D / E)``-ish for unrelated random weights, so each kind comes with a ``baseline``: the
mean score of Gaussian matrices of the same shapes (fixed seed), the chance level to read a
score against (Elhage et al. compare to such random matrices).

What the scores leave out, as is usual: rotary position embeddings (which make ``W_QK``
depend on the distance between positions: these are the scores of the weights without
rotary), biases, the norms' division by each row's scale, and per-head query/key norms
(Qwen3, OLMo 2).

No ``E x E`` matrix is formed. Every product here is ``A^T B W_O R`` with ``A, B`` ``(D, E)``,
and ``|A^T Y|_F^2 = tr(Y^T A A^T Y)``, so ``|A^T Y|_F = |R_A^T Y|_F`` for any ``D x D`` factor
``R_A R_A^T = A A^T``. A receiver thus becomes one ``(D, E)`` matrix ``R_A^T B`` and a sender
one ``(E, D)`` matrix ``W_O R_V`` (``R_V R_V^T = W_V W_V^T``); the numerator of a pair is the
Frobenius norm of their ``D x D`` product, and all pairs of two layers are one
``(H D, E) @ (E, H D)`` product. Float64 throughout (float32 on MPS).

Shape vocabulary: ``L`` layers, ``H`` query heads, ``Hkv`` KV heads, ``D`` head width,
``E`` model width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.models.ov import layer_weights

KINDS = ("q", "k", "v")
#: Gaussian draws averaged into each kind's baseline
BASELINE_DRAWS = 8
BASELINE_SEED = 0


@dataclass(frozen=True, kw_only=True)
class CompositionScores:
    """Every sender/receiver pair's Q-, K- and V-composition score.

    Attributes:
        model: the model's name.
        q, k, v: float64 ``(L, H, L, H)`` on the CPU: ``[l1, h1, l2, h2]`` is how much receiver
            head ``h2`` of layer ``l2`` composes with sender head ``h1`` of layer ``l1``; NaN
            where ``l2 <= l1`` and for heads a pruned layer lacks.
        baseline: each kind's mean score over Gaussian weights of the same shapes.
    """

    model: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    baseline: dict[str, float]

    def scores(self, kind: str) -> torch.Tensor:
        """The ``(L, H, L, H)`` scores of ``kind`` (``"q"``, ``"k"`` or ``"v"``)."""
        if kind not in KINDS:
            raise InputError(f"composition kind must be one of q, k, v, got {kind!r}")
        return {"q": self.q, "k": self.k, "v": self.v}[kind]

    def top_pairs(self, kind: str, n: int = 10) -> list[dict[str, Any]]:
        """The ``n`` highest-scoring pairs of ``kind``, highest first:
        ``{"sender": {"layer", "head"}, "receiver": {"layer", "head"}, "score", "baseline"}``."""
        scores = self.scores(kind)
        if n < 0:
            raise InputError(f"n must be at least 0, got {n}")
        flat = torch.nan_to_num(scores.flatten(), nan=-math.inf)
        count = min(n, int(torch.isfinite(flat).sum()))
        _, order = torch.sort(flat, descending=True, stable=True)
        out = []
        for index in order[:count].tolist():
            l1, h1, l2, h2 = torch.unravel_index(torch.tensor(index), scores.shape)
            out.append(
                {
                    "sender": {"layer": int(l1), "head": int(h1)},
                    "receiver": {"layer": int(l2), "head": int(h2)},
                    "score": float(flat[index]),
                    "baseline": self.baseline[kind],
                }
            )
        return out

    def to_json(self) -> dict[str, Any]:
        """``{"model", "n_layers", "n_heads", "baseline": {"q", "k", "v"}, "pairs": [{"sender":
        {"layer", "head"}, "receiver": {"layer", "head"}, "q", "k", "v", "best"}, ...],
        "top": {"q", "k", "v"}}``: one entry per pair with ``l1 < l2``, best first (by
        ``best``, the largest of the three scores over its kind's baseline), and each kind's
        ten highest pairs."""
        n_layers, n_heads = self.q.shape[:2]
        defined = torch.isfinite(self.q) & torch.isfinite(self.k) & torch.isfinite(self.v)
        ratio = torch.stack([self.scores(kind) / self.baseline[kind] for kind in KINDS]).amax(
            0
        )  # (L, H, L, H)
        index = defined.nonzero().tolist()
        index.sort(key=lambda i: -float(ratio[tuple(i)]))
        pairs = [
            {
                "sender": {"layer": l1, "head": h1},
                "receiver": {"layer": l2, "head": h2},
                "q": float(self.q[l1, h1, l2, h2]),
                "k": float(self.k[l1, h1, l2, h2]),
                "v": float(self.v[l1, h1, l2, h2]),
                "best": float(ratio[l1, h1, l2, h2]),
            }
            for l1, h1, l2, h2 in index
        ]
        return {
            "model": self.model,
            "n_layers": int(n_layers),
            "n_heads": int(n_heads),
            "baseline": dict(self.baseline),
            "pairs": pairs,
            "top": {kind: self.top_pairs(kind, 10) for kind in KINDS},
        }


def _gram(rows: torch.Tensor) -> torch.Tensor:
    """``rows rows^T``: ``(..., D, E)`` -> ``(..., D, D)``."""
    return rows @ rows.transpose(-1, -2)


def _factor(gram: torch.Tensor) -> torch.Tensor:
    """``R`` with ``R R^T = gram`` for symmetric positive semi-definite ``(..., D, D)``: the
    Cholesky factor, or where that fails (a rank-deficient head: zero weights, ``D > E``) one
    from the eigendecomposition."""
    factor, info = torch.linalg.cholesky_ex(gram)
    failed = info != 0
    if bool(failed.any()):
        values, vectors = torch.linalg.eigh(gram[failed])
        factor[failed] = vectors * values.clamp(min=0).sqrt().unsqueeze(-2)
    return factor


def _norm(outer_gram: torch.Tensor, inner_gram: torch.Tensor) -> torch.Tensor:
    """``|outer^T inner|_F = sqrt(tr(outer outer^T inner inner^T))`` from the two ``(..., D, D)``
    Gram matrices -> ``(...)``."""
    return (outer_gram * inner_gram).sum((-1, -2)).clamp(min=0).sqrt()


@dataclass(frozen=True, kw_only=True)
class _Reader:
    """How one kind's receivers of one layer read: ``|X_h Y|_F = |post_h^T inner_(h // G) Y|_F``
    for ``X_h`` the receiver's ``E x E`` matrix (``W_QK^T``, ``W_QK`` or ``W_OV``).

    Shape:
        inner: ``(Hi, D, E)`` with ``Hi`` ``H`` or ``Hkv``; post: ``(H, D, D)`` or ``None``
        (already folded into ``inner``); norm: ``(H,)`` ``|X_h|_F``.
    """

    inner: torch.Tensor
    post: torch.Tensor | None
    norm: torch.Tensor


def _folded(weight: torch.Tensor, gain: torch.Tensor | None, wide: torch.dtype) -> torch.Tensor:
    """``weight (..., D, E) diag(gain)`` in ``wide``."""
    weight = weight.to(wide)
    return weight if gain is None else weight * gain.to(weight.device, wide)


def _layer_factors(
    w: dict[str, torch.Tensor],
) -> tuple[dict[str, _Reader], torch.Tensor, torch.Tensor]:
    """One layer's readers of each kind, its senders' factors ``W_O R_V`` ``(H, E, D)`` and
    ``|W_OV|_F`` ``(H,)``, from the folded ``query`` ``(H, D, E)``, ``key``, ``value``
    ``(Hkv, D, E)`` and ``out`` ``(H, E, D)``."""
    group = w["query"].shape[0] // w["key"].shape[0]
    query_gram, key_gram = _gram(w["query"]), _gram(w["key"])  # (H, D, D), (Hkv, D, D)
    value_gram = _gram(w["value"])  # (Hkv, D, D)
    out_gram = w["out"].transpose(-1, -2) @ w["out"]  # (H, D, D): W_O^T W_O
    key_gram, value_gram = (g.repeat_interleave(group, 0) for g in (key_gram, value_gram))
    qk_norm = _norm(query_gram, key_gram)  # |W_Q^T W_K|_F, (H,)
    ov_norm = _norm(out_gram, value_gram)  # |W_O W_V|_F, (H,)
    readers = {
        # W_QK^T = W_K^T W_Q: fold R_K (D x D, per query head) into the query rows
        "q": _Reader(
            inner=_factor(key_gram).transpose(-1, -2) @ w["query"], post=None, norm=qk_norm
        ),
        # W_QK = W_Q^T W_K: the KV head's rows meet the senders once; R_Q after, per query head
        "k": _Reader(inner=w["key"], post=_factor(query_gram), norm=qk_norm),
        # W_OV = W_O W_V: likewise, with R_O from W_O^T W_O
        "v": _Reader(inner=w["value"], post=_factor(out_gram), norm=ov_norm),
    }
    return readers, w["out"] @ _factor(value_gram), ov_norm


def _block_norms(reader: _Reader, product: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``|post_h^T P_(h // G, j)|_F`` ``(H, Hs)`` from ``product`` ``(Hi D, Hs D)``, the inner
    rows times every sender's factor."""
    n_inner, d = reader.inner.shape[:2]
    if reader.post is not None:  # (Hi, G D, D) @ (Hi, D, Hs D): each query head's R^T
        post = reader.post.transpose(-1, -2).reshape(n_inner, -1, d)
        product = post @ product.view(n_inner, d, -1)
    blocks = product.reshape(n_heads, d, -1, d)  # (H, D, Hs, D)
    return torch.linalg.vector_norm(blocks, dim=(1, 3))


def _all_scores(layers: list[dict[str, torch.Tensor]], n_heads: int) -> dict[str, torch.Tensor]:
    """``(L, H, L, H)`` scores of every kind from each layer's folded weights (as
    :func:`_layer_factors`); NaN where ``l2 <= l1`` or a head is missing."""
    n_layers = len(layers)
    width, d = layers[0]["out"].shape[1:]
    factors = [_layer_factors(w) for w in layers]
    # every sender's W_O R_V side by side, once: (E, sum_l H_l D); layer l2 reads a prefix
    senders = torch.cat([f[1].permute(1, 0, 2).reshape(width, -1) for f in factors], 1)
    send_norms = torch.cat([f[2] for f in factors])  # (sum_l H_l,)
    starts = [0]
    for f in factors:
        starts.append(starts[-1] + f[1].shape[0])
    out = {k: torch.full((n_layers, n_heads) * 2, torch.nan, dtype=torch.float64) for k in KINDS}
    for l2 in range(1, n_layers):
        readers = factors[l2][0]
        inner = torch.cat([readers[k].inner.flatten(0, 1) for k in KINDS])  # (sum Hi D, E)
        product = inner @ senders[:, : starts[l2] * d]  # (sum Hi D, Hs D): the one big product
        row = 0
        for kind in KINDS:
            reader = readers[kind]
            rows = reader.inner.shape[0] * d
            norms = _block_norms(reader, product[row : row + rows], len(reader.norm))
            row += rows
            denominator = reader.norm[:, None] * send_norms[None, : starts[l2]]  # (H2, Hs)
            score = torch.where(denominator > 0, norms / denominator, torch.nan)
            score = score.double().cpu()
            for l1 in range(l2):
                block = score[:, starts[l1] : starts[l1 + 1]].T  # (H1, H2)
                out[kind][l1, : block.shape[0], l2, : block.shape[1]] = block
    return out


def _baseline(d: int, width: int, wide: torch.dtype) -> dict[str, float]:
    """Each kind's mean score over every pair of :data:`BASELINE_DRAWS` Gaussian senders and
    receivers of ``D x E`` (``E x D`` for ``W_O``) weights."""
    generator = torch.Generator().manual_seed(BASELINE_SEED)

    def gaussian(*shape: int) -> torch.Tensor:
        return torch.randn(BASELINE_DRAWS, *shape, generator=generator, dtype=torch.float64)

    draws = [
        {"query": gaussian(d, width), "key": gaussian(d, width),
         "value": gaussian(d, width), "out": gaussian(width, d)}
        for _ in range(2)  # layer 0 sends, layer 1 receives; each draw is one head
    ]  # fmt: skip
    scores = _all_scores([{k: t.to(wide) for k, t in w.items()} for w in draws], BASELINE_DRAWS)
    return {kind: float(scores[kind][0, :, 1].mean()) for kind in KINDS}


def composition_scores(lm: LoadedModel) -> CompositionScores:
    """The Q-, K- and V-composition score of every pair of heads of ``lm`` (see the module's
    docstring for the definitions).

    Shape:
        each kind ``(L, H, L, H)`` float64 on the CPU, indexed ``[l1, h1, l2, h2]``.

    Raises:
        InputError: a model whose layers are not one stack of self-attention (an
            encoder-decoder), or whose query, key, value or output projections discovery
            could not tell apart.

    Example:
        >>> scores = composition_scores(load("smollm2"))
        >>> scores.top_pairs("k", 3)  # candidate induction circuits: K-composition
    """
    kinds = sorted({h.kind for h in lm.layers})
    if kinds != ["self"]:
        raise InputError(
            f"composition scores need one stack of self-attention layers, got {', '.join(kinds)}"
        )
    weights = layer_weights(lm)
    if weights is None:
        raise InputError(
            f"composition scores need every layer's query, key and value projections; "
            f"discovery could not tell {lm.name}'s apart"
        )
    device = weights[0].out.device
    wide = torch.float32 if device.type == "mps" else torch.float64
    layers = [
        {
            "query": _folded(w.query, w.input_norm, wide),  # (H, D, E)
            "key": _folded(w.key, w.input_norm, wide),  # (Hkv, D, E)
            "value": _folded(w.value, w.input_norm, wide),  # (Hkv, D, E)
            "out": w.out.to(wide),  # (H, E, D)
        }
        for w in weights
    ]
    with torch.no_grad():
        scores = _all_scores(layers, max(lm.layout.heads_per_layer))
        d, width = layers[0]["query"].shape[1:]
        baseline = _baseline(int(d), int(width), wide)
    return CompositionScores(model=lm.name, baseline=baseline, **scores)


def parse_heads(value: str) -> list[tuple[int, int]]:
    """``"17.3,17.4"`` as ``[(17, 3), (17, 4)]``.

    Raises:
        InputError: a part that is not ``LAYER.HEAD``.
    """
    heads = []
    for part in value.split(","):
        layer, dot, head = part.strip().partition(".")
        if not dot or not layer.isdigit() or not head.isdigit():
            raise InputError(f"--receivers expects heads as LAYER.HEAD,...; got {part.strip()!r}")
        heads.append((int(layer), int(head)))
    return heads


def check_receivers(lm: LoadedModel, receivers: list[tuple[int, int]]) -> None:
    """Check that each receiver is a head of ``lm`` above its first layer.

    Raises:
        InputError: a layer or head out of range.
    """
    for layer, head in receivers:
        if not 0 < layer < lm.n_layers:
            raise InputError(
                f"--receivers {layer}.{head}: layer {layer} is out of range; {lm.name} has "
                f"layers 1..{lm.n_layers - 1} that read earlier heads"
            )
        n_heads = lm.layout.heads_per_layer[layer]
        if not 0 <= head < n_heads:
            raise InputError(
                f"--receivers {layer}.{head}: head {head} is out of range; layer {layer} "
                f"has heads 0..{n_heads - 1}"
            )


def receiver_senders(
    lm: LoadedModel,
    scores: CompositionScores,
    kind: str,
    receivers: list[tuple[int, int]],
    top: int,
) -> list[dict[str, Any]]:
    """Each receiver's ``top`` strongest senders by ``kind`` composition, strongest first:
    ``{"receiver": {"layer", "head"}, "senders": [{"layer", "head", "score", "x_baseline"}]}``."""
    table = scores.scores(kind)  # (L, H, L, H)
    base = scores.baseline[kind]
    out: list[dict[str, Any]] = []
    for layer, head in receivers:
        column = table[:layer, :, layer, head]  # (layer, H)
        values = column.flatten().nan_to_num(nan=-1.0)
        order = values.argsort(descending=True)[:top].tolist()
        out.append(
            {
                "receiver": {"layer": layer, "head": head},
                "senders": [
                    {
                        "layer": i // lm.n_heads,
                        "head": i % lm.n_heads,
                        "score": float(values[i]),
                        "x_baseline": float(values[i]) / base,
                    }
                    for i in order
                ],
            }
        )
    return out
