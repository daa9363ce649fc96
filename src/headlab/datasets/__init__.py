"""Gold data readers (UD treebanks, GAP, STS-B) and the small samples shipped with headlab.

The samples behind the default commands live in ``headlab/datasets/samples`` with their licenses
(see ``samples/ATTRIBUTION.md``); full data sets are read from wherever the user keeps them.
"""

from headlab.datasets.gap import GapExample, read_gap
from headlab.datasets.samples import sample_path
from headlab.datasets.stsb import StsPair, read_stsb
from headlab.datasets.treebank import (
    TreebankData,
    TreebankSentence,
    read_conllu,
    read_frequencies,
    read_treebank,
    word_frequencies,
)

__all__ = [
    "GapExample",
    "StsPair",
    "TreebankData",
    "TreebankSentence",
    "read_conllu",
    "read_frequencies",
    "read_gap",
    "read_stsb",
    "read_treebank",
    "sample_path",
    "word_frequencies",
]
