"""Direct logit attribution: what each head writes to the answer, directly.

A head's contribution to the residual stream at the last position, ``c = z[h] @ W_O[h]^T``
``(E,)``, goes through the final norm with its scale frozen from the clean run and is dotted
with the unembedding difference ``W_U[answer] - W_U[distractor]`` (Elhage et al. 2021; Wang et
al. 2022, section 3). With the scale frozen the norm is linear, so the heads' terms plus the
rest of the residual stream (embeddings, MLPs, the projections' biases, the norm's bias) add up
exactly to the model's logit difference: the decomposition is tested to do so.

The final norm is whatever module the language-model head reads, its formula recognised from
what it computed in the clean run: RMSNorm (``x / rms(x) * g``; Gemma's ``* (1 + g)``) or
LayerNorm (``(x - mean(x)) / std(x) * g + b``). Anything else is refused in one line.

A positive value pushes the answer up directly; a negative one pushes it down (the IOI paper's
negative name movers). A head can matter through later heads and write nothing directly: DLA
sees only the direct path; activation patching (:mod:`headlab.causal.patching`) sees both.

Shape vocabulary: ``B`` prompts, ``T`` tokens, ``L`` layers, ``H`` heads, ``D`` head width,
``E`` model width.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headlab.causal import table
from headlab.causal.tasks import Task
from headlab.errors import InputError
from headlab.models.circuits import out_columns
from headlab.models.loading import LoadedModel
from headlab.models.patching import HeadOutputs
from headlab.progress import NO_PROGRESS, Progress, stage


@dataclass(frozen=True, kw_only=True)
class DLAResult:
    """Each head's direct effect on the logit difference, averaged over the prompts.

    Shape:
        dla: ``(L, H)`` float64 (NaN: no such head).
    """

    model: str
    task: str
    n_prompts: int
    clean: float  # the mean logit difference the terms add up to
    dla: torch.Tensor
    rest: float  # everything else in the residual stream, through the same frozen norm
    norm: str  # "rmsnorm", "rmsnorm (1 + g)" or "layernorm"
    seconds: float = 0.0

    def ranked(self) -> list[tuple[int, int, float]]:
        """``(layer, head, value)`` by decreasing absolute value, signed."""
        return table.ranked(self.dla)

    def top(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The ``k`` heads of largest absolute value, ``(layer, head, value)``, signed."""
        return table.top(self.dla, k)

    def to_json(self) -> dict[str, Any]:
        heads = [
            {"layer": layer, "head": head, "dla": value}
            for layer, row in enumerate(self.dla.tolist())
            for head, value in enumerate(row)
            if value == value
        ]
        return {
            "model": self.model,
            "task": self.task,
            "method": "dla",
            "n_prompts": self.n_prompts,
            "metric": {"clean": self.clean, "unit": "logit difference"},
            "final_norm": self.norm,
            "rest": self.rest,
            "heads_total": float(self.dla.nan_to_num(0.0).sum()),
            "seconds": round(self.seconds, 3),
            "heads": heads,
        }


