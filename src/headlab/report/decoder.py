"""What a decoder's page adds: its own prompt, its decoder roles, its KV-cache spec, and the
link between the encoder's page and the decoder's.

A decoder reads left to right, so the lesson's sentence (chosen to show an encoder's syntax
heads) gives way to an indirect-object prompt (Wang et al. 2022, "Interpretability in the Wild"),
whose last word is where the name-mover circuit acts: "... John gave a drink to" -> "Mary".

The decoder roles are read from the roles result, not listed here: every role the result counts
that the registry (:mod:`headlab.roles.registry`) marks causal, or does not know, and that some
head has a score for is a decoder role (``induction``, ``previous-token`` and
``duplicate-token`` today). A role registered later shows up on the page without a change here.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from headlab.layout.costs import compute_spec
from headlab.models.names import BUNDLED_NAMES, DECODER, DEFAULT_MODEL_NAME, GGUF_MODELS
from headlab.roles import registry

#: the decoder page's first viewer prompt (an IOI prompt) and the word it opens on (the last "to")
DECODER_PROMPT = "When Mary and John went to the store, John gave a drink to"
DECODER_FOCUS = "to#2"
#: a repeated sentence: induction and duplicate-token heads have something to find in it
REPEAT_PROMPT = (
    "Alice keeps a red kite and Bob keeps a blue boat. "
    "Alice keeps a red kite and Bob keeps a blue boat."
)
#: roles every model is probed for; any other role in a roles result is a decoder's
ENCODER_ROLES = registry.Names(lambda r: not r.causal)
#: a score that is not a role but belongs with the decoder roles when the result has it
EXTRA_SCORES = ("copying",)
#: heads listed per decoder role, best first
TOP_HEADS = 5

#: the folders the encoder's and the bundled decoder's reports go to by default, side by side
#: so that each can link the other
ENCODER_FOLDER = "headlab-report"


def decoder_folder(key: str) -> str:
    """Where the report of bundled GGUF decoder ``key`` goes by default: headlab-report-KEY."""
    return f"{ENCODER_FOLDER}-{key}"


DECODER_FOLDER = decoder_folder(DECODER)


def role_score(scores: dict[str, Any], role: str) -> float | None:
    """A head's score for ``role`` (under the role's own name, as every roles result keeps
    it); ``None`` when it has none."""
    value = scores.get(role)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def decoder_roles(roles: dict[str, Any]) -> list[dict[str, Any]]:
    """Each decoder role of a roles result (``RoleReport.to_json()``): its bar, how many heads
    it is dominant in and how many clear its bar, and its best heads by score.

    Returns ``[{"role", "bar", "dominant", "clearing", "top": [{"layer", "head", "score",
    "clears", "dominant"}]}]``, in the result's order of roles; empty for an encoder.
    """
    heads = roles["heads"]
    thresholds = roles.get("thresholds", {})
    out = []
    for role in roles["role_counts"]:
        if role in ENCODER_ROLES or role == registry.UNCLASSIFIED:
            continue
        scored = [(s, h) for h in heads if (s := role_score(h["scores"], role)) is not None]
        if not scored:  # not measured here (an encoder has no induction pass)
            continue
        scored.sort(key=lambda pair: -pair[0])
        found = registry.get(role)
        bar = thresholds.get(role.replace("-", "_") if found is None else found.threshold)
        out.append(
            {
                "role": role,
                "bar": bar,
                "dominant": roles["role_counts"][role],
                "clearing": sum(role in h["roles"] for h in heads),
                "top": [
                    {
                        "layer": h["layer"],
                        "head": h["head"],
                        "score": round(s, 3),
                        "clears": role in h["roles"],
                        "dominant": h["role"] == role,
                    }
                    for s, h in scored[:TOP_HEADS]
                ],
            }
        )
    return out


def extra_scores(roles: dict[str, Any]) -> list[str]:
    """The :data:`EXTRA_SCORES` some head of ``roles`` has a number for."""
    return [
        k
        for k in EXTRA_SCORES
        if any(role_score(h["scores"], k) is not None for h in roles["heads"])
    ]


def decoder_spec(layout: Any, dtype: str) -> dict[str, Any]:
    """The KV cache of a decoder, from :func:`headlab.layout.costs.compute_spec`: bytes per
    token and at the full context in the model's ``dtype``, and what the same model would
    cache with one KV head per query head (multi-head attention), for the GQA saving."""

    context = min(layout.max_positions or 2048, 1 << 20)
    spec = compute_spec(layout, context=context, dtype=dtype)
    mha = replace(layout, kv_heads_per_layer=tuple(layout.heads_per_layer))
    full = compute_spec(mha, context=context, dtype=dtype)
    return {
        "dtype": dtype,
        "context": context,
        "kv_cache_bytes_per_token": spec.kv_cache_bytes_per_token,
        "kv_cache_bytes": spec.kv_cache_bytes,
        "mha_kv_cache_bytes_per_token": full.kv_cache_bytes_per_token,
    }


def companion(out: Path, *, causal: bool, default_model: bool) -> dict[str, Any] | None:
    """The other model's page: for the default encoder's report the bundled decoder's, for a
    decoder's the default encoder's. ``href`` is the relative link to where that report sits
    beside ``out`` (a sibling folder), whether or not it is there yet, so that a page written
    first links the other once it is made; ``found`` says whether it is there now;
    ``command`` makes it there."""

    if causal:
        target, model, command = ENCODER_FOLDER, DEFAULT_MODEL_NAME, "headlab report"
    elif default_model:
        target, model = DECODER_FOLDER, BUNDLED_NAMES[DECODER]
        command = f"headlab report --model {DECODER}"
    else:
        return None
    sibling = out.resolve().parent / target
    found = sibling != out.resolve() and (sibling / "index.html").is_file()
    # this page's default folder name (a decoder's: any bundled decoder's)
    own = {decoder_folder(key) for key in GGUF_MODELS} if causal else {ENCODER_FOLDER}
    if out.resolve().name not in own:  # written elsewhere: the other's default is not beside it
        command += f" --out {sibling}"
    return {
        "model": model,
        "kind": "encoder" if causal else "decoder",
        "command": command,
        "href": f"../{target}/index.html",
        "found": found,
    }
