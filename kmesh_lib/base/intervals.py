"""Percentile bootstrap intervals (scipy.stats.bootstrap), one place for every section's resampling.

Seeded: the same samples give the same interval, so a table recomputed from raw/ equals the recorded one.
Being a function of its arguments alone, an interval is computed once per process for given samples,
statistic and resampling (``_KEPT`` of them): one verify builds a section's tables several times, and
the tamper suite verifies unchanged copies of a run many times.
"""
from __future__ import annotations

import hashlib

import numpy as np
from cachetools import LRUCache

_KEPT = 4096
_INTERVALS: LRUCache = LRUCache(maxsize=_KEPT)  # key -> (low, high); least recently used dropped first


def _key(arrays: tuple, statistic, paired: bool, resamples: int, seed: int, level: float) -> tuple | None:
    """The interval's inputs, exactly; None for a statistic that carries state of its own (a closure, defaults),
    which is then never cached."""
    code = getattr(statistic, "__code__", None)
    if code is None or getattr(statistic, "__closure__", None) or getattr(statistic, "__defaults__", None):
        return None
    samples = tuple((a.dtype.str, a.shape, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()) for a in arrays)
    return (code, paired, resamples, seed, level, samples)


def bootstrap_interval(samples: tuple, statistic, paired: bool, resamples: int = 10000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """(low, high) of ``statistic(*samples, axis)`` by scipy's percentile bootstrap; NaNs when a sample
    has fewer than two values (no spread to resample)."""
    if any(len(s) < 2 for s in samples):
        return float("nan"), float("nan")
    from scipy.stats import bootstrap

    kwargs = dict(paired=paired, vectorized=True, n_resamples=resamples, confidence_level=level, method="percentile")
    arrays = tuple(np.asarray(s, dtype=float) for s in samples)
    key = _key(arrays, statistic, paired, resamples, seed, level)
    if key is not None and key in _INTERVALS:
        return _INTERVALS[key]  # (reading it makes it the most recently used)
    try:
        res = bootstrap(arrays, statistic, rng=np.random.default_rng(seed), **kwargs)
    except TypeError:  # scipy before 1.15 names it random_state
        res = bootstrap(arrays, statistic, random_state=np.random.default_rng(seed), **kwargs)
    interval = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if key is not None:
        _INTERVALS[key] = interval
    return interval


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


# -- serial correlation: a bootstrap interval treats its samples as independent; measurements taken one after
# another on one machine may not be (a run of slow ones, then a run of fast ones) --
MIN_SERIAL_SAMPLES = 8  # fewer: no lag-1 estimate worth reading


def lag1_autocorrelation(values) -> float | None:
    """Lag-1 autocorrelation of ``values`` in the order they were measured; None for fewer than
    ``MIN_SERIAL_SAMPLES`` or a constant series."""
    x = np.asarray(values, dtype=float)
    # constant: equal values (their float std can come out a hair above 0, and their "correlation" 1)
    if x.size < MIN_SERIAL_SAMPLES or np.ptp(x[:-1]) == 0 or np.ptp(x[1:]) == 0:
        return None
    return float(np.corrcoef(x[:-1], x[1:])[0, 1])


def serial_inflation(lag1: float | None, n: int) -> float:
    """The factor a half-width from independent resampling is widened by where serial correlation is measured: where
    ``lag1`` exceeds white noise's 95% bound (1.96 / sqrt(n), Bartlett), sqrt((1 + r) / (1 - r)), the standard-error
    inflation of an AR(1) series' mean (a median's is about the same); else 1. Infinite for r >= 1."""
    if lag1 is None or n < MIN_SERIAL_SAMPLES or lag1 <= white_noise_bound(n):
        return 1.0
    return float("inf") if lag1 >= 1 else float(np.sqrt((1 + lag1) / (1 - lag1)))


def white_noise_bound(n: int) -> float:
    """Bartlett's 95% bound on a lag-1 autocorrelation of ``n`` independent values, 1.96 / sqrt(n)."""
    return 1.96 / np.sqrt(n)


def correlation(x, y, level: float = 0.95) -> tuple[float, float, float, float] | None:
    """Pearson's r of paired ``x`` and ``y`` (in the order they were measured) with its ``level`` interval by Fisher's
    z, and the effective number of pairs that interval was drawn from: where both series run in streaks (lag-1
    autocorrelations of one sign), Bartlett's n (1 - rx ry) / (1 + rx ry), else n; an interval from independent
    pairs would be too narrow exactly where two streaky series seem to move together. (r, low, high, n_eff); the
    interval is [-1, 1] (nothing claimed) where n_eff is 3 or less; None for fewer than ``MIN_SERIAL_SAMPLES`` pairs or a
    constant side."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size < MIN_SERIAL_SAMPLES or x.std() == 0 or y.std() == 0:
        return None
    from scipy.stats import norm, pearsonr

    r = float(pearsonr(x, y).statistic)
    rx, ry = lag1_autocorrelation(x), lag1_autocorrelation(y)
    both = rx * ry if rx is not None and ry is not None else 0.0
    n_eff = x.size * (1 - both) / (1 + both) if both > 0 else float(x.size)
    if n_eff <= 3:
        return r, -1.0, 1.0, n_eff
    z, half = np.arctanh(np.clip(r, -0.999999, 0.999999)), norm.ppf(0.5 + level / 2) / np.sqrt(n_eff - 3)
    return r, float(np.tanh(z - half)), float(np.tanh(z + half)), n_eff


def median_interval(values, level: float = 0.95) -> tuple[float, float, float, float]:
    """(median, low, high, coverage) of ``values``: the distribution-free interval of a median from its order
    statistics, x(k) to x(n+1-k), with the largest k whose exact coverage 1 - 2 P(Binomial(n, 1/2) < k) is at least
    ``level`` (scipy.stats.binom). Where no k reaches it (n = 5 at 95%: the range covers 93.75%), the range and its
    own coverage, which the caller must say; NaNs for fewer than two values. Assumes only independent pairs, and at
    small n does not narrow to the values' range the way a percentile bootstrap of a median does."""
    x = np.asarray(values, dtype=float)
    x = np.sort(x[~np.isnan(x)])  # a missing value is no value (NaN would sort last and become a bound)
    n = x.size
    if n < 2:
        return (float(x[0]) if n else float("nan")), float("nan"), float("nan"), float("nan")
    from scipy.stats import binom

    def coverage(k: int) -> float:
        return float(1 - 2 * binom.cdf(k - 1, n, 0.5))

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return float(np.median(x)), float(x[k - 1]), float(x[n - k]), coverage(k)


def rank_correlation_interval(rho: float | None, n: int, level: float = 0.95) -> list[float | None]:
    """[low, high] of Spearman's ``rho`` over ``n`` pairs by Fisher's z with Fieller, Hartley and Pearson's standard
    error sqrt(1.06 / (n - 3)) (the pairs taken as independent); [None, None] without a rho or with 4 pairs or fewer."""
    if rho is None or n <= 4:
        return [None, None]
    from scipy.stats import norm

    z, half = np.arctanh(np.clip(rho, -0.999999, 0.999999)), norm.ppf(0.5 + level / 2) * np.sqrt(1.06 / (n - 3))
    return [round(float(np.tanh(z - half)), 3), round(float(np.tanh(z + half)), 3)]
