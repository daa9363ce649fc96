"""Direct logit attribution: what each head writes to the answer, directly.

A head's contribution to the residual stream at the last position, ``c = z[h] @ W_O[h]^T``
``(E,)``, goes through the final norm with its scale frozen from the clean run and is dotted
with the unembedding difference ``W_U[answer] - W_U[distractor]`` (Elhage et al. 2021; Wang et
al. 2022, section 3). With the scale frozen the norm is linear, so the heads' terms plus the
rest of the residual stream (embeddings, MLPs, the projections' biases, the norm's bias) add up
exactly to the model's logit difference: the decomposition is tested to do so.

The final norm is whatever module the language-model head reads, its formula recognised from
what it computed in the clean run: RMSNorm (``x / rms(x) * g``; Gemma's ``* (1 + g)``) or
LayerNorm (``(x - mean(x)) / std(x) * g + b``). Anything else is refused in one line. In a
post-norm block (Gemma 2 and 3, OLMo 2: :mod:`headlab.causal.graph`) a head's contribution
first goes through the norm on the attention's output, its scale frozen from the clean run in
the same way: what the head writes is what lands in the residual stream.

A positive value pushes the answer up directly; a negative one pushes it down (the IOI paper's
negative name movers). A head can matter through later heads and write nothing directly: DLA
sees only the direct path; activation patching (:mod:`headlab.causal.patching`) sees both.

Shape vocabulary: ``B`` prompts, ``T`` tokens, ``L`` layers, ``H`` heads, ``D`` head width,
``E`` model width.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headlab.causal import table
from headlab.causal.graph import OutputNorm, build_graph
from headlab.causal.norms import recognise_norm
from headlab.causal.tasks import Task
from headlab.errors import InputError
from headlab.models.hooks import Hooks
from headlab.models.loading import LoadedModel
from headlab.models.ov import out_columns
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


def _attention_output_norms(lm: LoadedModel) -> list[OutputNorm | None]:
    """Each layer's norm on the attention's output (post-norm blocks), else ``None``; all
    ``None`` for a model the circuit graph does not describe (its heads' writes are then taken
    as the output projection gives them, as before post-norm blocks were known)."""
    try:
        return [block.attention_out for block in build_graph(lm).blocks]
    except InputError:
        return [None] * lm.n_layers


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
    with Hooks() as hooks, torch.no_grad():
        for m in candidates:
            hooks.after(m, on_out)
        hooks.before(head, on_head)
        lm.model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=lm.device))
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
    post = _attention_output_norms(lm)
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

            with Hooks() as kept_hooks, HeadOutputs(lm, detach=True) as heads:
                kept_hooks.after(norm, keep)
                for layer, out_norm in enumerate(post):
                    if out_norm is not None:  # the attention's output at the last position

                        def keep_attention(
                            module: nn.Module,
                            args: Any,
                            out: Any,
                            key: str = f"attn {layer}",
                            kept: dict = kept,
                        ) -> None:
                            kept[key] = args[0][:, -1].detach().double()  # (B, E)

                        kept_hooks.after(out_norm.module, keep_attention)
                logits = lm.model(input_ids=batch.clean).logits[:, -1].double()  # (B, V)
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
                out_norm = post[layer]
                if out_norm is not None:  # through the post-attention norm, scale frozen
                    per_head = out_norm.linear(per_head, kept[f"attn {layer}"][:, None, :])
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
