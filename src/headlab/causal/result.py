"""The results of patching: every head's effect (:class:`PatchingResult`) and each layer's
whole components (:class:`LayerTable`), with their JSON, CSV and notebook views."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import torch

from headlab.causal import table
from headlab.causal.figure import EFFECT_LABEL, heatmap_bound, heatmap_title
from headlab.causal.metric import (
    parse_position,
)
from headlab.errors import InputError


@dataclass(frozen=True, kw_only=True)
class PatchingResult:
    """Every head's patching effect on one task.

    Shape:
        effects: ``(L, H)`` float64, normalized as the module says (NaN: no such head).
        patched: ``(L, H)`` mean metric with the head patched (activation patching only).
    """

    model: str
    task: str
    method: str
    position: int | None  # None: every position
    n_prompts: int
    clean: float  # mean logit difference of the clean prompts
    corrupt: float  # ... of the corrupted prompts
    effects: torch.Tensor
    patched: torch.Tensor | None = None
    #: against activation patching in the same run: ``{"pearson", "spearman"}``
    correlation: dict[str, float] | None = None
    reference: PatchingResult | None = None  # that activation patching
    steps: int | None = None  # integrated gradients' points
    seconds: float = 0.0
    #: what was patched: ``"z"`` query heads' outputs, ``"k"``/``"v"`` KV heads' keys/values
    component: str = "z"
    #: what replaced a head's output: ``"corrupt"``, ``"mean"`` or ``"resample"``
    #: (:data:`headlab.causal.methods.SOURCES`)
    source: str = "corrupt"
    #: per layer: residual stream, attention output, MLP output (activation patching)
    layers: LayerTable | None = None

    @property
    def unit(self) -> str:
        """What one row of :attr:`effects` counts: query heads, or KV heads."""
        return "head" if self.component == "z" else "kv_head"

    def ranked(self) -> list[tuple[int, int, float]]:
        """``(layer, head, value)`` by decreasing absolute value, signed."""
        return table.ranked(self.effects)

    def top(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The ``k`` heads of largest absolute value, ``(layer, head, value)``, signed."""
        return table.top(self.effects, k)

    def to_json(self) -> dict[str, Any]:
        heads = []
        for layer, row in enumerate(self.effects.tolist()):
            for head, value in enumerate(row):
                if value != value:
                    continue
                item = {"layer": layer, self.unit: head, "effect": value}
                if self.patched is not None:
                    item["patched"] = float(self.patched[layer, head])
                heads.append(item)
        out: dict[str, Any] = {
            "model": self.model,
            "task": self.task,
            "method": self.method,
            "component": self.component,
            **({} if self.source == "corrupt" else {"source": self.source}),
            "position": "all" if self.position is None else _position_name(self.position),
            "n_prompts": self.n_prompts,
            "metric": {"clean": self.clean, "corrupt": self.corrupt, "unit": "logit difference"},
        }
        if self.steps is not None:
            out["steps"] = self.steps
        if self.correlation is not None and self.reference is not None:
            out["compare"] = {
                "method": self.reference.method,
                **self.correlation,
                "top": {
                    self.method: _top_json(self.top(5)),
                    self.reference.method: _top_json(self.reference.top(5)),
                },
            }
        out["seconds"] = round(self.seconds, 3)
        if self.layers is not None:
            out["layers"] = self.layers.to_json()
        key = "heads" if self.component == "z" else "kv_heads"
        out[key] = heads
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "patching result") -> PatchingResult:
        """The result again from :meth:`to_json`'s output (the JSON of ``headlab patch``).

        Raises:
            InputError: naming ``where`` and what is missing.
        """
        try:
            rows = data.get("heads") or data.get("kv_heads")
            if not isinstance(rows, list) or not rows:
                raise KeyError("heads")
            unit = "head" if "heads" in data else "kv_head"
            n_layers = 1 + max(int(r["layer"]) for r in rows)
            width = 1 + max(int(r[unit]) for r in rows)
            effects = torch.full((n_layers, width), float("nan"), dtype=torch.float64)
            for r in rows:
                effects[int(r["layer"]), int(r[unit])] = float(r["effect"])
            position = data.get("position", "all")
            return cls(
                model=str(data["model"]),
                task=str(data["task"]),
                method=str(data.get("method", "activation")),
                position=None if position == "all" else parse_position(position),
                n_prompts=int(data.get("n_prompts", 0)),
                clean=float(data["metric"]["clean"]),
                corrupt=float(data["metric"]["corrupt"]),
                effects=effects,
                component=str(data.get("component", "z")),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f"{where}: expected the JSON of headlab patch --json (missing or bad {exc})"
            ) from None

    def to_csv(self) -> str:
        """One row a head: ``layer,head,effect`` (``kv_head`` for keys and values)."""
        lines = [f"layer,{self.unit},effect"]
        lines += [f"{layer},{head},{value:.6g}" for layer, head, value in table.cells(self.effects)]
        return "\n".join(lines) + "\n"

    def _repr_html_(self) -> str:
        """A layers x heads heatmap for notebooks, as the PNG draws it
        (:func:`~headlab.causal.figure.write_heatmap`): its title, the heads across and the
        layers down, each named, red where a head carries the behaviour and blue where it
        works against it on the fixed scale of the share of the logit difference, with its
        legend; each cell's effect in its tooltip."""
        bound = heatmap_bound(self.effects.double().numpy())
        unit = "KV head" if self.unit == "kv_head" else "head"
        cell = "width:20px;height:14px;padding:0;border:1px solid #fff"
        axis = "font-weight:normal;font-size:11px;color:#555;padding:0 4px"
        heads = "".join(f"<th style='{axis}'>{h}</th>" for h in range(self.effects.shape[1]))
        rows = [f"<tr><th style='{axis}'>layer \\ {unit}</th>{heads}</tr>"]
        for layer, row in enumerate(self.effects.tolist()):
            cells = []
            for head, v in enumerate(row):
                if v != v:
                    cells.append(f"<td style='{cell}'></td>")
                    continue
                title = html.escape(f"{layer}.{head}: {v:+.3f}")
                cells.append(
                    f'<td title="{title}" style="{cell};background:{_effect_colour(v, bound)}">'
                    "</td>"
                )
            rows.append(f"<tr><th style='{axis}'>{layer}</th>{''.join(cells)}</tr>")
        top = ", ".join(f"{la}.{h} {v:+.2f}" for la, h, v in self.top(5))
        title = "<br>".join(html.escape(line) for line in heatmap_title(self))
        stops = [-bound, -bound / 2, 0.0, bound / 2, bound]
        legend = "".join(
            f"<i title='{v:+.2f}' style='display:inline-block;width:22px;height:12px;"
            f"border:1px solid #ccc;background:{_effect_colour(v, bound)}'></i>"
            for v in stops
        )
        return (
            "<div class='hl-patching' style='font:13px/1.4 system-ui, sans-serif'>"
            f"<p style='font-weight:bold;margin:0 0 4px'>{title}</p>"
            f"<table style='border-collapse:collapse'>{''.join(rows)}</table>"
            f"<p class='hl-legend' style='font-size:12px;color:#444;margin:4px 0'>"
            f"{html.escape(EFFECT_LABEL)}: {-bound:+.1f} {legend} {bound:+.1f} (red carries "
            "the behaviour, blue works against it)</p>"
            f"<p style='font-size:12px;margin:0'>top: {html.escape(top)}</p></div>"
        )


