"""The statistics behind a role claim: Wilson intervals, the exact McNemar test and the
Benjamini-Hochberg correction, in NumPy (scipy is only a test dependency; the tests check these
against ``scipy.stats``).

- :func:`wilson` is the 95% Wilson score interval of an accuracy (Wilson 1927): unlike the normal
  interval it stays inside [0, 1] and is honest for accuracies near 0 or 1 and small counts.
- :func:`clustered_wilson` is the same interval for items that come in documents: arcs of one
  document share topic, style and words, so they carry less information than as many
  independent arcs. The count is shrunk to the effective count ``n / deff`` (Kish 1965), where
  the design effect ``deff`` is the variance of the share over bootstrap resamples of whole
  documents divided by the variance ``p (1 - p) / n`` of independent items (at least 1).
- :func:`mcnemar_exact` compares a head with a baseline *on the same items*: only the discordant
  items count (head right and baseline wrong ``b``, the reverse ``c``); under "no difference" ``b``
  is Binomial(``b + c``, 1/2). The p-value is two-sided (twice the smaller tail, at most 1), which
  for p = 1/2 equals ``scipy.stats.binomtest(b, b + c).pvalue``.
- :func:`paired_design_effect` is the same correction for the paired test: McNemar's test
  takes the arcs as independent pairs; the discordant counts are divided by the design effect
  of the paired difference (the Rao-Scott correction, Rao & Scott 1992), measured from the
  bootstrap over documents, before the exact test.
- :func:`benjamini_hochberg` turns p-values into BH-adjusted ones (q-values): calling every test
  with q < alpha keeps the expected share of false claims among the claims at most alpha.
"""

from __future__ import annotations

import math

import numpy as np

#: the two-sided 95% normal quantile
Z95 = 1.959963984540054


