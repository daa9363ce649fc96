"""One sentence traced: which heads carry a word's attention to each of its dependents, set
beside the heads that the relation table names best for those relations on gold data.

The lesson's example is "The chef who trained in Paris prepared the fish carefully.": the verb
"prepared" needs its subject ("chef"), its object ("fish") and its manner ("carefully"), and the
lesson says different heads can look for each. :func:`trace_word` ranks every head of a model by
the word-level attention (:mod:`headlab.models.words`: sum over the target word's tokens, mean
over the attending word's) that the chosen word sends to each of its dependents in a given parse,
and compares that ranking with the relation table of ``headlab roles``
(:class:`~headlab.roles.results.RelationRow`, head-to-dependent direction): the head whose
attention argmax most often lands on a dependent of that relation over a whole treebank
(Clark et al. 2019, section 4.1).

The two questions differ on purpose. The relation table asks of one head "how often, over many
sentences, is my favourite word a dependent of this kind?"; the trace asks of one sentence
"which heads send this word's attention to this dependent?". A head agrees with the table when
the table's head is among the ``k`` heads that send the most attention to the dependent here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headlab.datasets.bundled import sample_path
from headlab.datasets.lesson import LESSON_SENTENCE, LESSON_WORD
from headlab.datasets.parse import parse_sentence
from headlab.datasets.treebank import TreebankSentence, read_treebank
from headlab.errors import DataFormatError, InputError
from headlab.models.analysis import word_attention
from headlab.models.loading import LoadedModel
from headlab.models.words import find_word
from headlab.roles.measure import measure_roles
from headlab.roles.options import RoleOptions
from headlab.roles.results import RelationRow, read_roles_json

HEAD_TO_DEPENDENT = "head_to_dependent"


def lesson_parse() -> TreebankSentence:
    """The lesson's sentence parsed by hand in Universal Dependencies (the bundled
    ``lesson.conllu``): "who trained in Paris" is a relative clause (``acl:relcl``) on "chef",
    and "prepared" has ``nsubj`` chef, ``obj`` fish, ``advmod`` carefully and ``punct``."""

    return choose_sentence(sample_path("lesson"), None)


@dataclass(frozen=True, kw_only=True)
class HeadWeight:
    """One head and the word-level attention it sends from the word to a dependent."""

    layer: int
    head: int
    weight: float


@dataclass(frozen=True, kw_only=True)
class ArcTrace:
    """One arc from the traced word to a dependent.

    Attributes:
        relation: the arc's relation in the parse (``nsubj``, ``obj``, ``acl:relcl``...).
        dependent: the dependent word; ``dependent_index`` its 0-based position in the parse.
        top: the ``k`` heads that send the most attention from the word to the dependent.
        gold: the relation table's best head for ``gold_relation`` (head to dependent), or
            ``None`` when the table has no row for the relation.
        gold_relation: the table's relation used: the arc's own, else its base (``acl`` for
            ``acl:relcl``) when only that is in the table.
        gold_weight: the attention the gold head sends to the dependent in this sentence.
        gold_rank: its rank among all heads by that attention (1: the most; ties share the
            better rank).
        gold_target: where the gold head's attention argmax goes in this sentence (self and
            special tokens excluded, as the relation table counts); ``gold_hit``: whether that
            is this dependent (what the table counts as a hit).
        unseen: the dependent comes after the word in a causal model, whose word cannot attend
            to a later one: every head's weight to it is 0 and no verdict is drawn.
    """

    relation: str
    dependent: str
    dependent_index: int
    top: tuple[HeadWeight, ...]
    gold: RelationRow | None
    gold_relation: str | None
    gold_weight: float | None
    gold_rank: int | None
    gold_target: str | None
    gold_hit: bool | None
    unseen: bool = False

    @property
    def verdict(self) -> str:
        """``agree`` when the table's head is among the top ``k`` here, ``disagree`` when it is
        not, ``no gold row`` when the table has no row for the relation, ``unseen`` when the
        word cannot attend to the dependent (a later word, in a causal model)."""
        if self.unseen:
            return "unseen"
        if self.gold_rank is None:
            return "no gold row"
        return "agree" if self.gold_rank <= len(self.top) else "disagree"

    def to_json(self) -> dict[str, Any]:
        gold = self.gold
        return {
            "relation": self.relation,
            "dependent": self.dependent,
            "dependent_index": self.dependent_index,
            "top": [
                {"layer": h.layer, "head": h.head, "weight": round(h.weight, 4)} for h in self.top
            ],
            "gold": None
            if gold is None
            else {
                "relation": self.gold_relation,
                "layer": gold.layer,
                "head": gold.head,
                "accuracy": round(gold.accuracy, 4),
                "baseline": round(gold.baseline, 4),
                "count": gold.count,
                "weight": None if self.gold_weight is None else round(self.gold_weight, 4),
                "rank": self.gold_rank,
                "attends_most_to": self.gold_target,
                "hit": self.gold_hit,
            },
            "unseen": self.unseen,
            "verdict": self.verdict,
        }


@dataclass(frozen=True, kw_only=True)
class SentenceTrace:
    """The trace of one word of one parsed sentence (see :func:`trace_word`)."""

    model: str
    sentence: TreebankSentence
    word: str
    word_index: int
    k: int
    n_heads: int
    table_source: str
    arcs: tuple[ArcTrace, ...]

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (schema ``headlab.trace/1``; 0-based layer, head, indices)."""
        s = self.sentence
        return {
            "schema": "headlab.trace/1",
            "model": self.model,
            "sentence": {
                "sent_id": s.sent_id,
                "words": list(s.words),
                "heads": list(s.heads),
                "relations": list(s.relations),
            },
            "word": self.word,
            "word_index": self.word_index,
            "top": self.k,
            "heads_ranked": self.n_heads,
            "relation_table": self.table_source,
            "arcs": [a.to_json() for a in self.arcs],
        }


