"""Attribution patching (Nanda 2023; Syed et al. 2023) and integrated gradients (EAP-IG, Hanna
et al. 2024): every head's patching effect estimated from gradients. See
:mod:`headlab.causal.patching`.

Shape vocabulary: ``N`` path points, ``B`` prompts, ``T`` tokens, ``H`` heads, ``D`` head width."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from headlab.causal.metric import (
    IG_STEPS,
    Method,
    _empty,
    _normalize,
    _positions,
    check_task,
    last_logits,
    logit_difference,
)
from headlab.causal.result import PatchingResult
from headlab.causal.table import correlations
from headlab.causal.tasks import Batch, Task
from headlab.errors import InputError
from headlab.models.hooks import Hooks
from headlab.models.loading import LoadedModel
from headlab.models.patching import HeadOutputs
from headlab.progress import NO_PROGRESS, Progress, stage


@contextmanager
def _interpolated_embeddings(
    lm: LoadedModel, clean: torch.Tensor, corrupt: torch.Tensor, alphas: torch.Tensor
) -> Iterator[None]:
    """The embedding layer's output of ``N x B`` rows replaced by ``corrupt + a_n (clean -
    corrupt)`` (copy ``n``), ``clean``/``corrupt`` ``(B, T, E)`` the two prompts' embeddings."""
    module = lm.model.get_input_embeddings()

    def hook(mod: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
        a = alphas.to(out)[:, None, None, None]  # (N, 1, 1, 1)
        mixed = corrupt[None] + a * (clean - corrupt)[None]  # (N, B, T, E)
        return mixed.reshape(out.shape)

    with Hooks() as hooks:
        hooks.after(module, hook)
        yield


def _gradients(
    lm: LoadedModel, batch: Batch, *, steps: int | None
) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], torch.Tensor]:
    """Mean gradient of the summed metric with respect to every head output ``(B, T, H, D)``:
    at the clean run (``steps=None``), or averaged over ``steps`` points from the corrupted to
    the clean embeddings (integrated gradients). Also the clean run's head outputs and metric
    ``(B,)`` (the last point of the path is the clean input)."""
    with torch.enable_grad():
        if steps is None:
            ids, alphas = batch.clean, None
        else:
            ids = batch.clean.repeat(steps, 1)
            alphas = torch.arange(1, steps + 1, dtype=torch.float64) / steps  # right Riemann sum
        embed = lm.model.get_input_embeddings()
        context: Any = _no_context()
        if alphas is not None:
            with torch.no_grad():
                clean_e, corrupt_e = embed(batch.clean), embed(batch.corrupt)
            context = _interpolated_embeddings(lm, clean_e, corrupt_e, alphas)
        with context, HeadOutputs(lm) as outs:
            logits = last_logits(lm, ids)
        copies = 1 if steps is None else steps
        ld = logit_difference(
            logits, batch.answer.repeat(copies), batch.distractor.repeat(copies)
        )  # (N*B,)
        layers = sorted(outs.outputs)
        grads = torch.autograd.grad(ld.sum(), [outs.outputs[layer] for layer in layers])
    n_prompts = batch.clean.shape[0]
    out = {
        layer: g.detach().view(copies, n_prompts, *g.shape[1:]).mean(dim=0)  # (B, T, H, D)
        for layer, g in zip(layers, grads, strict=True)
    }
    heads = {
        layer: outs.outputs[layer].detach().view(copies, n_prompts, *grads[0].shape[1:])[-1]
        for layer in layers
    }
    clean_ld = ld.detach().view(copies, n_prompts)[-1]
    return out, heads, clean_ld


@contextmanager
def _no_context() -> Iterator[None]:
    yield


def attribution_patching(
    lm: LoadedModel,
    task: Task,
    *,
    method: Method = "attribution",
    steps: int = IG_STEPS,
    position: int | None = None,
    compare: PatchingResult | None = None,
    progress: Progress | None = None,
) -> PatchingResult:
    """Every head's estimated patching effect from gradients (``method="attribution"``: one
    backward pass at the clean run; ``"ig"``: integrated gradients over ``steps`` points).

    ``compare``: an activation-patching result of the same task and position, whose Pearson
    correlation with the estimate goes into the result.
    """
    if method not in ("attribution", "ig"):
        raise InputError(f"method must be 'attribution' or 'ig', got {method!r}")
    if method == "ig" and steps < 1:
        raise InputError(f"integrated gradients need at least 1 step, got {steps}")
    check_task(lm, task)
    progress = progress or NO_PROGRESS
    start = time.perf_counter()
    device = lm.device
    scores = _empty(lm).nan_to_num(0.0)
    clean_sum = corrupt_sum = 0.0
    with stage(progress, f"{method} over prompts", task.n_prompts, "prompts") as bar:
        for batch in task.batches:
            batch = batch.to(device)
            where = _positions(position, batch.clean.shape[1])
            with torch.inference_mode(), HeadOutputs(lm, detach=True) as corrupt_run:
                corrupt_ld = logit_difference(
                    last_logits(lm, batch.corrupt), batch.answer, batch.distractor
                )
            ig_steps = None if method == "attribution" else steps
            grads, clean_heads, clean_ld = _gradients(lm, batch, steps=ig_steps)
            for layer, grad in grads.items():
                delta = clean_heads[layer] - corrupt_run.outputs[layer]  # (B, T, H, D)
                terms = (delta.double() * grad.double()).sum(dim=-1)  # (B, T, H)
                if where is not None:
                    terms = terms[:, where.to(terms.device)]
                n_heads = terms.shape[-1]
                scores[layer, :n_heads] += terms.sum(dim=(0, 1)).cpu()
            clean_sum += float(clean_ld.sum())
            corrupt_sum += float(corrupt_ld.sum())
            bar.advance(batch.clean.shape[0])
    n = task.n_prompts
    clean, corrupt = clean_sum / n, corrupt_sum / n
    missing = _empty(lm)
    for layer, count in enumerate(lm.layout.heads_per_layer):
        missing[layer, :count] = 0.0
    effects = _normalize(clean, corrupt, clean - scores / n, task.name) + missing
    return PatchingResult(
        model=lm.name,
        task=task.name,
        method=method,
        position=position,
        n_prompts=n,
        clean=clean,
        corrupt=corrupt,
        effects=effects,
        correlation=None if compare is None else correlations(effects, compare.effects),
        reference=compare,
        steps=steps if method == "ig" else None,
        seconds=time.perf_counter() - start,
    )
