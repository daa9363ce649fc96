"""Sums over sentences, for the whole corpus and for bootstrap resamples at once.

Every role statistic is a ratio of sums over sentences. Resampling with replacement is
approximated by the Poisson bootstrap (each unit enters each replicate ``Poisson(1)`` times;
Hanley & MacGibbon 2006): weights are fixed per item and seed, so each replicate's sums are
accumulated in the same single pass, in any batch order, and memory does not grow with the corpus.
The unit is the document when items carry one (``clusters``: UD documents, GAP's source pages):
all the sentences of a document enter a replicate together, as they would in another sample of
documents. Sentences of one document share topic, style and words, so resampling them one by one
shows less variation than new text brings (the cluster bootstrap; Davison & Hinkley 1997, 3.8).
Replicate 0 is the corpus itself (all weights 1). With ``folds``, rows 1..K come next: fold ``k``'s
sums (weight 1 for its items, 0 for the others), so roles assigned on each fold of documents
(:mod:`headlab.roles.folds`) come out of the same pass too; the bootstrap rows follow them.

The sums live where the statistics are computed (each layer's on the device that layer runs
on, for a model spread over devices), in float64, and move to the CPU once, when a corpus is
done (:meth:`Sums.cpu`); the weights are drawn on the CPU, so a seed gives the same replicates
on every device.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


class Sums:
    """Named weighted sums ``(1 + K + R, ...)``: the full corpus, K folds, R resamples."""

    def __init__(
        self,
        n_items: int,
        replicates: int,
        seed: int,
        *,
        device: torch.device | str = "cpu",
        folds: Sequence[int] | None = None,
        n_folds: int = 0,
        clusters: Sequence[Hashable] | None = None,
    ) -> None:
        device = torch.device(device)
        if device.type == "mps":  # no float64 there: the sums stay on the CPU
            device = torch.device("cpu")
        self.device = device
        gen = torch.Generator().manual_seed(seed)
        if clusters is None:  # each item is its own unit
            weights = torch.poisson(torch.ones(n_items, replicates), generator=gen)
        else:
            if len(clusters) != n_items:
                raise ValueError("clusters must give one document per item")
            index: dict[Hashable, int] = {}
            ids = torch.tensor([index.setdefault(c, len(index)) for c in clusters])
            weights = torch.poisson(torch.ones(len(index), replicates), generator=gen)[ids]
        fold_weights = torch.zeros(n_items, n_folds)
        if n_folds:
            if folds is None or len(folds) != n_items:
                raise ValueError("folds must give one fold id per item")
            ids = torch.as_tensor(list(folds), dtype=torch.long)
            fold_weights[torch.arange(n_items), ids] = 1.0
        self.n_folds = n_folds
        # (N, 1 + K + R): the corpus, the folds, the bootstrap resamples
        weights = torch.cat([torch.ones(n_items, 1), fold_weights, weights], dim=1).double()
        self.weights = weights.to(device)
        self.values: dict[str, torch.Tensor] = {}
        #: layer sums not yet gathered: name -> device -> ``(R + 1, n_layers, ...)``
        self._layers: dict[str, dict[torch.device, torch.Tensor]] = {}
        self._cached: tuple[tuple[int, ...], dict[torch.device, torch.Tensor]] | None = None

    @property
    def replicates(self) -> int:
        """Bootstrap resamples (rows after the folds)."""
        return self.weights.shape[1] - 1 - self.n_folds

    @property
    def fold_rows(self) -> slice:
        """Rows of the per-fold sums."""
        return slice(1, 1 + self.n_folds)

    @property
    def bootstrap_rows(self) -> slice:
        """Rows of the bootstrap resamples."""
        return slice(1 + self.n_folds, None)

    def _weights_t(self, items: Sequence[int], device: torch.device) -> torch.Tensor:
        """``(R+1, B)`` weights of ``items`` on ``device`` (the last batch's are kept, per
        device: layers reuse them)."""
        key = tuple(items)
        if self._cached is None or self._cached[0] != key:
            self._cached = (key, {})
        on = self._cached[1]
        if device not in on:
            local = self.weights[list(key)].t().contiguous()
            on[device] = local.to(device)
        return on[device]

    def _home(self, values: torch.Tensor) -> torch.device:
        """Where sums of ``values`` add up: their own device (a layer's statistics stay where
        the layer runs), or the CPU for a device without float64 (mps)."""
        device = values.device
        return torch.device("cpu") if device.type == "mps" else device

    def add(self, name: str, items: Sequence[int], values: torch.Tensor) -> None:
        """Add per-item ``values`` ``(B, ...)`` of corpus items ``items`` into ``name``."""
        wt = self._weights_t(items, self.device)  # (R+1, B)
        flat = values.reshape(values.shape[0], -1).to(self.device, torch.float64)  # (B, K)
        total = (wt @ flat).reshape(wt.shape[0], *values.shape[1:])  # (R+1, ...)
        if name in self.values:
            self.values[name] += total
        else:
            self.values[name] = total

    def add_layer(
        self,
        name: str,
        layer: int,
        n_layers: int,
        items: Sequence[int],
        values: torch.Tensor,
        *,
        n_heads: int | None = None,
    ) -> None:
        """Like :meth:`add`, into slot ``layer`` of a ``(R + 1, n_layers, ...)`` sum.

        ``values`` ``(B, H_l, ...)``: a layer with fewer heads than ``n_heads`` (a model pruned
        layer by layer) fills the first ``H_l`` of them; the others keep zero sums. The sums of
        a layer add up on the device of its ``values`` (where the layer runs, for a model spread
        over devices) and meet the others' in :meth:`get` and :meth:`cpu`.
        """
        device = self._home(values)
        wt = self._weights_t(items, device)
        flat = values.reshape(values.shape[0], -1).to(device, torch.float64)
        total = (wt @ flat).reshape(wt.shape[0], *values.shape[1:])
        parts = self._layers.setdefault(name, {})
        if device not in parts:
            shape = list(values.shape[1:])
            if n_heads is not None and shape:
                shape[0] = max(shape[0], n_heads)
            parts[device] = torch.zeros(
                wt.shape[0], n_layers, *shape, dtype=torch.float64, device=device
            )
        parts[device][:, layer, : total.shape[1]] += total

    def _gather(self, name: str) -> None:
        """Add the per-device layer sums of ``name`` into one tensor on :attr:`device`."""
        parts = self._layers.pop(name, None)
        if not parts:
            return
        total = self.values.get(name)  # an earlier gather's (a checkpoint's, say)
        for part in parts.values():
            part = part.to(self.device)
            total = part if total is None else total.to(self.device) + part
        if total is None:  # parts is not empty: the loop ran
            raise RuntimeError(f"no part of {name!r} to gather")
        self.values[name] = total

    def gather(self) -> Sums:
        """Add every layer sum's per-device parts into :attr:`values` on :attr:`device` (before
        they are all-reduced across ranks or saved to a checkpoint); returns ``self``."""
        for name in list(self._layers):
            self._gather(name)
        return self

    def cpu(self) -> Sums:
        """Move the sums (and weights) to the CPU, where scores are computed; returns ``self``."""
        self.gather()
        if self.device.type != "cpu":
            self.device = torch.device("cpu")
            self.weights = self.weights.cpu()
            self.values = {name: value.cpu() for name, value in self.values.items()}
        self._cached = None
        return self

    def get(self, name: str) -> torch.Tensor:
        self._gather(name)
        return self.values[name]

    def __contains__(self, name: str) -> bool:
        return name in self.values or name in self._layers


def ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` with NaN where the denominator is 0 (no evidence, not a score of 0)."""
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, float("nan")))