def trace_word(
    lm: LoadedModel,
    sentence: TreebankSentence,
    word: str,
    relations: Sequence[RelationRow],
    *,
    k: int = 3,
    table_source: str = "",
) -> SentenceTrace:
    """Rank every head by the attention ``word`` sends to each of its dependents in
    ``sentence``'s parse, and place the relation table's best head in that ranking.

    Args:
        lm: the model.
        sentence: the parsed sentence (words, 0-based heads, relations).
        word: the word to trace (as written first, else in another case: ``find_word``;
            ``word#2`` for its second occurrence).
        relations: the relation table (``RoleReport.relations`` or :func:`read_relation_table`).
        k: heads shown per dependent; the verdict is "agree" when the table's head is among them.
        table_source: where the relation table comes from, in words (kept in the JSON).

    Raises:
        InputError: the word is not in the sentence or has no dependent; ``k`` below 1.
        AlignmentError: the parse's words cannot be matched to the model's tokens.
    """
    if k < 1:
        raise InputError(f"k must be at least 1, got {k}")
    index = check_word(sentence, word)
    dependents = [d for d, h in enumerate(sentence.heads) if h == index]
    wa = word_attention(lm, words=sentence.words)
    align = wa.alignment
    plain = align.plain_words  # parse word i is alignment word plain[i]
    source = plain[index]
    counts = lm.layout.heads_per_layer
    # every present head's row of the traced word: (heads in all layers, W)
    rows = torch.cat([wa.patterns[layer][: counts[layer], source] for layer in range(lm.n_layers)])
    ids = [(layer, h) for layer in range(lm.n_layers) for h in range(counts[layer])]
    position = {lh: i for i, lh in enumerate(ids)}
    table = {(r.relation, r.direction): r for r in relations}
    # the argmax as the relation table counts it: self and special tokens excluded
    excluded = torch.tensor(align.is_special, device=rows.device).clone()
    excluded[source] = True
    argmax = rows.masked_fill(excluded, -math.inf).argmax(-1)  # (heads,)
    arcs = []
    for dep in dependents:
        weights = rows[:, plain[dep]].double().cpu()  # (heads,)
        # descending weight, ties in (layer, head) order
        order = sorted(range(len(ids)), key=lambda i: (-float(weights[i]), i))[:k]
        top = tuple(
            HeadWeight(layer=ids[i][0], head=ids[i][1], weight=float(weights[i])) for i in order
        )
        relation = sentence.relations[dep]
        gold_relation: str | None = relation
        gold = table.get((relation, HEAD_TO_DEPENDENT))
        if gold is None and ":" in relation:
            gold_relation = relation.split(":", 1)[0]
            gold = table.get((gold_relation, HEAD_TO_DEPENDENT))
        gold_weight = gold_rank = gold_target = gold_hit = None
        if gold is None:
            gold_relation = None
        else:
            g = position.get((gold.layer, gold.head))
            if g is None:
                raise InputError(
                    f"the relation table names head {gold.layer}.{gold.head} for {relation}, "
                    f"which {lm.name} does not have"
                )
            gold_weight = float(weights[g])
            gold_rank = 1 + int((weights > weights[g]).sum())
            gold_target = align.words[int(argmax[g])]
            gold_hit = int(argmax[g]) == plain[dep]
        arcs.append(
            ArcTrace(
                relation=relation,
                dependent=sentence.words[dep],
                dependent_index=dep,
                top=top,
                gold=gold,
                gold_relation=gold_relation,
                gold_weight=gold_weight,
                gold_rank=gold_rank,
                gold_target=gold_target,
                gold_hit=gold_hit,
                unseen=lm.causal and plain[dep] > source,
            )
        )
    return SentenceTrace(
        model=lm.name,
        sentence=sentence,
        word=sentence.words[index],
        word_index=index,
        k=k,
        n_heads=len(ids),
        table_source=table_source,
        arcs=tuple(arcs),
    )


