"""Importance, metrics and the progressive search, against independent computations."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.models.tiny import build

from headlab.datasets import read_stsb, sample_path
from headlab.errors import InputError
from headlab.models import load
from headlab.pruning.importance import ablation_importance, gradient_importance
from headlab.pruning.metrics import FidelityMetric, PerplexityMetric, StsbMetric, spearman
from headlab.pruning.progressive import progressive_prune


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory):
    lm = load(build("bert", tmp_path_factory.mktemp("bert") / "m"), dtype=torch.float64)
    return lm


@pytest.fixture(scope="module")
def pairs():
    return read_stsb(sample_path("stsb"), limit=24)


def test_spearman_matches_scipy() -> None:
    from scipy.stats import spearmanr

    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 6, (50,), generator=gen).double()  # many ties
    y = x + torch.randn(50, generator=gen)
    assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_gradient_importance_equals_finite_differences_on_weights(tiny_bert, pairs) -> None:
    """Michel et al.'s dL/dxi_h, checked without any hook: scaling head h's output by xi is
    scaling its columns of the output projection by xi."""
    lm = tiny_bert
    metric = StsbMetric(pairs, batch=len(pairs))  # one batch: E|g| = |g|
    imp = gradient_importance(lm, metric)
    raw = []
    eps = 1e-5
    for handles in lm.layers:
        weight = handles.out_proj.weight
        row = []
        for h in range(lm.n_heads):
            cols = slice(h * lm.head_dim, (h + 1) * lm.head_dim)
            saved = weight.data[:, cols].clone()
            values = []
            for scale in (1 + eps, 1 - eps):
                weight.data[:, cols] = saved * scale
                with torch.no_grad():
                    values.append(float(next(metric.loss_batches(lm))))
            weight.data[:, cols] = saved
            row.append(abs(values[0] - values[1]) / (2 * eps))
        raw.append(torch.tensor(row, dtype=torch.float64))
    for layer, row in enumerate(raw):
        assert torch.allclose(imp[layer], row / row.norm(), atol=1e-5)


def test_ablation_importance_is_the_metric_loss(tiny_bert, pairs) -> None:
    metric = StsbMetric(pairs)
    imp = ablation_importance(tiny_bert, metric, {0: [1]})
    base = metric.evaluate(tiny_bert, {0: [1]})
    assert torch.isnan(imp[0, 1])
    assert float(imp[1, 2]) == pytest.approx(base - metric.evaluate(tiny_bert, {0: [1], 1: [2]}))


def test_fidelity_is_100_unpruned_and_drops_when_heads_go(tiny_bert, pairs) -> None:
    texts = [p.first for p in pairs]
    fid = FidelityMetric.build(tiny_bert, texts)
    assert fid.evaluate(tiny_bert) == pytest.approx(100.0)
    assert fid.evaluate(tiny_bert, {0: [0, 1, 2], 1: [0]}) < 100.0


def test_progressive_search_rules(tiny_bert, pairs) -> None:
    texts = [p.first for p in pairs] + [p.second for p in pairs]
    fid = FidelityMetric.build(tiny_bert, texts)
    search = progressive_prune(tiny_bert, fid, fid, fraction=0.75, step=0.25)
    # 8 heads, 2 per step, until 6 are gone; every layer keeps at least one head
    assert [p.heads_removed for p in search.points] == [0, 2, 4, 6]
    for p in search.points:
        assert all(len(v) < tiny_bert.n_heads for v in p.removed.values())
        assert p.metric == pytest.approx(fid.evaluate(tiny_bert, p.removed))
    # the stop rule: the chosen point is the last one within the allowed loss
    limit = search.points[2].loss + 1e-9
    stopped = progressive_prune(tiny_bert, fid, fid, fraction=0.75, step=0.25, max_loss=limit)
    assert stopped.chosen.loss <= limit
    assert all(p.loss <= limit for p in stopped.points[:-1])
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(InputError, match=r"must be in \(0, 1\)"):
            progressive_prune(tiny_bert, fid, fid, fraction=bad)


def test_gqa_pruning_takes_whole_groups_and_uniform_is_uniform(tmp_path: Path) -> None:
    lm = load(build("llama", tmp_path / "m", lm_head=True), with_lm_head=True)
    text = (sample_path("treebank").read_text()[:20000]).replace("\t", " ")
    ppl = PerplexityMetric.from_text(lm, text, window=32, max_windows=6)
    assert ppl.evaluate(lm) > 1.0
    search = progressive_prune(lm, ppl, ppl, fraction=0.5, step=0.5, uniform=True)
    assert search.unit_kind == "KV groups"
    removed = search.chosen.removed
    assert sorted(len(v) for v in removed.values()) == [2, 2]  # one group of 2 from each layer
    for heads in removed.values():
        assert heads in ([0, 1], [2, 3])


def test_perplexity_refuses_encoders(tiny_bert) -> None:
    with pytest.raises(InputError, match="needs a causal language model"):
        PerplexityMetric.from_text(tiny_bert, "some text " * 100)
