"""Olsson et al.'s copying score of every head's OV circuit (causal models), and the tokens
each head's OV circuit promotes and suppresses (:func:`written_tokens`).

A head copies when the token it attends to raises that same token's logit. Olsson et al. (2022,
"In-context Learning and Induction Heads", appendix "Copying") read it off the eigenvalues of
the head's full OV circuit, the ``V x V`` map from an attended token to the logits it adds,

    M_h = W_U diag(n_f) W_O^h W_V^g diag(n_in) W_E^T        (V x V)

(``W_E`` the embedding, ``n_in`` the layer's input-norm gain, ``W_V^g`` the value projection of
head ``h``'s KV group ``g = h // G``, ``W_O^h`` its slice of the output projection, ``n_f`` the
final norm's gain, ``W_U`` the unembedding; Elhage et al. 2021). The score is

    sum_i Re(lambda_i) / sum_i |lambda_i|

in ``[-1, 1]``: near 1 when the eigenvalues are mostly positive reals (the circuit maps tokens
onto themselves), near -1 for an anti-copying head. ``M_h`` has rank at most ``D``, and the
nonzero eigenvalues of ``A B`` are those of ``B A``, so the score comes exactly, and cheaply, from
the ``D x D`` matrix

    W_V^g diag(n_in) (W_E^T W_U) diag(n_f) W_O^h             (D x D)

with ``W_E^T W_U`` ``(E x E)`` computed once per model. Float64 throughout (float32 on MPS).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headlab.models.loading import LoadedModel
from headlab.models.ov import OVWeights, ov_weights


def ov_matrices(weights: OVWeights) -> list[torch.Tensor]:
    """Each layer's ``(H, D, D)`` matrices ``W_V^g diag(n_in) W_E^T W_U diag(n_f) W_O^h``."""
    device = weights.embed.device
    wide = torch.float32 if device.type == "mps" else torch.float64
    embed = weights.embed.to(wide)  # (V, E)
    unembed = weights.unembed.to(device, wide)  # (V, E)
    if weights.final_norm is not None:
        unembed = unembed * weights.final_norm.to(device, wide)
    middle = embed.T @ unembed  # (E, E): W_E^T W_U diag(n_f)
    out = []
    for layer in weights.layers:
        value = layer.value.to(device, wide)  # (Hkv, D, E)
        if layer.input_norm is not None:
            value = value * layer.input_norm.to(device, wide)
        value = value.repeat_interleave(layer.group, dim=0)  # (H, D, E): each head's KV group
        out.append(value @ middle @ layer.out.to(device, wide))  # (H, D, D)
    return out


def copying_score(matrices: torch.Tensor) -> torch.Tensor:
    """``sum Re(lambda) / sum |lambda|`` of each matrix ``(..., n, n)`` -> ``(...)``;
    NaN where every eigenvalue is zero."""
    eig = torch.linalg.eigvals(matrices)  # (..., n) complex
    total = eig.abs().sum(-1)
    return torch.where(total > 0, eig.real.sum(-1) / total, torch.nan)


def copying_scores(lm: LoadedModel) -> torch.Tensor:
    """``(L, H)`` float64 on the CPU: every head's copying score; NaN for a head a pruned layer
    lacks, and everywhere when the model's embedding, unembedding or value projections cannot
    be found (:func:`~headlab.models.ov.ov_weights`)."""
    scores = torch.full((lm.n_layers, lm.n_heads), torch.nan, dtype=torch.float64)
    weights = ov_weights(lm)
    if weights is None:
        return scores
    with torch.no_grad():
        for layer, matrices in enumerate(ov_matrices(weights)):
            scores[layer, : matrices.shape[0]] = copying_score(matrices).double().cpu()
    return scores


# ----------------------------------------------------------------- the tokens a head writes
@dataclass(frozen=True, kw_only=True)
class WrittenTokens:
    """The tokens each head's OV circuit promotes and suppresses most, from the weights.

    A head's OV circuit ``M_h`` (``V x V``, the module docstring) maps an attended token to the
    logits it adds; averaged over every token of the vocabulary as the attended one, its row is
    ``W_U diag(n_f) W_O^h W_V^g diag(n_in) mean(W_E)`` ``(V,)``: what the head writes whatever
    it reads. The ``k`` highest entries are the tokens it promotes, the ``k`` lowest those it
    suppresses.

    Shape:
        promoted, suppressed: ``(L, H, k)`` token ids, strongest first (-1: no such head).
        promoted_logits, suppressed_logits: ``(L, H, k)`` float64, the logits they get.

    Attributes:
        unembedding: what maps to logits: ``"language-model head"``, ``"tied embedding"``
            (no head loaded, the config ties them), ``"output head read from the folder"``.
    """

    promoted: torch.Tensor
    suppressed: torch.Tensor
    promoted_logits: torch.Tensor
    suppressed_logits: torch.Tensor
    unembedding: str


def unembedding_source(lm: LoadedModel) -> str:
    """Where :func:`~headlab.models.ov.ov_weights` reads the unembedding from (its order)."""
    get = getattr(lm.model, "get_output_embeddings", None)
    if get is not None and get() is not None:
        return "language-model head"
    config = lm.model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "tie_word_embeddings", False):
        return "tied embedding"
    return "output head read from the folder"


def written_tokens(lm: LoadedModel, k: int = 5) -> WrittenTokens | None:
    """:class:`WrittenTokens` of every head of ``lm``, or ``None`` when the model has no
    unembedding (neither a language-model head nor tied embeddings nor a head in its folder)
    or its value projections cannot be found (:func:`~headlab.models.ov.ov_weights`)."""
    weights = ov_weights(lm)
    if weights is None:
        return None
    device = weights.embed.device
    wide = torch.float32 if device.type == "mps" else torch.float64
    n_layers, width = lm.n_layers, lm.n_heads
    ids = {key: torch.full((n_layers, width, k), -1, dtype=torch.long) for key in ("up", "down")}
    logits = {key: torch.full((n_layers, width, k), torch.nan, dtype=torch.float64) for key in ids}
    unembed = weights.unembed.to(device, wide)  # (V, E)
    if weights.final_norm is not None:
        unembed = unembed * weights.final_norm.to(device, wide)
    with torch.no_grad():
        mean = weights.embed.to(wide).mean(0)  # (E,)
        for layer, ov in enumerate(weights.layers):
            x = mean if ov.input_norm is None else mean * ov.input_norm.to(device, wide)
            v = ov.value.to(device, wide) @ x  # (Hkv, D)
            v = v.repeat_interleave(ov.group, dim=0)  # (H, D): each head's KV group
            written = torch.einsum("hed,hd->he", ov.out.to(device, wide), v)  # (H, E)
            row = written @ unembed.T  # (H, V)
            n = row.shape[0]
            for key, largest in (("up", True), ("down", False)):
                top = row.topk(min(k, row.shape[1]), dim=-1, largest=largest)
                ids[key][layer, :n, : top.indices.shape[1]] = top.indices.cpu()
                logits[key][layer, :n, : top.values.shape[1]] = top.values.double().cpu()
    return WrittenTokens(
        promoted=ids["up"],
        suppressed=ids["down"],
        promoted_logits=logits["up"],
        suppressed_logits=logits["down"],
        unembedding=unembedding_source(lm),
    )
