"""The statistics of role claims against scipy and NumPy loops: the exact McNemar test
(``scipy.stats.binomtest``), the Benjamini-Hochberg correction
(``scipy.stats.false_discovery_control`` and the textbook loop), Wilson intervals
(``BinomTestResult.proportion_ci(method="wilson")``)."""

from __future__ import annotations

import numpy as np
import pytest

from headlab.roles import stats

scipy_stats = pytest.importorskip("scipy.stats")


def test_mcnemar_exact_equals_scipy_binomtest() -> None:
    rng = np.random.default_rng(0)
    b = np.concatenate([rng.integers(0, 40, 300), rng.integers(0, 2000, 100), [0, 0, 5, 1000]])
    c = np.concatenate([rng.integers(0, 40, 300), rng.integers(0, 2000, 100), [0, 7, 5, 1400]])
    ours = stats.mcnemar_exact(b, c)
    ref = [
        scipy_stats.binomtest(int(x), int(x + y), 0.5).pvalue if x + y else 1.0
        for x, y in zip(b, c, strict=True)
    ]
    # relative agreement where representable; both underflow to 0 together
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-300)
    assert ours.shape == b.shape and ours[0 if b[0] + c[0] else 1] <= 1.0


def test_benjamini_hochberg_equals_scipy_and_a_loop() -> None:
    rng = np.random.default_rng(1)
    p = np.concatenate([rng.uniform(size=200), rng.uniform(0, 1e-4, 30), [0.0, 1.0, 0.03, 0.03]])
    np.testing.assert_allclose(
        stats.benjamini_hochberg(p), scipy_stats.false_discovery_control(p, method="bh")
    )
    # families: each row on its own, masked tests left out of the family's size
    fam = rng.uniform(size=(3, 40))
    valid = rng.uniform(size=(3, 40)) < 0.6
    q = stats.benjamini_hochberg(fam, valid)
    for row in range(3):
        keep = fam[row, valid[row]]
        m = keep.size
        # the textbook definition, as a loop: q_i = min over j with p_j >= p_i of p_j m / rank_j
        order = np.argsort(keep)
        loop = np.empty(m)
        for i in range(m):
            loop[order[i]] = min(min(keep[order[j]] * m / (j + 1), 1.0) for j in range(i, m))
        np.testing.assert_allclose(q[row, valid[row]], loop)
        assert np.isnan(q[row, ~valid[row]]).all()


def test_wilson_interval_equals_scipy() -> None:
    for hits, n in ((0, 10), (10, 10), (57, 100), (1958, 2015), (3, 7)):
        low, high = stats.wilson(hits, n)
        ref = scipy_stats.binomtest(hits, n).proportion_ci(0.95, method="wilson")
        assert float(low) == pytest.approx(ref.low, abs=1e-12)
        assert float(high) == pytest.approx(ref.high, abs=1e-12)
    low, high = stats.wilson(np.array([0.0]), np.array([0.0]))
    assert np.isnan(low).all() and np.isnan(high).all()


def test_clustered_wilson_is_wilson_on_the_effective_count() -> None:
    # resamples that vary three times as much as 900 independent items: 900 arcs count as 300
    p, n = 1 / 3, 900
    reps = np.random.default_rng(0).normal(p, np.sqrt(3 * p * (1 - p) / n), size=20_000)
    low, high, deff = stats.clustered_wilson(300, n, reps)
    assert deff == pytest.approx(3.0, rel=0.03)
    ref = scipy_stats.binomtest(100, 300).proportion_ci(0.95, method="wilson")
    assert low == pytest.approx(ref.low, abs=2e-3) and high == pytest.approx(ref.high, abs=2e-3)
    # no clustering (or less spread than independence): the plain Wilson interval
    plain = scipy_stats.binomtest(300, n).proportion_ci(0.95, method="wilson")
    for few in (None, np.array([0.3]), np.full(50, p)):
        low, high, deff = stats.clustered_wilson(300, n, few)
        assert deff == 1.0 and (low, high) == pytest.approx((plain.low, plain.high), abs=1e-12)


def test_clustered_wilson_covers_new_documents() -> None:
    """Documents with their own rates (as genres and authors differ): the plain Wilson interval
    over arcs misses the true rate far more often than 5%; the interval over documents, with
    its design effect from a Poisson bootstrap of the documents, keeps close to 95%."""
    rng = np.random.default_rng(1)
    n_docs, per_doc, trials, reps = 40, 25, 300, 200
    plain_hits = clustered_hits = 0
    for _ in range(trials):
        rates = rng.beta(6.0, 4.0, size=n_docs)  # true mean rate 0.6
        right = rng.binomial(per_doc, rates)  # (docs,) right arcs per document
        w = rng.poisson(1.0, size=(reps, n_docs))  # documents drawn into each resample
        shares = (w * right).sum(1) / np.maximum((w * per_doc).sum(1), 1)
        hits, n = float(right.sum()), float(n_docs * per_doc)
        low, high = stats.wilson(hits, n)
        plain_hits += bool(low <= 0.6 <= high)
        c_low, c_high, _ = stats.clustered_wilson(hits, n, shares)
        clustered_hits += bool(c_low <= 0.6 <= c_high)
    assert plain_hits / trials < 0.75
    assert clustered_hits / trials > 0.90


def test_paired_test_over_documents_keeps_its_level() -> None:
    """Head and baseline equally good on average, but documents differ in which is better (as
    genres and authors do): McNemar over arcs as independent pairs calls a difference far more
    often than 5%; divided by the paired difference's design effect, from a Poisson bootstrap
    of the documents, it keeps close to its level."""
    rng = np.random.default_rng(2)
    n_docs, per_doc, trials, reps = 40, 25, 300, 200
    plain = adjusted = 0
    for _ in range(trials):
        shift = rng.normal(0.0, 0.2, size=n_docs)  # the head's edge in each document
        base = rng.uniform(size=(n_docs, per_doc)) < 0.5
        head = rng.uniform(size=(n_docs, per_doc)) < np.clip(0.5 + shift, 0, 1)[:, None]
        b_doc = (head & ~base).sum(1)
        c_doc = (~head & base).sum(1)
        b, c, n = b_doc.sum(), c_doc.sum(), n_docs * per_doc
        w = rng.poisson(1.0, size=(reps, n_docs))
        diffs = (w * (b_doc - c_doc)).sum(1) / np.maximum((w * per_doc).sum(1), 1)
        deff = stats.paired_design_effect(b, c, n, diffs[:, None])[0]
        plain += bool(stats.mcnemar_exact(b, c) < 0.05)
        adjusted += bool(stats.mcnemar_exact(b / deff, c / deff) < 0.05)
    assert plain / trials > 0.2
    assert adjusted / trials < 0.09


def test_paired_design_effect_is_one_without_clustering() -> None:
    # replicates that vary as independent pairs do (or less): no correction
    b, c, n = 120, 80, 1000
    d = (b - c) / n
    var = ((b + c) / n - d * d) / n
    reps = np.random.default_rng(0).normal(d, np.sqrt(var), size=(20_000, 1))
    assert float(stats.paired_design_effect(b, c, n, reps)[0]) == pytest.approx(1.0, abs=0.03)
    assert float(stats.paired_design_effect(b, c, n, reps[:1])[0]) == 1.0  # one replicate
    assert float(stats.paired_design_effect(0, 0, n, reps)[0]) == 1.0  # no discordant pairs
    wide = np.random.default_rng(1).normal(d, 2 * np.sqrt(var), size=(20_000, 1))
    assert float(stats.paired_design_effect(b, c, n, wide)[0]) == pytest.approx(4.0, rel=0.05)
