"""The report's folder: a self-contained HTML explorer of every head, and PNG figures.

The folder holds ``index.html`` (data, script and style inline; nothing is fetched) and
``figures/*.png``. It is written to a temporary sibling and renamed into place, so a reader never
sees half a report.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from headlab.causal.figure import write_circuit, write_heatmap
from headlab.causal.patching import PatchingResult
from headlab.experiments.agreement import TASK_ROLES, induction_agreement
from headlab.experiments.cost_figure import cost_figure
from headlab.models.loading import LoadedModel
from headlab.models.names import DEFAULT_MODEL_NAME
from headlab.outputs import atomic_folder, check_output
from headlab.page.html import render
from headlab.progress import Progress, stage
from headlab.pruning.figure import pruning_compare
from headlab.report import figures
from headlab.report.causal import circuit_heads, left_out_text, patched_heads
from headlab.report.data import gather
from headlab.report.decoder import companion
from headlab.report.ledger import ledger_markdown
from headlab.roles import registry
from headlab.roles.measure import RoleReport

logger = logging.getLogger(__name__)

DEFAULT_FOLDER = "headlab-report"
#: the marker file of reports written by earlier versions (still written, for them)
MARKER = ".headlab-report"
#: the kind of output recorded in the folder's ``.headlab-output`` marker
KIND = "report"
#: the schema of ``ledger.json`` (``claims``: the rows of :func:`ledger.build_ledger`)
LEDGER_SCHEMA = "headlab.ledger/1"


def write_report(
    lm: LoadedModel,
    roles: RoleReport,
    out: str | Path,
    *,
    sentences: Sequence[str],
    focus_word: str,
    pruning: dict[str, Any] | None = None,
    experiment: dict[str, Any] | None = None,
    experiments: Sequence[dict[str, Any]] = (),
    cost: dict[str, Any] | None = None,
    patching: dict[str, Any] | None = None,
    circuit: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write the report folder ``out`` (index.html, figures/, and the ledger of the lesson's
    claims as ledger.json and ledger.md) atomically.

    An existing headlab report is replaced; another folder headlab wrote only with
    ``overwrite``; any other folder never (see :mod:`headlab.outputs`). ``progress`` is told
    of two stages: the viewer's patterns, then the figures and the page.
    """

    out = Path(out)
    check_output(out, overwrite=overwrite, kind=KIND, replace_kind=True)
    other = companion(out, causal=lm.causal, default_model=lm.name == DEFAULT_MODEL_NAME)
    data = gather(
        lm,
        roles,
        sentences,
        focus_word=focus_word,
        pruning=pruning,
        experiment=experiment,
        experiments=experiments,
        cost=cost,
        companion=other,
        progress=progress,
    )
    showcase = _showcase(roles)
    # the role grid, heatmaps, pruning and cost figures, index.html
    n_files = 2 + len(showcase) + bool(pruning) + bool(cost) + bool(patching) + bool(circuit)
    with (
        atomic_folder(out, overwrite=overwrite, kind=KIND, replace_kind=True) as tmp,
        stage(progress, "figures and page", n_files, "files") as report,
    ):
        fig_dir = tmp / "figures"
        fig_dir.mkdir()
        made = [
            (
                figures.role_grid(data, fig_dir / "role_grid.png"),
                "Primary role of every head (letters faint where the role is unstable)",
            )
        ]
        report.advance()
        first = "the IOI prompt" if lm.causal else "the lesson sentence"  # the viewer's first
        repeats = _repeating_sentence(data["sentences"])
        for layer, head, why in showcase:
            name = f"heatmap_L{layer}_H{head}.png"
            sentence, where = data["sentences"][0], first
            if why.split(":")[0] in REPEAT_ROLES and repeats is not None:
                sentence, where = repeats, "a sentence said twice"  # its stripe needs a repeat
            title = f"layer {layer}, head {head} ({why}) on {where}"
            made.append((figures.heatmap(sentence, layer, head, fig_dir / name, title), title))
            report.advance()
        if pruning:
            made.append(
                (
                    pruning_compare(pruning, fig_dir / "pruning_compare.png")
                    if "methods" in pruning
                    else figures.pruning_curve(pruning, fig_dir / "pruning_curve.png"),
                    "Importance methods compared (with recovery)"
                    if "methods" in pruning
                    else "Pruning curve",
                )
            )
            report.advance()
        if cost:
            made.append(
                (
                    cost_figure(cost, fig_dir / "cost.png"),
                    "Time and peak memory of attention against the head count, at one width",
                )
            )
            report.advance()
        # patching and the circuit: each its own section, its figure at full size
        sections: dict[str, tuple[str, str]] = {}
        layer_heads = data["roles"].get("heads_in_layer") or [lm.n_heads] * lm.n_layers
        if patching:
            path, caption = _patching_figure(patching, fig_dir / "patching.png", roles)
            sections["patch"] = (f"figures/{path.name}", caption)
            data["patching"] = patched_heads(patching, layer_heads)
            report.advance()
        if circuit:
            data["circuit"] = circuit_heads(circuit, patching)
            path, caption = _circuit_figure(circuit, fig_dir / "circuit.png")
            sections["circuit"] = (f"figures/{path.name}", caption + left_out_text(data["circuit"]))
            report.advance()
        rel = [(f"figures/{path.name}", caption) for path, caption in made]
        (tmp / "index.html").write_text(render(data, rel, sections), encoding="utf-8")
        report.advance()
        (tmp / "ledger.json").write_text(
            json.dumps({"schema": LEDGER_SCHEMA, "claims": data["ledger"]}, indent=2) + "\n",
            encoding="utf-8",
        )
        (tmp / "ledger.md").write_text(ledger_markdown(data["ledger"]), encoding="utf-8")
        (tmp / MARKER).write_text("written by headlab report\n", encoding="utf-8")
    return out


