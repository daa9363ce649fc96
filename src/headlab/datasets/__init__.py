"""Gold data readers (UD treebanks, GAP, STS-B), passkey prompts (``passkey``), and the small
samples shipped with headlab.

The samples behind the default commands live in ``headlab/datasets/samples`` with their licenses
(see ``samples/ATTRIBUTION.md``); full data sets are read from wherever the user keeps them.
"""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.datasets.bundled import sample_path as sample_path
    from headlab.datasets.gap import GapExample as GapExample
    from headlab.datasets.gap import read_gap as read_gap
    from headlab.datasets.stsb import StsPair as StsPair
    from headlab.datasets.stsb import read_stsb as read_stsb
    from headlab.datasets.treebank import TreebankData as TreebankData
    from headlab.datasets.treebank import TreebankSentence as TreebankSentence
    from headlab.datasets.treebank import read_conllu as read_conllu
    from headlab.datasets.treebank import read_frequencies as read_frequencies
    from headlab.datasets.treebank import read_treebank as read_treebank
    from headlab.datasets.treebank import word_frequencies as word_frequencies

__getattr__, __dir__, __all__ = attach(__name__, __file__)
