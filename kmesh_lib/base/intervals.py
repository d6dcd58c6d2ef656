"""Percentile bootstrap intervals (scipy.stats.bootstrap), one place for every section's resampling.

Seeded: the same samples give the same interval, so a table recomputed from raw/ equals the recorded one.
"""
from __future__ import annotations

import numpy as np


def bootstrap_interval(samples: tuple, statistic, paired: bool, resamples: int = 10000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """(low, high) of ``statistic(*samples, axis)`` by scipy's percentile bootstrap; NaNs when a sample
    has fewer than two values (no spread to resample)."""
    if any(len(s) < 2 for s in samples):
        return float("nan"), float("nan")
    from scipy.stats import bootstrap

    kwargs = dict(paired=paired, vectorized=True, n_resamples=resamples, confidence_level=level, method="percentile")
    arrays = tuple(np.asarray(s, dtype=float) for s in samples)
    try:
        res = bootstrap(arrays, statistic, rng=np.random.default_rng(seed), **kwargs)
    except TypeError:  # scipy before 1.15 names it random_state
        res = bootstrap(arrays, statistic, random_state=np.random.default_rng(seed), **kwargs)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def median_of_differences(diffs, resamples: int = 10000, seed: int = 0,
                          level: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high) of paired differences (one sample, each value already a pair's difference)."""
    diffs = np.asarray(diffs, dtype=float)
    if diffs.size == 0:
        return float("nan"), float("nan"), float("nan")
    low, high = bootstrap_interval((diffs,), lambda x, axis: np.median(x, axis=axis), paired=False,
                                   resamples=resamples, seed=seed, level=level)
    return float(np.median(diffs)), low, high


def median_difference(a, b, resamples: int = 10000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(median(a) - median(b), low, high): two independent samples, each resampled on its own."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size == 0 or b.size == 0:
        return float("nan"), float("nan"), float("nan")
    low, high = bootstrap_interval((a, b), lambda x, y, axis: np.median(x, axis=axis) - np.median(y, axis=axis),
                                   paired=False, resamples=resamples, seed=seed, level=level)
    return float(np.median(a) - np.median(b)), low, high
