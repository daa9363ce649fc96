"""A pruning request, from the options to a model ready to prune: the checks that need no
model, the choice of the language-model head, the model made ready (an encoder-decoder's
encoder, the layers checked prunable), and a result as CSV.

``headlab prune`` is these calls in order, then :func:`headlab.pruning.workflow.run_pruning`
or :func:`headlab.pruning.methods.compare_methods`.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from typing import Any

from headlab.errors import InputError, PruningError
from headlab.models.loading import LoadedModel
from headlab.models.names import resolve
from headlab.models.seq2seq import is_encoder_decoder, text_encoder
from headlab.pruning.results import PruneOptions


def check_request(options: PruneOptions, *, curve: bool, figure: bool) -> None:
    """Refuse a request whose parts do not go together (a curve and a model, a figure with no
    comparison), before :meth:`PruneOptions.check` and before any model loads.

    Raises:
        InputError: one line naming the options that clash.
    """
    gates_decide = (
        options.importance == "l0" and options.out is not None and options.fraction is None
    )
    if curve == (options.fraction is not None or gates_decide):
        raise InputError(
            "give either --fraction F (prune and save), --importance l0 --out DIR (the gates "
            "decide), or --curve (measure only)"
        )
    if options.compare and not curve:
        raise InputError("--compare goes with --curve")
    if figure and not options.compare:
        raise InputError("--figure goes with --curve --compare")
    if options.x_axis == "kv-bytes" and not options.compare:
        raise InputError("--x kv-bytes is the x-axis of the --compare figure")


def wants_lm_head(options: PruneOptions, model: str | None) -> bool | None:
    """Whether ``model`` loads with its language-model head: for perplexity and IOI (the
    default of causal models is perplexity) when it is a causal language model with one, as
    the catalogue tells before loading (``None``: a name not in the local cache)."""

    if options.metric not in (None, "perplexity", "ioi") or model is None:
        return False
    return resolve(model).causal


def ready_model(
    load: Callable[[bool], LoadedModel], options: PruneOptions, model: str | None
) -> LoadedModel:
    """The model to prune, loaded by ``load(with_lm_head)``: with its language-model head where
    the metric reads logits, an encoder-decoder's encoder (measured only: its pruned folder
    would record one stack of layers), every layer checked prunable when a folder is written.

    Raises:
        PruningError: an encoder-decoder with ``out``, or a layer that cannot be pruned.
        InputError: ``--x kv-bytes`` for an encoder (it keeps no KV cache).
    """

    wanted = wants_lm_head(options, model)
    lm = load(bool(wanted))
    if is_encoder_decoder(lm):
        if options.out is not None:
            raise PruningError(
                f"{lm.name} is an encoder-decoder: headlab's pruned folders record one stack of "
                "layers (without --out, prune measures its encoder's heads)"
            )
        lm = text_encoder(lm)
    if options.out is not None:  # before the search, not after it
        for layer in range(lm.n_layers):
            why = lm.adapter.prunable(layer)
            if why is not None:
                raise PruningError(why)
    if options.x_axis == "kv-bytes" and not lm.causal:
        raise InputError(
            f"--x kv-bytes needs a causal model with a KV cache; {lm.name} is an encoder"
        )
    return lm


def curve_csv(result: dict[str, Any]) -> str:
    """A pruning result's curve (``PruneResult.to_json()``) as CSV, one row per point."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(result["curve"][0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(result["curve"])
    return buf.getvalue()


def compare_csv(result: dict[str, Any]) -> str:
    """A comparison of importance methods (:func:`~headlab.pruning.methods.compare_methods`) as
    CSV: every point of every curve, then of its recovered points (``recovered``: the steps)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["importance", "recovered", "heads_removed", "fraction", "metric", "loss"])
    for m in result["methods"]:
        for p in m["curve"]:
            writer.writerow(
                [m["importance"], 0, p["heads_removed"], p["fraction"], p["metric"], p["loss"]]
            )
        for p in m.get("recovered", []):
            writer.writerow(
                [
                    m["importance"],
                    p["steps"],
                    p["heads_removed"],
                    p["fraction"],
                    p["metric_after"],
                    p["loss_after"],
                ]
            )
    return buf.getvalue()