def _effect_colour(value: float, bound: float) -> str:
    """A cell's colour in the notebook: red for a positive effect, blue for a negative one,
    as opaque as its share of ``bound``."""
    a = min(1.0, abs(value) / bound)
    return f"rgba(200,30,30,{a:.2f})" if value > 0 else f"rgba(30,80,200,{a:.2f})"


def _top_json(rows: list[tuple[int, int, float]]) -> list[dict[str, Any]]:
    return [{"layer": layer, "head": head, "effect": value} for layer, head, value in rows]


def _position_name(position: int) -> Any:
    return "last" if position == -1 else position


LAYER_PARTS = ("resid", "attn", "mlp")


@dataclass(frozen=True, kw_only=True)
class LayerTable:
    """Each layer's effect when its whole input residual stream (``resid``, what the block
    reads), its attention output (``attn``, every head at once) or its MLP output (``mlp``) is
    taken from the corrupted run: TransformerLens' patching tables, normalized as per head.

    Shape:
        resid, attn, mlp: ``(L,)`` float64 (NaN: a block without a recognisable MLP).
    """

    resid: torch.Tensor
    attn: torch.Tensor
    mlp: torch.Tensor

    def to_json(self) -> list[dict[str, Any]]:
        rows = []
        for layer in range(len(self.resid)):
            row: dict[str, Any] = {"layer": layer}
            for part in LAYER_PARTS:
                value = float(getattr(self, part)[layer])
                row[part] = None if value != value else value
            rows.append(row)
        return rows
