"""Confidence intervals for success rates (hand-written: a few lines, no SciPy needed): Wilson,
the paired task bootstrap, exact McNemar, and the two-stage (seeds, then tasks) bootstrap over seeds."""

from __future__ import annotations

import math


def wilson_ci(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default)."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def paired_bootstrap_ci(a: list[float], b: list[float], n_boot: int = 2000, seed: int = 0,
                        level: float = 0.95) -> tuple[float, float, float]:
    """Mean of b - a over paired items, with a percentile bootstrap interval (resampling items)."""
    import random

    if len(a) != len(b) or not a:
        raise ValueError(f"paired samples must be non-empty and equal in length ({len(a)} vs {len(b)})")
    diffs = [y - x for x, y in zip(a, b)]
    n = len(diffs)
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    lo_i = int((1 - level) / 2 * n_boot)
    hi_i = min(n_boot - 1, int((1 + level) / 2 * n_boot))
    return sum(diffs) / n, means[lo_i], means[hi_i]


def mcnemar_exact(a: list[bool], b: list[bool]) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes (binomial on discordant pairs)."""
    n01 = sum((not x) and y for x, y in zip(a, b))  # b succeeded where a failed
    n10 = sum(x and (not y) for x, y in zip(a, b))
    n = n01 + n10
    if n == 0:
        return 1.0
    k = min(n01, n10)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def _two_stage_means(diffs: list[list[float]], n_boot: int, seed: int) -> list[float]:
    """The two-stage bootstrap's statistic, ``n_boot`` draws: seeds resampled with replacement,
    then within each drawn seed its tasks (each draw of a seed resampled afresh); the statistic is
    the mean over the drawn seeds of each one's mean. Vectorised per seed with numpy (a Python loop
    over 5 seeds x hundreds of tasks x 2000 draws per arm and split took seconds)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    s = len(diffs)
    draws = rng.integers(s, size=(n_boot, s))  # which seeds each resample holds
    total = np.zeros(n_boot)
    for k, d in enumerate(diffs):
        rows = np.nonzero(draws == k)[0]  # one entry per time seed k was drawn (a row may repeat)
        if rows.size:
            arr = np.asarray(d, dtype=float)
            means = arr[rng.integers(len(arr), size=(rows.size, len(arr)))].mean(axis=1)
            np.add.at(total, rows, means)
    return (total / s).tolist()


def two_stage_bootstrap_ci(diffs: list[list[float]], n_boot: int = 2000, seed: int = 0,
                           level: float = 0.95) -> tuple[float, float, float]:
    """Seeds x tasks: ``diffs[s]`` are seed s's paired per-task differences (other - base on the
    tasks both played). (mean over seeds of each seed's mean difference, percentile interval of
    the two-stage bootstrap, :func:`_two_stage_means`) with the percentile indices of
    :func:`paired_bootstrap_ci`. Seed-to-seed spread and task sampling both widen it; a single
    seed gives the task bootstrap alone."""
    if not diffs or any(not d for d in diffs):
        raise ValueError(f"every seed needs at least one paired task ({[len(d) for d in diffs]} tasks per seed)")
    means = sorted(_two_stage_means(diffs, n_boot, seed))
    lo_i = int((1 - level) / 2 * n_boot)
    hi_i = min(n_boot - 1, int((1 + level) / 2 * n_boot))
    point = sum(sum(d) / len(d) for d in diffs) / len(diffs)
    return point, means[lo_i], means[hi_i]
