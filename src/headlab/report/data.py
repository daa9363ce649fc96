"""Everything the report shows, gathered into one JSON-ready dict."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from headlab.errors import InputError
from headlab.layout.costs import compute_spec
from headlab.models.analysis import word_attention
from headlab.models.loading import LoadedModel
from headlab.models.sentence_view import sentence_json
from headlab.models.words import find_word
from headlab.page.styles import role_styles
from headlab.progress import Progress, stage
from headlab.report.decoder import decoder_roles, decoder_spec, extra_scores
from headlab.report.ledger import build_ledger
from headlab.roles.classify import CAUSAL_ROLES
from headlab.roles.measure import RoleReport

logger = logging.getLogger(__name__)

#: the spec's names of the model dtypes a KV cache is kept in
_DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def viewer_sentence(lm: LoadedModel, text: str) -> dict[str, Any]:
    """One sentence of the viewer: every head's word-level attention, in the one sentence JSON
    of every page (:func:`~headlab.models.sentence_view.sentence_json`). Token-level patterns
    and those weighted by value norms are left out (``None``): the viewer draws words only, and
    they would make the page several times larger."""
    return sentence_json(lm, text, word_attention(lm, text))


def gather(
    lm: LoadedModel,
    roles: RoleReport,
    sentences: Sequence[str],
    *,
    focus_word: str,
    pruning: dict[str, Any] | None = None,
    experiment: dict[str, Any] | None = None,
    experiments: Sequence[dict[str, Any]] = (),
    cost: dict[str, Any] | None = None,
    companion: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The report's data: model, spec, roles, viewer sentences, optional extra results
    (``experiment`` and ``experiments``: one-vs-many results; ``cost``: experiment cost's), and
    the ledger of the lesson's claims built from all of them (the viewer's sentences are one
    stage of ``progress``). A causal model's page also gets ``decoder``: its decoder roles and
    KV cache (:mod:`headlab.report.decoder`); ``companion`` links the other model's page."""

    # the KV cache in the dtype the model runs in, as headlab spec reads it from the config
    dtype = _DTYPE_NAMES.get(str(lm.dtype).removeprefix("torch."), "fp32")
    spec = compute_spec(lm.layout, context=512, dtype=dtype).as_dict()
    viewer = []
    with stage(progress, "viewer patterns", len(sentences), "sentences") as report:
        for text in sentences:
            logger.info("patterns for %r", text[:40])
            viewer.append(viewer_sentence(lm, text))
            report.advance()
    every = [e for e in (experiment, *experiments) if e is not None]
    roles_json = roles.to_json()
    decoder = None
    if lm.causal:
        decoder = {
            "roles": decoder_roles(roles_json),
            "extra_scores": extra_scores(roles_json),
            "spec": decoder_spec(lm.layout, dtype),
        }
    return {
        "schema": "headlab.report/1",
        "model": lm.name,
        "model_path": str(Path(lm.path)),
        "layers": lm.n_layers,
        "heads": lm.n_heads,
        "causal": lm.causal,
        "spec": spec,
        "roles": roles_json,
        # an encoder's legend leaves out the roles only a decoder is measured for
        "role_style": role_styles(
            [r for r in roles_json["role_counts"] if lm.causal or r not in CAUSAL_ROLES]
        ),
        "decoder": decoder,
        "companion": companion,
        "sentences": viewer,
        "focus": _focus(viewer, focus_word),
        "pruning": pruning,
        "experiment": experiment,
        "experiments": every,
        "cost": cost,
        "ledger": build_ledger(roles=roles_json, pruning=pruning, cost=cost, experiments=every),
    }


def _focus(viewer: list[dict[str, Any]], word: str) -> dict[str, Any]:
    """Where the viewer opens: the first sentence that has ``word`` (the lesson's sentence
    comes first), at that word; the first sentence and no word when none has it."""
    for i, sentence in enumerate(viewer):
        index = _focus_index(sentence, word)
        if index >= 0:
            return {"sentence": i, "word": word, "index": index}
    return {"sentence": 0, "word": word, "index": -1}


def _focus_index(sentence: dict[str, Any], word: str) -> int:
    """Where the viewer opens in the first sentence: ``word`` (or ``word#N``), -1 if absent."""

    try:
        return find_word(sentence["words"], sentence["special"], word)
    except InputError:
        return -1
