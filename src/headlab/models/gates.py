"""The hard-concrete gate (Louizos, Welling & Kingma 2018): a trainable gate in ``[0, 1]`` that
puts mass on exactly 0 and exactly 1, and whose probability of not being 0 is differentiable.

    u ~ U(0, 1),  s = sigmoid((log u - log(1 - u) + log_alpha) / beta),
    z = clamp(s * (r - l) + l, 0, 1)                        beta = 2/3, (l, r) = (-0.1, 1.1)

    P(z != 0) = sigmoid(log_alpha - beta * log(-l / r))

One gate, two users: head pruning's L0 gates (:mod:`headlab.pruning.l0`, a gate per head) and
learned circuits (:mod:`headlab.causal.learned`, a gate per edge).
"""

from __future__ import annotations

import math

import torch

BETA = 2.0 / 3.0
LIMIT_L, LIMIT_R = -0.1, 1.1


def expected_l0(log_alpha: torch.Tensor) -> torch.Tensor:
    """``P(z != 0)`` of each hard-concrete gate (differentiable)."""
    return torch.sigmoid(log_alpha - BETA * math.log(-LIMIT_L / LIMIT_R))


def sample_gates(log_alpha: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw of the stretched, clamped hard-concrete gates (reparameterised)."""
    u = torch.rand(log_alpha.shape, generator=generator, dtype=torch.float64)
    u = u.clamp(1e-6, 1 - 1e-6).to(log_alpha.device, log_alpha.dtype)
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / BETA)
    return (s * (LIMIT_R - LIMIT_L) + LIMIT_L).clamp(0.0, 1.0)


def deterministic_gates(log_alpha: torch.Tensor) -> torch.Tensor:
    """The test-time gates (no noise): exactly 0 for closed units."""
    return (torch.sigmoid(log_alpha) * (LIMIT_R - LIMIT_L) + LIMIT_L).clamp(0.0, 1.0)