#: roles whose pattern shows only on a sentence that repeats itself (the registry's ``repeats``)
REPEAT_ROLES = registry.Names(lambda r: r.repeats)


def _repeating_sentence(sentences: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The first viewer sentence whose words repeat a run of three (an induction head's
    stripe one off the diagonal needs one), or ``None``."""
    for sentence in sentences:
        words = [w.lower() for w in sentence["words"]]
        runs = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
        if len(set(runs)) < len(runs):
            return sentence
    return None


def _showcase(roles: RoleReport) -> list[tuple[int, int, str]]:
    """The clearest head of each role present (highest margin), for the heatmap figures."""
    best: dict[str, tuple[float, int, int, str]] = {}
    for h in roles.heads:
        if h.role == "unclassified" or h.margin is None:
            continue
        label = f"{h.role}: {h.detail}" if h.detail else h.role
        if h.role not in best or h.margin > best[h.role][0]:
            best[h.role] = (h.margin, h.layer, h.head, label)
    return [(layer, head, label) for _, layer, head, label in best.values()]


def _circuit_figure(circuit: dict[str, Any], path: Path) -> tuple[Path, str]:
    """The graph of a ``headlab circuit --json`` result and its caption."""

    c = circuit["circuit"]
    named = ", ".join(
        f"{name} {' '.join(f'{la}.{h}' for la, h in heads)}"
        for name, heads in circuit["classes"].items()
        if name != "unexplained"
    )
    caption = (
        f"The circuit of {circuit['task']} in {circuit['model']}: {c['edges']} of "
        f"{circuit['edges_total']} edges keep {c['faithfulness']:.0%} of the logit difference "
        f"on held-out prompts (headlab circuit); heads by class: {named or 'none named'}"
    )
    return write_circuit(circuit, path), caption


def _patching_figure(patching: dict[str, Any], path: Path, roles: RoleReport) -> tuple[Path, str]:
    """The heatmap of a ``headlab patch --json`` result and its caption: which heads carry
    the behaviour, the strongest by name with their signed effects; on a task a role names
    (induction), the roles checked against it, every disagreement said
    (:mod:`headlab.experiments.agreement`)."""

    result = PatchingResult.from_json(patching)
    top = ", ".join(f"{layer}.{head} ({value:+.2f})" for layer, head, value in result.top(6))
    carrier = "head" if result.unit == "head" else "KV head"  # k, v (and q) per KV head
    part = {"q": "queries", "k": "keys", "v": "values"}.get(result.component, "output")
    source = "corrupted" if result.source == "corrupt" else result.source
    what, carriers = f"a {carrier}'s {source} {part}", f"{carrier}s"
    caption = (
        f"Which {carriers} carry {result.task}: {result.method} patching of {result.model} "
        f"over {result.n_prompts} prompts (logit difference {result.clean:.2f} clean, "
        f"{result.corrupt:.2f} corrupt). Effect: the share of the logit difference {what} "
        f"removes (red carries it, blue works against it). Strongest: {top}"
    )
    return write_heatmap(result, path), caption + agreement_text(roles, result)


def agreement_text(roles: RoleReport, result: PatchingResult) -> str:
    """What the patching figure's caption adds on a task a role names: the heads both call
    the role's, then each disagreement as "looks like X, acts like Y"; nothing otherwise."""
    if result.task not in TASK_ROLES or result.component != "z":
        return ""
    agreement = induction_agreement(roles.to_json(), result)
    both = [f"{h.layer}.{h.head}" for h in agreement.heads if h.verdict == "agree"]
    text = (
        f". Roles against patching (a head acts with an effect of at least {agreement.acts}): "
        f"{len(both)} {agreement.role} head(s) both name ({', '.join(both) or 'none'})"
    )
    for h in agreement.disagreements():
        text += f"; {h.layer}.{h.head} ({h.effect:+.2f}) {h.verdict}"
    return text + "."
