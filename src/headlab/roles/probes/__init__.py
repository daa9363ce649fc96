"""One module per probe. Each ``collect`` turns one layer's patterns of a batch into per-sentence
sums ``(B, H, ...)``; each ``scores`` turns corpus (and bootstrap) sums into per-head scores
``(R + 1, L, H)``. The formula and its source are in each module's docstring."""
