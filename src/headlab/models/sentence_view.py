"""One sentence's attention as every page draws it: the ``headlab.sentence/1`` JSON.

The report's viewer, the live explorer and the notebook view all get a sentence from
:func:`sentence_json` (read on the page by ``page/assets/draw.js``'s ``readSentence``): one word
limit, one rule for the attention sink, one notice of a long input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headlab.models.analysis import WordAttention, pattern_bytes
from headlab.models.loading import LoadedModel

#: every page draws at most this many words, and tokens, of a sentence; the rest is cut, with a
#: notice (``truncated``)
MAX_VIEW_WORDS = 80
MAX_VIEW_TOKENS = 128


def view_sink(wa: WordAttention, n_words: int) -> int:
    """The attention sink (a decoder's first word) among the ``n_words`` drawn, -1 for none:
    the one sink rule of every page (``grid.js`` sets it apart like a special token)."""
    return -1 if wa.sink is None or wa.sink >= n_words else wa.sink


def sentence_json(
    lm: LoadedModel,
    text: str,
    wa: WordAttention,
    *,
    tokens: Sequence[str] | None = None,
    word: str | None = None,
) -> dict[str, Any]:
    """What a page draws of one sentence (schema ``headlab.sentence/1``).

    Patterns travel as base64 bytes, one string per layer, heads x rows x columns in that order,
    each weight as ``round(255 * w)`` (:func:`~headlab.models.analysis.pattern_bytes`); at most
    :data:`MAX_VIEW_WORDS` words and :data:`MAX_VIEW_TOKENS` tokens (``truncated``, when it
    had more: ``words`` its words and ``shown`` those drawn, special tokens such as [CLS] not
    counted, and ``tokens`` its tokens; else ``None``).

    Args:
        lm: the model ``wa`` came from.
        text: the sentence.
        wa: its attention (:func:`~headlab.models.analysis.word_attention`).
        tokens: each token as text; with them the token-level patterns (``wa`` must have them)
            travel too, else ``tokens``, ``token_special`` and ``token_patterns`` are ``None``
            (the report leaves them out: its viewer draws words only, and its page stays small).
            The patterns weighted by value norms travel where ``wa`` measured them, else
            ``None``.
        word: the word the view opens on (``focus`` its index, -1 without one or past the cut).

    Raises:
        ValueError: ``tokens`` given for an attention without token-level patterns.
    """
    align = wa.alignment
    layers = range(lm.n_layers)
    n_words = min(len(align.words), MAX_VIEW_WORDS)
    n_tokens = min(len(tokens), MAX_VIEW_TOKENS) if tokens is not None else 0
    if tokens is not None and not wa.token_patterns:
        raise ValueError("tokens given for an attention without token-level patterns")
    focus = align.word_index(word) if word is not None else -1
    # the notice counts the sentence's words, not [CLS]/[SEP] (#58): only [SEP] cut is no cut
    words = sum(not special for special in align.is_special)
    shown = sum(not special for special in align.is_special[:n_words])
    cut = shown < words or (tokens is not None and n_tokens < len(tokens))
    norms, norm_tokens = wa.norm_patterns, wa.norm_token_patterns
    return {
        "schema": "headlab.sentence/1",
        "model": lm.name,
        "text": text,
        "causal": lm.causal,
        "layers": lm.n_layers,
        "heads_in_layer": list(lm.layout.heads_per_layer),
        "words": list(align.words[:n_words]),
        "special": list(align.is_special[:n_words]),
        # the attention sink (a decoder's first word), shown apart in every view
        "sink": view_sink(wa, n_words),
        "tokens": list(tokens[:n_tokens]) if tokens is not None else None,
        "token_special": [align.is_special[w] for w in align.token_to_word[:n_tokens]]
        if tokens is not None
        else None,
        "word": word,
        "focus": focus if focus < n_words else -1,
        "truncated": {
            "words": words,
            "shown": shown,
            "tokens": len(tokens) if tokens is not None else None,
        }
        if cut
        else None,
        "patterns": [pattern_bytes(wa.patterns[i], n_words) for i in layers],
        "token_patterns": [pattern_bytes(wa.token_patterns[i], n_tokens) for i in layers]
        if tokens is not None
        else None,
        # the same weighted by value norms (Kobayashi et al. 2020), where they were measured
        "norm_patterns": [pattern_bytes(norms[i], n_words) for i in layers] if norms else None,
        "norm_token_patterns": [pattern_bytes(norm_tokens[i], n_tokens) for i in layers]
        if norm_tokens and tokens is not None
        else None,
    }
