"""The one hook layer (:mod:`headlab.models.hooks`): every hook gone after a failure, and on a
model whose one attention module serves every layer (ALBERT) an intervention on layer ``i``
reaches layer ``i``'s call only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from tests.models.architectures import build_model, inputs

from headlab.models.capture import HeadCapture
from headlab.models.hooks import Hooks, Swap, ablation
from headlab.models.interface import _OBSERVERS
from headlab.models.loading import LoadedModel, wrap
from headlab.models.patching import HeadOutputs, HeadPatch, Residuals
from headlab.pruning.metrics import HeadGates


def _hook_count(lm: LoadedModel) -> int:
    """Forward hooks and pre-hooks on every module of ``lm``, and attention observers."""
    modules = list(lm.model.modules())
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in modules)
    return hooks + sum(len(_OBSERVERS.get(id(m), [])) for m in modules)


@pytest.fixture(scope="module")
def llama() -> tuple[LoadedModel, dict[str, torch.Tensor]]:
    lm = wrap(build_model("llama").double(), None, name="llama")
    return lm, inputs(lm.model)


@pytest.fixture(scope="module")
def albert() -> tuple[LoadedModel, dict[str, torch.Tensor]]:
    lm = wrap(build_model("albert").double(), None, name="albert")
    assert lm.n_layers >= 2
    assert all(h.out_proj is lm.layers[0].out_proj for h in lm.layers)  # one module, all layers
    return lm, inputs(lm.model)


class _Boom(RuntimeError):
    pass


def _contexts(lm: LoadedModel, fail: Callable[[torch.Tensor], Any]) -> list[Hooks]:
    """One of each hook context, each with ``fail`` plugged into layer 1's head-output slot
    (or, for those that take no function there, next to one that has it)."""
    n_heads = lm.layout.heads_per_layer[1]
    failing = type("Failing", (Hooks,), {"install": lambda self: self.at_heads(lm, {1: [fail]})})

    class Both(Hooks):
        def __init__(self, inner: Hooks) -> None:
            super().__init__()
            self.inner = inner

        def install(self) -> None:
            self.inner.__enter__()
            self.add(self.inner.remove)
            self.at_heads(lm, {1: [fail]})

    zeros = torch.zeros(n_heads, lm.head_dim, dtype=torch.float64)
    return [
        failing(),
        Both(HeadCapture(lm, ablate={0: [1]}, ablation="mean", means={0: zeros})),
        Both(HeadOutputs(lm)),
        Both(Residuals(lm)),
        Both(HeadGates(lm, torch.ones(lm.n_layers, n_heads, dtype=torch.float64))),
        Both(HeadPatch(lm, {0: [ablation([2], n_heads)]})),
    ]


def test_every_hook_is_removed_when_a_forward_fails_midway(
    llama: tuple[LoadedModel, dict[str, torch.Tensor]],
) -> None:
    lm, batch = llama
    before = _hook_count(lm)

    def fail(z: torch.Tensor) -> None:
        raise _Boom("layer 1's head outputs")

    for context in _contexts(lm, fail):
        with pytest.raises(_Boom), torch.no_grad(), context:
            assert _hook_count(lm) > before
            lm.model(**batch)
        assert _hook_count(lm) == before, type(context).__name__


def test_every_hook_is_removed_when_adding_them_fails(
    llama: tuple[LoadedModel, dict[str, torch.Tensor]],
) -> None:
    lm, _ = llama
    before = _hook_count(lm)

    class HalfInstalled(Hooks):
        def install(self) -> None:
            self.at_heads(lm, {0: [lambda z: None]})
            self.on_layers([h.attention for h in lm.layers], lambda layer: lambda *a: None)
            raise _Boom("while adding hooks")

    with pytest.raises(_Boom), HalfInstalled():
        pass
    assert _hook_count(lm) == before


@pytest.mark.parametrize("layer", [0, 1])
def test_a_shared_module_ablates_only_its_own_layers_call(
    albert: tuple[LoadedModel, dict[str, torch.Tensor]], layer: int
) -> None:
    """ALBERT runs one output projection for every layer: ablating head 2 of layer ``layer``
    changes that head at that layer's call alone (the layers below read what they read
    unablated, and the head's output at other layers' calls is the model's own)."""
    lm, batch = albert
    with torch.no_grad(), HeadCapture(lm, record_queries_keys=False) as plain:
        lm.model(**batch)
    with torch.no_grad(), HeadCapture(lm, ablate={layer: [2]}, record_queries_keys=False) as cap:
        lm.model(**batch)
    for i in range(layer):  # below: unchanged
        assert torch.equal(cap.records[i].head_output, plain.records[i].head_output)
    z, z0 = cap.records[layer].head_output, plain.records[layer].head_output  # (B, H, T, D)
    assert torch.equal(z[:, 2], torch.zeros_like(z[:, 2]))
    assert not torch.equal(z0[:, 2], torch.zeros_like(z0[:, 2]))
    keep = [h for h in range(z.shape[1]) if h != 2]
    assert torch.equal(z[:, keep], z0[:, keep])  # the other heads of that call: the model's own
    for i in range(layer + 1, lm.n_layers):  # above: head 2 not zeroed again
        assert not torch.equal(cap.records[i].head_output[:, 2], torch.zeros_like(z[:, 2]))


def test_ablation_and_patching_are_one_swap(
    llama: tuple[LoadedModel, dict[str, torch.Tensor]],
) -> None:
    """Mean-ablating a head (``HeadCapture``) and patching it from a source that holds the mean
    everywhere (``HeadPatch``) are the same intervention, bit for bit."""
    lm, batch = llama
    n_heads, d = lm.layout.heads_per_layer[1], lm.head_dim
    means = torch.randn(n_heads, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad(), HeadCapture(lm, ablate={1: [0, 3]}, ablation="mean", means={1: means}):
        ablated = lm.model(**batch).last_hidden_state
    b, t = batch["input_ids"].shape
    select = torch.zeros(1, n_heads, dtype=torch.bool)
    select[0, [0, 3]] = True
    swap = Swap(source=means.expand(b, t, n_heads, d), select=select)
    with torch.no_grad(), HeadPatch(lm, {1: [swap]}):
        patched = lm.model(**batch).last_hidden_state
    assert torch.equal(ablated, patched)