def check_word(sentence: TreebankSentence, word: str) -> int:
    """The 0-based index of ``word`` (``word#N``: its N-th occurrence) in the parse, which
    must give it at least one dependent.

    Raises:
        InputError: the word is not in the sentence, or it has no dependent.
    """
    index = find_word(sentence.words, [False] * len(sentence.words), word)
    if index not in sentence.heads:
        raise InputError(
            f"{sentence.words[index]!r} has no dependents in the parse of "
            f"{' '.join(sentence.words)!r}; choose another --word"
        )
    return index


def measure_relation_table(lm: LoadedModel, treebank: str | Path) -> list[RelationRow]:
    """The relation table of ``lm`` on a CoNLL-U treebank: ``headlab roles`` without the
    bootstrap and the coreference probe (the bundled 500-sentence sample: about 15-25 s for
    MiniLM on a 2-core CPU)."""

    report = measure_roles(lm, read_treebank(treebank), options=RoleOptions(replicates=0))
    return report.relations


def read_relation_table(path: str | Path, lm: LoadedModel) -> list[RelationRow]:
    """The relation table of a ``headlab roles --json`` file, checked to be ``lm``'s.

    Raises:
        InputError: the file cannot be read.
        DataFormatError: not the ``headlab roles --json`` JSON, or a malformed relation row.
        InputError: measured on another model (name or head layout).
    """
    path = Path(path)
    data = read_roles_json(path, "relation table", heads=False)
    if data.get("model") != lm.name:
        raise InputError(f"{path} was measured on {data.get('model')!r}, not on {lm.name!r}")
    layout = list(lm.layout.heads_per_layer)
    if data.get("heads_in_layer") != layout:
        raise InputError(
            f"{path} has heads per layer {data.get('heads_in_layer')}, {lm.name} has {layout}"
        )
    rows = []
    for i, row in enumerate(data.get("relations") or []):
        try:
            rows.append(
                RelationRow(
                    relation=str(row["relation"]),
                    direction=str(row["direction"]),
                    layer=int(row["layer"]),
                    head=int(row["head"]),
                    accuracy=float(row["accuracy"]),
                    baseline=float(row["baseline"]),
                    baseline_offset=int(row["baseline_offset"]),
                    count=int(row["count"]),
                )
            )
        except (KeyError, TypeError, ValueError):
            raise DataFormatError(f"{path}: relation row {i} is malformed") from None
    if not rows:
        raise DataFormatError(f"{path}: no relation rows")
    return rows


