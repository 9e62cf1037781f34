"""The rehearsal (test_rehearsal.py) of the ALFWorld experiments, on the test games of
tests/data/alfworld (ALFWorld's own data cannot be downloaded here)."""

from __future__ import annotations

import pytest

from test_alfworld import generate_games
from test_rehearsal import EXPERIMENTS, check_run, family_param, fixtures, overrides, rehearse  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def alfworld_data(tmp_path_factory):
    return generate_games(tmp_path_factory.mktemp("alfworld"))


@pytest.mark.parametrize("name", [family_param(e) for e in EXPERIMENTS if e.startswith("alfworld") and "qlora" not in e])
def test_alfworld_experiment_runs_bc_eto_iter_eval_on_its_family(name, fixtures, alfworld_data, tmp_path):
    check_run(rehearse(overrides(name, fixtures, alfworld_data, tmp_path)))
