"""The memory ``headlab train`` plans for, checked before the tokenizer or the model is built.

A training step of :class:`~headlab.training.model.TinyTransformer` keeps, in float32:

- the parameters ``P`` with their gradients, AdamW's two moments and the optimizer's
  temporaries: :data:`PER_PARAMETER` copies;
- each block's activations saved for the backward, per token of the batch:
  :data:`PER_WIDTH` of width ``E`` and :data:`PER_FF` of the MLP's ``F``;
- the logits, their log-softmax and their gradient: :data:`PER_LOGIT` of width ``V``;
- the embeddings' sum and the final LayerNorm: :data:`PER_WIDTH` of width ``E``.

The attention runs through torch's fused kernel (causal, no per-head weights asked for), which
keeps no ``B x H x T x T`` weights: the head count does not enter. Measured with torch's CPU
allocator (``tests/training/test_plan.py``): a step takes 4.8 ``P``, about 17 ``E`` a token
per block at ``F = 4E`` and 3 ``V`` a token; the coefficients below are upper bounds of those.
"""

from __future__ import annotations

from collections.abc import Callable

from headlab.attention.memory import MEMORY_SHARE
from headlab.errors import InputError
from headlab.text import human_bytes

#: float32 copies of each parameter: weights, gradients, AdamW's two moments, temporaries
PER_PARAMETER = 6
#: float32 values of width E a token keeps per block for the backward (and once outside them)
PER_WIDTH = 8
#: float32 values of the MLP's width F a token keeps per block
PER_FF = 4
#: float32 values of the vocabulary's width V a token keeps (logits, log-softmax, gradient)
PER_LOGIT = 4


def parameters(d_model: int, n_layers: int, d_ff: int, context: int, vocab: int) -> int:
    """The parameters of a :class:`~headlab.training.model.TinyTransformer`: token and position
    embeddings (the output tied to the first), per block two LayerNorms, the attention's
    ``4 E^2 + 4 E`` and the MLP's ``2 E F + F + E``, and the final LayerNorm."""
    e = d_model
    block = 2 * 2 * e + 4 * e * e + 4 * e + 2 * e * d_ff + d_ff + e
    return vocab * e + context * e + n_layers * block + 2 * e


def planned_peak(
    *, d_model: int, n_layers: int, d_ff: int, context: int, vocab: int, batch: int
) -> int:
    """The predicted peak bytes of a training step (see the module docstring): an upper bound,
    checked against measured peaks by a test."""
    tokens = batch * context
    per_token = n_layers * (PER_WIDTH * d_model + PER_FF * d_ff) + PER_WIDTH * d_model
    per_token += PER_LOGIT * vocab
    weights = PER_PARAMETER * parameters(d_model, n_layers, d_ff, context, vocab)
    return 4 * (weights + tokens * per_token)


def check_memory(
    *,
    d_model: int,
    n_layers: int,
    n_heads: int,
    d_ff: int,
    context: int,
    vocab: int,
    batch: int,
    available: int | None,
) -> None:
    """Refuse, before any training, a model whose :func:`planned_peak` does not fit
    :data:`~headlab.attention.memory.MEMORY_SHARE` of ``available`` bytes (``None``: not known,
    no check).

    Raises:
        InputError: one line naming the flag (``--context``, or ``--d-model`` when not even the
            shortest context fits), the predicted peak, the memory available and the most that
            fits (the longest context; the widest model, a multiple of ``n_heads`` with ``d_ff``
            in the same ratio).
    """
    if available is None:
        return
    budget = int(MEMORY_SHARE * available)
    sizes = {"n_layers": n_layers, "vocab": vocab, "batch": batch}

    def peak(t: int, e: int = d_model) -> int:
        return planned_peak(**sizes, d_model=e, d_ff=d_ff * e // d_model, context=t)

    if peak(context) <= budget:
        return
    have = f"more than {MEMORY_SHARE:.0%} of the {human_bytes(available)} available here"
    if peak(2) > budget:
        widest = _most(lambda k: peak(context, k * n_heads) <= budget, 0, d_model // n_heads)
        fits = (
            f"the widest that fits at --context {context} is {widest * n_heads:,}"
            if widest
            else f"none with --heads {n_heads} fits: use fewer --layers or a smaller --vocab"
        )
        raise InputError(
            f"--d-model {d_model}: {n_layers} layers of this width with a vocabulary of "
            f"{vocab:,} would take about {human_bytes(peak(2))} to train even at --context 2 "
            f"(weights, gradients and AdamW's moments), {have}; {fits}"
        )
    longest = _most(lambda t: peak(t) <= budget, 2, context)
    raise InputError(
        f"--context {context}: a batch of {batch} windows through {n_layers} layers of width "
        f"{d_model} with a vocabulary of {vocab:,} would take about {human_bytes(peak(context))} "
        f"at the peak of a training step, {have}; the longest that fits is {longest:,} tokens"
    )


def _most(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest ``n`` in ``lo..hi - 1`` for which ``fits(n)``, given ``fits(lo)`` (or ``lo``
    = 0) and not ``fits(hi)``: a bisection (``fits`` grows false with ``n``)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
