"""The seam for a family whose attention bypasses transformers' attention interface: a toy shim
registered for MPNet (refused without one) opens it like any other family, its heads' patterns
equal to MPNet's own and its outputs unchanged; without the shim it is refused again."""

from __future__ import annotations

import math
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tests.models.architectures import build_model

from headlab.errors import InputError, UnsupportedModelError
from headlab.models.adapters import interface_attention, register_shim, unregister_shim
from headlab.models.capture import HeadCapture
from headlab.models.loading import wrap


def _mpnet_attention(
    self: Any,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_bias: torch.Tensor | None = None,
    output_attentions: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor]:
    """MPNetSelfAttention.forward (transformers 5), its softmax handed to the interface: the
    relative position bias joins the additive padding mask."""
    shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
    q = self.q(hidden_states).view(shape).transpose(1, 2)  # (B, H, T, D)
    k = self.k(hidden_states).view(shape).transpose(1, 2)
    v = self.v(hidden_states).view(shape).transpose(1, 2)
    mask = position_bias  # (B, H, T, S)
    if attention_mask is not None:
        mask = attention_mask if mask is None else mask + attention_mask
    heads = interface_attention(
        self, q, k, v, mask, scaling=1 / math.sqrt(self.attention_head_size)
    )  # (B, T, H, D)
    return (self.o(heads.reshape(*hidden_states.shape[:-1], -1)),)


def route_mpnet(model: Any) -> None:
    """The toy shim: every MPNetSelfAttention instance calls the interface."""
    for module in model.modules():
        if type(module).__name__ == "MPNetSelfAttention":
            module.forward = types.MethodType(_mpnet_attention, module)
            module.is_causal = False


@pytest.fixture
def shimmed() -> Iterator[None]:
    register_shim("mpnet", route_mpnet)
    yield
    unregister_shim("mpnet")


IDS = torch.tensor([[101, 2023, 2003, 1037, 3231, 102], [101, 2023, 102, 0, 0, 0]])
MASK = (IDS != 0).long()


def test_a_family_outside_the_interface_is_refused_without_a_shim() -> None:
    with pytest.raises(UnsupportedModelError, match="attention interface"):
        wrap(build_model("mpnet"), None, name="mpnet")


def test_a_registered_shim_opens_the_family_like_any_other(shimmed: None) -> None:
    model = build_model("mpnet")
    with torch.no_grad():
        own = model(input_ids=IDS, attention_mask=MASK, output_attentions=True)
    lm = wrap(model, None, name="mpnet")
    assert lm.n_layers == 2 and lm.adapter.head_counts == [(4, 4, 8), (4, 4, 8)]
    assert all(
        h.out_proj is model.encoder.layer[i].attention.attn.o for i, h in enumerate(lm.layers)
    )
    with torch.no_grad(), HeadCapture(lm) as cap:
        out = model(input_ids=IDS, attention_mask=MASK)
    rows = MASK.bool()
    assert torch.allclose(out.last_hidden_state[rows], own.last_hidden_state[rows], atol=1e-5)
    for layer in range(2):
        pattern = cap.pattern(layer)  # (B, H, T, S)
        assert torch.allclose(pattern[0], own.attentions[layer][0], atol=1e-6)
        assert torch.allclose(pattern[1, :, :3, :3], own.attentions[layer][1, :, :3, :3], atol=1e-6)


def test_one_shim_per_family(shimmed: None) -> None:
    register_shim("mpnet", route_mpnet)  # the same one again: nothing changes
    with pytest.raises(InputError, match="has a shim already"):
        register_shim("mpnet", lambda model: None)