def _candidates(norm: nn.Module) -> list[tuple[str, Callable[[torch.Tensor, torch.Tensor], Any]]]:
    """The frozen-scale maps a norm may be: ``f(v, x) -> (linear part of v, bias)`` with
    the scale taken from ``x`` (the rows the norm normalised)."""
    weight = getattr(norm, "weight", None)
    bias = getattr(norm, "bias", None)
    eps_values = [
        float(e)
        for e in (getattr(norm, "eps", None), getattr(norm, "variance_epsilon", None))
        if isinstance(e, int | float)
    ] or [1e-5, 1e-6]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return []
    g = weight.detach().double()
    b = None if not isinstance(bias, torch.Tensor) else bias.detach().double()
    out: list[tuple[str, Callable[[torch.Tensor, torch.Tensor], Any]]] = []
    for eps in eps_values:

        def rms(v: torch.Tensor, x: torch.Tensor, eps: float = eps) -> Any:
            scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
            return v / scale * g, None

        def rms_one(v: torch.Tensor, x: torch.Tensor, eps: float = eps) -> Any:
            scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
            return v / scale * (1.0 + g), None

        def layer(v: torch.Tensor, x: torch.Tensor, eps: float = eps) -> Any:
            scale = (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
            return (v - v.mean(-1, keepdim=True)) / scale * g, b

        out += [("rmsnorm", rms), ("rmsnorm (1 + g)", rms_one), ("layernorm", layer)]
    return out


def recognise_norm(
    norm: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    needs: str = "direct logit attribution needs the final norm",
) -> tuple[str, Callable[..., Any]]:
    """The candidate that reproduces what the norm computed, ``y`` from ``x`` ``(R, E)``:
    its name and its frozen-scale map ``f(v, x) -> (linear part of v, bias or None)``.

    Raises:
        InputError: no candidate does; ``needs`` opens the message (who needs the norm).
    """
    for name, fn in _candidates(norm):
        linear, bias = fn(x, x)
        got = linear if bias is None else linear + bias
        if torch.allclose(got, y, atol=1e-4 * (1.0 + float(y.abs().max())), rtol=1e-4):
            return name, fn
    raise InputError(
        f"{needs} to be a LayerNorm or an RMSNorm; {type(norm).__name__} computes something else"
    )


def final_norm(lm: LoadedModel) -> nn.Module:
    """The module whose output the language-model head reads (one traced forward pass)."""
    head = lm.model.get_output_embeddings()
    if head is None:
        raise InputError(
            f"direct logit attribution reads next-token logits: load {lm.name} with its "
            "language-model head"
        )
    seen: dict[int, tuple[nn.Module, torch.Tensor]] = {}
    read: list[int] = []

    def on_out(module: nn.Module, args: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            seen[out.data_ptr()] = (module, out)  # kept alive: no address reused in the pass

    def on_head(module: nn.Module, args: Any) -> None:
        if args and isinstance(args[0], torch.Tensor) and not read:
            read.append(args[0].data_ptr())

    candidates = [
        m
        for m in lm.model.modules()
        if isinstance(getattr(m, "weight", None), nn.Parameter) and m.weight.dim() == 1
    ]
    removers = [m.register_forward_hook(on_out).remove for m in candidates]
    removers.append(head.register_forward_pre_hook(on_head).remove)
    try:
        with torch.no_grad():
            ids = torch.zeros(1, 2, dtype=torch.long, device=lm.device)
            lm.model(input_ids=ids)
    finally:
        for remove in removers:
            remove()
    found = seen.get(read[0]) if read else None
    if found is None:
        raise InputError(f"{lm.name}: no final norm feeds its language-model head")
    return found[0]


def direct_logit_attribution(
    lm: LoadedModel, task: Task, *, progress: Progress | None = None
) -> DLAResult:
    """Each head's direct contribution to ``logit(answer) - logit(distractor)`` at the last
    position of the clean prompts, averaged over them."""
    progress = progress or NO_PROGRESS
    start = time.perf_counter()
    norm = final_norm(lm)
    unembed = lm.model.get_output_embeddings()
    w_u = unembed.weight.detach().double()  # (V, E)
    u_bias = getattr(unembed, "bias", None)
    n_layers, width = lm.n_layers, max(lm.layout.heads_per_layer)
    sums = torch.zeros(n_layers, width, dtype=torch.float64)
    rest_sum = clean_sum = 0.0
    kind = ""
    with torch.inference_mode(), stage(progress, "direct logit attribution", task.n_prompts,
                                        "prompts") as bar:  # fmt: skip
        for batch in task.batches:
            batch = batch.to(lm.device)
            kept: dict[str, torch.Tensor] = {}

            def keep(module: nn.Module, args: Any, out: Any, kept: dict = kept) -> None:
                kept["x"] = args[0][:, -1].detach().double()  # (B, E)
                kept["y"] = out[:, -1].detach().double()

            remove = norm.register_forward_hook(keep).remove
            try:
                with HeadOutputs(lm, detach=True) as heads:
                    logits = lm.model(input_ids=batch.clean).logits[:, -1].double()  # (B, V)
            finally:
                remove()
            rows = torch.arange(len(batch.index), device=logits.device)
            ld = logits[rows, batch.answer] - logits[rows, batch.distractor]  # (B,)
            x, y = kept["x"], kept["y"]
            kind, frozen = recognise_norm(norm, x, y)
            direction = w_u[batch.answer] - w_u[batch.distractor]  # (B, E)
            total = torch.zeros_like(x)
            for layer in range(n_layers):
                z = heads.outputs[layer][:, -1].double()  # (B, H, D)
                w_o = out_columns(lm, layer).detach().double()  # (H, E, D)
                per_head = torch.einsum("bhd,hed->bhe", z, w_o)  # (B, H, E)
                total += per_head.sum(1)
                linear, _ = frozen(per_head, x[:, None, :])
                sums[layer, : z.shape[1]] += (linear * direction[:, None, :]).sum(-1).sum(0).cpu()
            linear, bias = frozen(x - total, x)
            rest = (linear * direction).sum(-1)  # (B,)
            if bias is not None:
                rest = rest + (bias * direction).sum(-1)
            if isinstance(u_bias, torch.Tensor):
                b = u_bias.detach().double()
                rest = rest + b[batch.answer] - b[batch.distractor]
            rest_sum += float(rest.sum())
            clean_sum += float(ld.sum())
            bar.advance(len(batch.index))
    n = task.n_prompts
    missing = torch.full_like(sums, float("nan"))
    for layer, count in enumerate(lm.layout.heads_per_layer):
        missing[layer, :count] = 0.0
    return DLAResult(
        model=lm.name,
        task=task.name,
        n_prompts=n,
        clean=clean_sum / n,
        dla=sums / n + missing,
        rest=rest_sum / n,
        norm=kind,
        seconds=time.perf_counter() - start,
    )