def choose_sentence(path: str | Path, sent_id: str | None) -> TreebankSentence:
    """The sentence ``sent_id`` of a CoNLL-U file, or its only sentence.

    Raises:
        InputError: no such id, or several sentences and no id.
    """
    sentences = read_treebank(path).sentences
    if sent_id is not None:
        for s in sentences:
            if s.sent_id == sent_id:
                return s
        raise InputError(f"{path} has no sentence with sent_id {sent_id!r}")
    if len(sentences) > 1:
        ids = ", ".join(s.sent_id for s in sentences[:3])
        raise InputError(
            f"{path} has {len(sentences)} sentences; choose one with --sentence-id "
            f"(ids: {ids}{', ...' if len(sentences) > 3 else ''})"
        )
    return sentences[0]


def check_text(sentence: TreebankSentence, text: str) -> None:
    """Check that a parse's words spell ``text`` (spaces aside).

    Raises:
        InputError: they do not.
    """
    if "".join(text.split()) != "".join(sentence.words):
        raise InputError(
            f"the parse's words {' '.join(sentence.words)!r} do not spell the sentence {text!r}"
        )


def sentence_to_trace(
    text: str | None,
    word: str | None,
    *,
    conllu: str | None = None,
    sentence_id: str | None = None,
    spacy: bool = False,
) -> tuple[TreebankSentence, str]:
    """The parse to trace and its word, checked before any model loads: the sentence
    ``sentence_id`` of ``conllu`` (default: the bundled UD EWT sample) or its only one; spaCy's
    parse of ``text`` (or of the lesson's sentence with ``spacy``); else the lesson's hand-made
    parse. The word defaults to the lesson's in its sentence, else the parse's root.

    Raises:
        InputError: ``spacy`` with a CoNLL-U sentence, a parse that does not spell ``text``, a
            word the sentence lacks or one without dependents.
    """
    if conllu or sentence_id:
        if spacy:
            raise InputError("--spacy parses the text; it does not go with --conllu/--sentence-id")
        sentence = choose_sentence(conllu or sample_path("treebank"), sentence_id)
        if text is not None:
            check_text(sentence, text)
    elif spacy or text not in (None, LESSON_SENTENCE):
        sentence = parse_sentence(text or LESSON_SENTENCE)
    else:
        sentence = lesson_parse()
    lesson = "".join(sentence.words) == "".join(LESSON_SENTENCE.split())
    word = word or (LESSON_WORD if lesson else sentence.words[sentence.heads.index(-1)])
    check_word(sentence, word)
    return sentence, word


#: where the relation table comes from when no ``headlab roles --json`` file is given
BUNDLED_TABLE = "bundled UD EWT dev sample (500 sentences)"
#: the note to show before the relation table is measured (:func:`relation_table` without a file)
MEASURING = (
    "measuring the relation table on the bundled UD EWT sample (about 20 s; --roles FILE "
    "from `headlab roles --json` skips this)"
)


def relation_table(lm: LoadedModel, roles: str | None) -> tuple[list[RelationRow], str]:
    """The relation table to trace against and where it came from: read from ``roles`` (a
    ``headlab roles --json`` file of ``lm``), else measured now on the bundled UD EWT sample
    (:func:`measure_relation_table`, about 20 s)."""
    if roles is not None:
        return read_relation_table(roles, lm), roles
    return measure_relation_table(lm, sample_path("treebank")), BUNDLED_TABLE
