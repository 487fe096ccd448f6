"""Statistics on the small tables Spark hands back (numpy/scipy only).

Conventions: ``conf`` is a two-sided confidence level; one-sided p-values test
"candidate is worse"; random resampling uses ``numpy.random.default_rng(seed)``
so a report is reproducible.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats as _st

BOOTSTRAP_RESAMPLES = 2000


def mean_ci(mean: float, std: float, n: int, conf: float = 0.95) -> tuple[float, float]:
    """Student-t interval for a mean from (mean, sample std, n); NaNs if n < 2.

    Per-interval throughputs are mildly autocorrelated, so this interval is
    somewhat optimistic; the regression verdict uses rank tests instead."""
    if n is None or n < 2 or std is None or not math.isfinite(std):
        return (math.nan, math.nan)
    h = _st.t.ppf(0.5 + conf / 2, n - 1) * std / math.sqrt(n)
    return (mean - h, mean + h)


def mann_whitney_worse(candidate: np.ndarray, baseline: np.ndarray, higher_is_better: bool) -> float:
    """One-sided Mann-Whitney U p-value for "candidate is worse than baseline"."""
    c, b = np.asarray(candidate, float), np.asarray(baseline, float)
    if len(c) < 2 or len(b) < 2:
        return math.nan
    if np.all(c == c[0]) and np.all(b == b[0]) and c[0] == b[0]:
        return 1.0
    alt = "less" if higher_is_better else "greater"
    return float(_st.mannwhitneyu(c, b, alternative=alt, method="auto").pvalue)


def bootstrap_mean_ratio(candidate: np.ndarray, baseline: np.ndarray, conf: float = 0.95,
                         seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """Percentile-bootstrap CI of mean(candidate)/mean(baseline) - 1 (intervals
    resampled independently in each run group)."""
    c, b = np.asarray(candidate, float), np.asarray(baseline, float)
    if len(c) < 2 or len(b) < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    cm = c[rng.integers(0, len(c), (resamples, len(c)))].mean(axis=1)
    bm = b[rng.integers(0, len(b), (resamples, len(b)))].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = cm / bm - 1.0
    d = d[np.isfinite(d)]
    if d.size == 0:
        return (math.nan, math.nan)
    a = (1 - conf) / 2
    return (float(np.quantile(d, a)), float(np.quantile(d, 1 - a)))


def percentiles_of_matrix(hists: np.ndarray, upper_us: np.ndarray, qs: list[float]) -> np.ndarray:
    """Percentiles of many histograms at once: ``hists`` is (R, K) counts over
    ascending buckets with bounds ``upper_us`` (K,); returns (R, len(qs))."""
    cum = np.cumsum(hists, axis=1)
    total = cum[:, -1]
    out = np.empty((hists.shape[0], len(qs)))
    for j, q in enumerate(qs):
        # same rank rule as bench.trace.percentile_rank, vectorised
        ranks = np.maximum(1.0, np.ceil(q / 100.0 * total - 1e-9))
        idx = (cum < ranks[:, None]).sum(axis=1)
        idx = np.minimum(idx, hists.shape[1] - 1)
        out[:, j] = np.where(total > 0, upper_us[idx], np.nan)
    return out


def bootstrap_latency(base: np.ndarray, cand: np.ndarray, upper_us: np.ndarray, qs: list[float],
                      conf: float = 0.95, seed: int = 0,
                      resamples: int = 1000) -> list[tuple[float, float, float]]:
    """Bootstrap over intervals for candidate/baseline percentile ratios.

    ``base``/``cand`` are (intervals, K) per-interval bucket counts on a shared
    ascending bucket axis. Each resample draws intervals with replacement,
    merges their histograms and takes the percentile. Returns per q
    ``(ci_low, ci_high, p_worse)`` of the relative change, where ``p_worse``
    = share of resamples in which the candidate is *not* higher (one-sided
    bootstrap p-value for "candidate latency is higher").
    """
    if base.shape[0] < 2 or cand.shape[0] < 2:
        return [(math.nan, math.nan, math.nan)] * len(qs)
    rng = np.random.default_rng(seed)

    def resampled(m: np.ndarray) -> np.ndarray:
        n = m.shape[0]
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)
        return percentiles_of_matrix(w @ m.astype(np.float64), upper_us, qs)

    b, c = resampled(base), resampled(cand)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = c / b - 1.0
    a = (1 - conf) / 2
    out = []
    for j in range(len(qs)):
        dj = d[:, j][np.isfinite(d[:, j])]
        if dj.size == 0:
            out.append((math.nan, math.nan, math.nan))
            continue
        p = (np.count_nonzero(dj <= 0) + 1) / (dj.size + 1)
        out.append((float(np.quantile(dj, a)), float(np.quantile(dj, 1 - a)), float(p)))
    return out


def median_ci(x: np.ndarray, conf: float = 0.95) -> tuple[float, float, float, float]:
    """Median with a distribution-free order-statistic CI.

    Returns (median, low, high, achieved_confidence). With n < 6 no pair of
    order statistics reaches 95 %, so the range [min, max] is returned with
    its (lower) achieved confidence 1 - 2 * 0.5**n.
    """
    x = np.sort(np.asarray(x, float))
    n = len(x)
    if n == 0:
        return (math.nan, math.nan, math.nan, math.nan)
    med = float(np.median(x))
    if n == 1:
        return (med, math.nan, math.nan, math.nan)
    # largest k with P(Binom(n, .5) <= k - 1) <= (1-conf)/2 ; CI = [x_(k), x_(n-k+1)]
    alpha = (1 - conf) / 2
    k = 0
    for j in range(1, n // 2 + 1):
        if _st.binom.cdf(j - 1, n, 0.5) <= alpha:
            k = j
    if k == 0:
        return (med, float(x[0]), float(x[-1]), 1 - 2 * 0.5 ** n)
    achieved = 1 - 2 * _st.binom.cdf(k - 1, n, 0.5)
    return (med, float(x[k - 1]), float(x[n - k]), float(achieved))
