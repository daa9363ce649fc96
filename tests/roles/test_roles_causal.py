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


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_query_blocks_give_the_same_statistics(tmp_path: Path, family: str) -> None:
    from headlab.datasets import read_gap

    lm = load(build(family, tmp_path / family))
    tb = read_conllu(sample_path("treebank"), limit=16)
    gap = read_gap(sample_path("gap"), limit=6)
    opts = {"replicates": 3, "induction_sequences": 4, "induction_length": 8}
    whole = measure_roles(lm, tb, gap=gap, options=RoleOptions(**opts))
    # blocks of a few query rows: every probe must add up across blocks
    blocked = measure_roles(lm, tb, gap=gap, options=RoleOptions(**opts, block_elements=500))
    for a, b in zip(whole.heads, blocked.heads, strict=True):
        assert a.role == b.role
        for key, value in a.scores.items():
            assert value == pytest.approx(b.scores[key], abs=1e-5), key
    assert [r.accuracy for r in whole.relations] == pytest.approx(
        [r.accuracy for r in blocked.relations]
    )
    assert whole.coreference is not None and blocked.coreference is not None
    assert whole.coreference.accuracy == pytest.approx(blocked.coreference.accuracy)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_both_word_paths_give_the_same_statistics(
    tmp_path: Path, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short batches take word sums from the attention's product, long ones the block-wise
    word argmax: forcing either path on the same sentences changes no score."""
    from headlab.roles import passes

    lm = load(build(family, tmp_path / family))
    tb = read_conllu(sample_path("treebank"), limit=16)
    opts = RoleOptions(replicates=3, induction_sequences=4, induction_length=8)
    reports = []
    for limit in (0, 1 << 30):
        monkeypatch.setattr(passes, "DENSE_WORDS", limit)
        reports.append(measure_roles(lm, tb, options=opts))
    stream, dense = reports
    assert [r.accuracy for r in stream.relations] == [r.accuracy for r in dense.relations]
    assert [r.count for r in stream.relations] == [r.count for r in dense.relations]
    for a, b in zip(stream.heads, dense.heads, strict=True):
        assert a.role == b.role
        for key, value in a.scores.items():
            assert value == pytest.approx(b.scores[key], abs=1e-6), key


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_roles_of_a_model_pruned_layer_by_layer(tmp_path: Path, family: str) -> None:
    """A model with fewer heads in some layers gets a role for every remaining head. Layer 0
    sees only the embeddings, so its remaining heads score exactly as the same heads did before
    pruning."""
    from headlab.pruning import head_ids, prune_model

    path = build(family, tmp_path / family)
    tb = read_conllu(sample_path("treebank"), limit=12)
    opts = RoleOptions(replicates=3, induction_sequences=4, induction_length=8)
    whole = measure_roles(load(path), tb, options=opts)
    small_lm = prune_model(load(path), {0: [0, 2], 1: [1]})
    counts = list(small_lm.layout.heads_per_layer)
    assert len(set(counts)) > 1
    small = measure_roles(small_lm, tb, options=opts)
    assert len(small.heads) == sum(counts)
    assert small.to_json()["heads_in_layer"] == counts
    # each head keeps its id in the unpruned model: layer 0 lost heads 0 and 2, layer 1 head 1
    shown = small.to_json()["heads"]
    assert [h["original_head"] for h in shown if h["layer"] == 0] == [1, 3]
    assert [h["original_head"] for h in shown if h["layer"] == 1] == [0, 2, 3]
    grid = small.grid()
    for layer, count in enumerate(counts):
        assert grid[layer][count:] == ["-"] * (small.n_heads - count)
        assert "-" not in grid[layer][:count]
    for new, old in enumerate(head_ids(small_lm)[0]):
        before, after = whole.head(0, old), small.head(0, new)
        assert after.role == before.role
        for key, value in before.scores.items():
            assert after.scores[key] == pytest.approx(value, abs=1e-6, nan_ok=True), key
    for r in small.relations:  # best heads are heads that exist
        assert r.head < counts[r.layer]
    with pytest.raises(IndexError, match="layer 0 has heads"):
        small.head(0, counts[0])
