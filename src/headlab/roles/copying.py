"""Olsson et al.'s copying score of every head's OV circuit (causal models).

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
