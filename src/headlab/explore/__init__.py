"""One sentence, every head: the analyses behind the live explorer and the notebook view.

- :mod:`headlab.explore.table`: the rows of ``headlab heads --json`` (one per head: the words a
  chosen word attends to most), shared by the command and the explorer's JSON API.
- :mod:`headlab.explore.sentence`: :func:`capture`, a sentence's word- and token-level patterns
  of every head in one forward pass, shown in Jupyter by ``_repr_html_``.
- :mod:`headlab.explore.ablation`: what switching heads off does to the next-token prediction
  of a decoder, or to an encoder's mean-pooled sentence embedding.
- :mod:`headlab.explore.shelf`: the models the explorer offers, each loaded once on first use.
- :mod:`headlab.explore.roles`: the roles run shown beside a head (a file given, or the cache).
- :mod:`headlab.explore.request`: a ``headlab heads`` request, checked before a model loads.
- :mod:`headlab.explore.heads_text`: what ``headlab heads`` prints: its tables and patch grids.

Nothing here is imported by ``import headlab.explore`` itself: the table's module stays free of
torch, so ``headlab heads --help`` stays fast.
"""
