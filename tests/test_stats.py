from __future__ import annotations

import math

import pytest

from eto_train.stats import wilson_ci


def test_wilson_matches_a_hand_computation():
    # k=7, n=20, z=1.96: p=.35, centre=(.35+.096)/(1.19208)=.3741, half=1.96*sqrt(.011375+.0024)/1.19208
    z = 1.959964
    p = 0.35  # n = 20
    centre = (p + z * z / 40) / (1 + z * z / 20)
    half = z * math.sqrt(p * (1 - p) / 20 + z * z / 1600) / (1 + z * z / 20)
    lo, hi = wilson_ci(7, 20)
    assert lo == pytest.approx(centre - half) and hi == pytest.approx(centre + half)
    assert lo == pytest.approx(0.1812, abs=1e-4) and hi == pytest.approx(0.5671, abs=1e-4)


def test_wilson_edges():
    assert wilson_ci(0, 0) == (0.0, 0.0)
    lo, hi = wilson_ci(0, 10)
    assert lo == 0.0 and 0.25 < hi < 0.35
    lo, hi = wilson_ci(10, 10)
    assert hi == pytest.approx(1.0) and 0.65 < lo < 0.75


def test_mcnemar_exact_by_hand():
    from eto_train.stats import mcnemar_exact

    # 6 discordant pairs, all favouring b: p = 2 * (1/2)^6 = 0.03125
    a = [False] * 6 + [True] * 4
    b = [True] * 6 + [True] * 4
    assert mcnemar_exact(a, b) == pytest.approx(0.03125)
    # 3 vs 1 discordant: p = 2 * (C(4,0)+C(4,1)) / 16 = 0.625
    a = [False, False, False, True, True]
    b = [True, True, True, False, True]
    assert mcnemar_exact(a, b) == pytest.approx(0.625)
    assert mcnemar_exact([True, False], [True, False]) == 1.0


def test_paired_bootstrap_centres_on_the_mean_difference():
    from eto_train.stats import paired_bootstrap_ci

    a = [0, 0, 1, 1, 0, 1, 0, 0, 1, 0] * 5
    b = [1, 0, 1, 1, 1, 1, 0, 1, 1, 0] * 5
    mean, lo, hi = paired_bootstrap_ci(a, b, n_boot=1000, seed=1)
    assert mean == pytest.approx(0.3)
    assert lo < 0.3 < hi and lo > 0.1 and hi < 0.5
    with pytest.raises(ValueError, match="equal in length"):
        paired_bootstrap_ci([1], [1, 0])
