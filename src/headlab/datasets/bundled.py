"""Small samples of gold data shipped for the default commands, in ``samples/`` (licenses in
``samples/ATTRIBUTION.md``)."""

from __future__ import annotations

from pathlib import Path

SAMPLES = {
    "treebank": "en_ewt-ud-dev-sample.conllu",
    "gap": "gap-development-sample.tsv",
    "stsb": "sts-dev-ccbysa-sample.tsv",
    "frequencies": "en_ewt-ud-train-word-frequencies.tsv",
    # held-out text for causal models (headlab prune's perplexity)
    "shakespeare": "tinyshakespeare-sample.txt",
    # the lesson's sentence, parsed by hand (headlab heads --trace)
    "lesson": "lesson.conllu",
}


def sample_path(name: str) -> Path:
    """Path of a bundled sample: ``treebank``, ``gap``, ``stsb``, ``frequencies``,
    ``shakespeare`` or ``lesson``."""
    if name not in SAMPLES:
        raise KeyError(f"no sample {name!r}; samples: {', '.join(SAMPLES)}")
    return Path(__file__).with_name("samples") / SAMPLES[name]
