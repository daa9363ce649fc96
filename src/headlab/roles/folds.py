"""Folds of documents, for roles that must replicate on other sentences.

``headlab roles --reliability K`` assigns roles on each of ``K`` disjoint folds and reports how
often each head's role agrees. A fold holds whole documents (UD's ``# newdoc id`` or ``sent_id``
prefix, GAP's source page): sentences of one document share topic, style and words, so splitting a
document would let a fold see near-copies of another's sentences and make roles look more
reliable than they are on new text. Documents go to folds largest first, each to the fold with
the fewest items so far (ties: the lowest fold), so folds are balanced and the split depends on
the data alone, not on a seed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from headlab.errors import InputError


def assign_folds(documents: Sequence[str], k: int, what: str = "the data") -> list[int]:
    """The fold (``0..k-1``) of each item, given each item's document id (``what``: the data
    set, named in the error).

    Raises:
        InputError: ``k`` below 2, or fewer documents than folds.
    """
    if k < 2:
        raise InputError(f"reliability needs at least 2 folds, got {k}")
    sizes = Counter(documents)
    if len(sizes) < k:
        raise InputError(
            f"{k} folds need at least {k} documents; {what} has {len(sizes)} "
            "(documents come from '# newdoc id' / sent_id prefixes, or GAP's URL column)"
        )
    load = [0] * k
    fold_of: dict[str, int] = {}
    first_seen = {doc: i for i, doc in reversed(list(enumerate(documents)))}
    for doc in sorted(sizes, key=lambda d: (-sizes[d], first_seen[d])):
        fold = min(range(k), key=lambda f: (load[f], f))
        fold_of[doc] = fold
        load[fold] += sizes[doc]
    return [fold_of[d] for d in documents]


#: folds of ``headlab roles`` and ``headlab report`` when ``--reliability`` is not given
DEFAULT_FOLDS = 5


def default_reliability(treebank: Sequence[object], gap: Sequence[object] | None) -> int:
    """:data:`DEFAULT_FOLDS` when every data set has that many documents, else 0 (no folds).

    ``treebank``: :class:`~headlab.datasets.treebank.TreebankSentence` items; ``gap``:
    :class:`~headlab.datasets.gap.GapExample` items or ``None``.
    """
    return 0 if no_folds_reason(treebank, gap) else DEFAULT_FOLDS


def no_folds_reason(treebank: Sequence[object], gap: Sequence[object] | None) -> str | None:
    """Why :func:`default_reliability` turns folds off (``None`` when it does not): the data
    set with too few documents, and how many it has."""
    reasons = []
    docs = len({getattr(s, "doc_id", "") or getattr(s, "sent_id", "") for s in treebank})
    if docs < DEFAULT_FOLDS:
        reasons.append(
            f"the treebank has {docs} document{'s' * (docs != 1)} ('# newdoc id' or sent_id "
            "prefixes)"
        )
    if gap is not None:
        pages = len({getattr(e, "source", "") or getattr(e, "id", "") for e in gap})
        if pages < DEFAULT_FOLDS:
            reasons.append(
                f"the GAP file has {pages} source page{'s' * (pages != 1)} (--no-gap leaves it out)"
            )
    if not reasons:
        return None
    return " and ".join(reasons) + f"; {DEFAULT_FOLDS} folds need {DEFAULT_FOLDS} each"


#: the bootstrap resamples whole documents when a data set has at least this many (fewer say
#: little about other documents: it resamples sentences, or GAP rows, then, and says so)
MIN_RESAMPLED_DOCUMENTS = 20


def resampling_unit(documents: Sequence[str] | None) -> str:
    """``"documents"`` when ``documents`` (one id per item) holds at least
    :data:`MIN_RESAMPLED_DOCUMENTS` distinct ids, else ``"items"``."""
    if documents is None:
        return "items"
    return "documents" if len(set(documents)) >= MIN_RESAMPLED_DOCUMENTS else "items"


def small_data_notes(data: dict[str, Any], folds_off: str | None, replicates: int) -> list[str]:
    """One line for each way the role statistics fell back on small data: no folds by default
    (``folds_off``, from :func:`no_folds_reason`), and a bootstrap over sentences or GAP rows
    (``data``: a :class:`~headlab.roles.measure.RoleReport`'s) instead of whole documents."""
    notes = []
    if folds_off:
        stability = "stability is the bootstrap's, and " if replicates else ""
        notes.append(f"no folds ({folds_off}): {stability}roles are not checked for replication")
    for name, label, unit in (("treebank", "treebank", "sentences"), ("gap", "GAP", "rows")):
        if (data.get(name) or {}).get("resampled") == unit:
            notes.append(
                f"the bootstrap resamples {label} {unit}, not documents: fewer than "
                f"{MIN_RESAMPLED_DOCUMENTS} documents; intervals and stability then reflect "
                "these documents only"
            )
    return notes
