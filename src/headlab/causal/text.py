"""What ``headlab patch`` and ``headlab compose`` show a person: the tables and lines of each
result (:mod:`headlab.text`), printed by the CLI, shown the same in a notebook."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headlab.causal.dla import DLAResult
from headlab.causal.paths import PathResult
from headlab.text import Part, table

if TYPE_CHECKING:
    from headlab.causal.dla import DLAResult
    from headlab.causal.paths import PathResult
    from headlab.causal.request import ComposeResult
    from headlab.causal.result import PatchingResult


def patch_text(result: Any, top: int = 10) -> list[Part]:
    """What ``headlab patch`` prints of any of its results: :func:`patching_text`,
    :func:`dla_text` or :func:`path_text`."""

    if isinstance(result, PathResult):
        return path_text(result, top)
    if isinstance(result, DLAResult):
        return dla_text(result, top)
    return patching_text(result, top)


def patching_text(result: PatchingResult, top: int = 10) -> list[Part]:
    """The run in a line (model, task, logit differences), the correlation with activation
    patching where it was measured, the ``top`` heads by |effect| (beside activation patching's
    effect when compared) and the 5 layers of largest effect (whole components patched)."""
    unit = "KV head" if result.unit == "kv_head" else "head"
    out: list[Part] = [
        f"{result.method} patching of {result.model} on {result.task} ({result.n_prompts} "
        f"prompts, position {result.to_json()['position']}): logit difference "
        f"{result.clean:.3f} clean, {result.corrupt:.3f} corrupt, in {result.seconds:.1f} s"
    ]
    reference = result.reference
    if result.correlation is not None and reference is not None:
        c = result.correlation
        out.append(
            f"against activation patching: Pearson {c['pearson']:.3f}, Spearman {c['spearman']:.3f}"
        )
    columns = ["layer.KV head" if result.unit == "kv_head" else "layer.head", result.method]
    rows = [[f"{layer}.{head}", f"{value:+.3f}"] for layer, head, value in result.top(top)]
    if reference is not None:
        columns.append("activation")
        for row, (layer, head, _) in zip(rows, result.top(top), strict=True):
            row.append(f"{float(reference.effects[layer, head]):+.3f}")
    title = f"top {top} {unit}s by |effect| (share of the logit difference removed)"
    out.append(table(columns, rows, title=title, right=range(1, len(columns))))
    if reference is not None:
        best = ", ".join(f"{la}.{h} {v:+.2f}" for la, h, v in reference.top(min(top, 5)))
        out.append(f"activation patching's top: {best}")
    if result.layers is not None:
        layers = result.layers.to_json()
        parts = ("resid", "attn", "mlp")
        strongest = sorted(layers, key=_layer_rank)[:5]
        rows = [
            [str(r["layer"]), *(f"{r[k]:+.3f}" if r[k] is not None else "-" for k in parts)]
            for r in sorted(strongest, key=lambda r: r["layer"])
        ]
        out.append(
            table(
                ("layer", "residual in", "attention out", "MLP out"),
                rows,
                title="the 5 layers of largest effect, whole components patched",
                right=range(4),
            )
        )
    return out


def _layer_rank(row: dict[str, Any]) -> tuple[float, float, int]:
    """A layer's place among the 5 of largest effect: by its attention's or MLP's |effect|
    (what the layer itself adds), then by its residual's (with every position patched the
    residual stream carries the whole corrupted input: 1.000 at every layer, a tie that must
    not put layers 0-4 first), then by layer."""
    own = max(abs(row["attn"] or 0.0), abs(row["mlp"] or 0.0))
    return (-own, -abs(row["resid"] or 0.0), row["layer"])


def dla_text(result: DLAResult, top: int = 10) -> list[Part]:
    """The logit difference split into the heads' direct effects and the rest, and the ``top``
    heads by |direct effect| (negative ones marked)."""
    head = (
        f"direct logit attribution of {result.model} on {result.task} ({result.n_prompts} "
        f"prompts, final norm {result.norm} frozen at the clean run): logit difference "
        f"{result.clean:.3f} = heads {result.to_json()['heads_total']:.3f} + the rest "
        f"{result.rest:.3f}"
    )
    rows = [
        (f"{layer}.{h}", f"{value:+.3f}", "negative" if value < 0 else "")
        for layer, h, value in result.top(top)
    ]
    title = f"top {top} heads by |direct effect| on the logit difference"
    return [head, table(("layer.head", "dla", ""), rows, title=title, right=(1,))]


def path_text(result: PathResult, top: int = 10) -> list[Part]:
    """The run in a line and the ``top`` senders by |effect| of their path to the receiver."""
    head = (
        f"path patching of {result.model} on {result.task} to {result.receiver} "
        f"({result.n_prompts} prompts): logit difference {result.clean:.3f} clean, "
        f"{result.corrupt:.3f} corrupt, in {result.seconds:.1f} s"
    )
    rows = [(f"{layer}.{h}", f"{value:+.3f}") for layer, h, value in result.top(top)]
    title = f"top {top} senders by |effect| of their path to {result.receiver}"
    return [head, table(("sender", "effect"), rows, title=title, right=(1,))]


#: the name of each kind of composition
_KIND_NAMES = {"q": "Q-composition", "k": "K-composition", "v": "V-composition"}


def compose_text(result: ComposeResult, top: int = 10) -> list[Part]:
    """What ``headlab compose`` prints: the ``top`` pairs of each kind, with their score over
    the kind's baseline; with receivers, each one's strongest senders
    (:func:`receivers_text`)."""
    if result.senders is not None:
        return receivers_text(result.to_json(), top)
    scores = result.scores
    out: list[Part] = []
    for kind, name in _KIND_NAMES.items():
        base = scores.baseline[kind]
        rows = [
            (
                f"{pair['sender']['layer']}.{pair['sender']['head']}",
                f"{pair['receiver']['layer']}.{pair['receiver']['head']}",
                f"{pair['score']:.3f}",
                f"{pair['score'] / base:.2f}",
            )
            for pair in scores.top_pairs(kind, top)
        ]
        title = f"{name} of {scores.model}: top {top} (baseline {base:.3f})"
        columns = ("sender", "receiver", "score", "x baseline")
        out.append(table(columns, rows, title=title, right=range(4)))
    return out


def receivers_text(data: dict[str, Any], top: int = 10) -> list[Part]:
    """Each receiver of ``data`` (:meth:`ComposeResult.to_json` with receivers) and its
    senders, strongest first, each with its score over the baseline."""
    rows = [
        (
            f"{row['receiver']['layer']}.{row['receiver']['head']}",
            ", ".join(f"{s['layer']}.{s['head']} {s['x_baseline']:.1f}" for s in row["senders"]),
        )
        for row in data["receivers"]
    ]
    title = (
        f"{data['kind'].upper()}-composition of {data['model']}: what each head reads "
        f"(baseline {data['baseline']:.3f})"
    )
    return [table(("receiver", f"top {top} senders (x baseline)"), rows, title=title)]
