"""Roles on causal models (tiny random GPT-2 and GQA Llama): induction scores."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.models.tiny import build

from headlab.datasets import read_conllu, sample_path
from headlab.models import load
from headlab.roles import RoleOptions, measure_roles


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_causal_models_get_induction_scores(tmp_path: Path, family: str) -> None:
    lm = load(build(family, tmp_path / family))
    tb = read_conllu(sample_path("treebank"), limit=12)
    opts = RoleOptions(replicates=5, induction_sequences=6, induction_length=10)
    report = measure_roles(lm, tb, options=opts)
    assert len(report.heads) == lm.n_layers * lm.n_heads
    for head in report.heads:
        ind = head.scores["induction"]
        assert ind is not None and 0.0 <= ind <= 1.0
        assert 0.0 <= head.scores["delimiter"] <= 1.0 + 1e-6
        assert head.stability is not None
    # a causal head sees one key at the first position: the entropy ratio skips such rows
    assert all(h.scores["broad"] is not None for h in report.heads)