def wilson(
    hits: np.ndarray | float, n: np.ndarray | float, z: float = Z95
) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` of the Wilson score interval of ``hits / n`` (NaN where ``n`` is 0).

    ``hits`` and ``n`` may be weighted (non-integer) counts; any shape, broadcast together.
    """
    hits = np.asarray(hits, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = hits / n
        z2 = z * z
        centre = (p + z2 / (2 * n)) / (1 + z2 / n)
        half = z / (1 + z2 / n) * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # exact ends where the share is 0 or 1 (the formula leaves rounding crumbs there)
    low = np.where(hits <= 0, 0.0, np.clip(centre - half, 0.0, 1.0))
    high = np.where(hits >= n, 1.0, np.clip(centre + half, 0.0, 1.0))
    low = np.where(n > 0, low, np.nan)
    high = np.where(n > 0, high, np.nan)
    return low, high


def clustered_wilson(
    hits: float, n: float, replicates: np.ndarray | None
) -> tuple[float, float, float]:
    """``(low, high, deff)``: the 95% Wilson interval of ``hits / n`` on the effective count
    ``n / deff``, ``deff`` from ``replicates`` (the share in each bootstrap resample of
    documents; NaN entries, resamples without items, are left out). Without two finite
    replicates, or with a share of 0 or 1, ``deff`` is 1: the plain Wilson interval."""
    deff = 1.0
    if n > 0 and 0.0 < hits < n and replicates is not None:
        r = np.asarray(replicates, dtype=np.float64)
        r = r[np.isfinite(r)]
        if r.size >= 2:
            p = hits / n
            deff = max(1.0, float(r.var(ddof=1)) / (p * (1.0 - p) / n))
    low, high = wilson(hits / deff, n / deff)
    return float(low), float(high), deff


def paired_design_effect(
    b: np.ndarray | float, c: np.ndarray | float, n: np.ndarray | float, replicates: np.ndarray
) -> np.ndarray:
    """Design effect (at least 1) of the paired difference ``(b - c) / n`` of each test.

    ``b``, ``c``: discordant counts (head right and baseline wrong, the reverse) and ``n`` the
    items, shape ``S``; ``replicates`` ``(R, *S)``: the difference in each bootstrap resample of
    documents (NaN where a resample has no items). The variance of independent pairs is
    ``((b + c) / n - ((b - c) / n) ** 2) / n``; where it is 0, or fewer than two replicates are
    finite, the design effect is 1.
    """
    b, c, n = (np.asarray(x, dtype=np.float64) for x in (b, c, n))
    b, c, n = np.broadcast_arrays(b, c, n)
    reps = np.asarray(replicates, dtype=np.float64)
    finite = np.isfinite(reps)
    k = finite.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(finite, reps, 0.0).sum(0) / k
        var_boot = np.where(finite, (reps - mean) ** 2, 0.0).sum(0) / (k - 1)
        d = (b - c) / n
        var_pairs = ((b + c) / n - d * d) / n
        deff = var_boot / var_pairs
    ok = (k >= 2) & (n > 0) & (var_pairs > 0) & np.isfinite(deff)
    return np.where(ok, np.maximum(deff, 1.0), 1.0)


def _log_factorials(n_max: int) -> np.ndarray:
    """``log(k!)`` for ``k = 0..n_max``."""
    out = np.zeros(n_max + 1)
    if n_max:
        out[1:] = np.cumsum(np.log(np.arange(1, n_max + 1, dtype=np.float64)))
    return out


def mcnemar_exact(b: np.ndarray | float, c: np.ndarray | float) -> np.ndarray:
    """Two-sided exact McNemar p-values for discordant counts ``b`` and ``c`` (any shape).

    Counts are rounded to integers (bootstrap weights are whole numbers; the full corpus's are
    exact); ``b + c == 0`` gives 1. The tail ``P(X <= min(b, c))`` of Binomial(n, 1/2) is summed
    in log space, so p-values far below the float range come out as 0, not as NaN.
    """
    b_arr = np.rint(np.nan_to_num(np.asarray(b, dtype=np.float64))).astype(np.int64)
    c_arr = np.rint(np.nan_to_num(np.asarray(c, dtype=np.float64))).astype(np.int64)
    b_arr, c_arr = np.broadcast_arrays(np.maximum(b_arr, 0), np.maximum(c_arr, 0))
    n = (b_arr + c_arr).ravel()
    k = np.minimum(b_arr, c_arr).ravel()
    out = np.ones(n.shape, dtype=np.float64)
    if n.size == 0:
        return out.reshape(b_arr.shape)
    logf = _log_factorials(int(n.max()))
    log_half = math.log(0.5)
    # group by the small tail's length: one (tests, k + 1) array per chunk of tests
    order = np.argsort(k, kind="stable")
    chunk = 256
    for lo in range(0, order.size, chunk):
        idx = order[lo : lo + chunk]
        kk, nn = k[idx], n[idx]
        j = np.arange(int(kk.max()) + 1)[None, :]  # (1, J)
        logpmf = (
            logf[nn][:, None]
            - logf[np.minimum(j, nn[:, None])]
            - logf[np.clip(nn[:, None] - j, 0, None)]
        )
        logpmf = logpmf + nn[:, None] * log_half
        logpmf = np.where(j <= kk[:, None], logpmf, -np.inf)
        top = logpmf.max(1, keepdims=True)
        tail = np.exp(top[:, 0]) * np.exp(logpmf - top).sum(1)
        out[idx] = np.minimum(1.0, 2.0 * tail)
    out[n == 0] = 1.0
    return out.reshape(b_arr.shape)


def benjamini_hochberg(p: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """BH-adjusted p-values of ``p`` over its last axis (each leading index is its own family).

    ``valid`` (same shape, bool) marks the tests of the family; the others get NaN and do not
    count in the family's size. Equals ``scipy.stats.false_discovery_control(p, method="bh")``
    on each family.
    """
    p = np.asarray(p, dtype=np.float64)
    valid = np.ones(p.shape, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    flat_p = p.reshape(-1, p.shape[-1]) if p.ndim else p.reshape(1, 1)
    flat_v = valid.reshape(flat_p.shape)
    out = np.full(flat_p.shape, np.nan)
    for row in range(flat_p.shape[0]):
        where = np.flatnonzero(flat_v[row])
        m = where.size
        if not m:
            continue
        values = flat_p[row, where]
        order = np.argsort(values, kind="stable")
        scaled = values[order] * m / np.arange(1, m + 1)
        adjusted = np.minimum.accumulate(scaled[::-1])[::-1]
        result = np.empty(m)
        result[order] = np.minimum(adjusted, 1.0)
        out[row, where] = result
    return out.reshape(p.shape)
