"""contrasts.py: the one registry of contrast kinds, and the pairs each kind builds (by hand)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from test_pairs import cpu_pairs, ep

from eto_train.contrasts import CONTRASTS, KINDS, contrast_kind
from eto_train.stages.eto.pairs import build_pairs

EXPERT = ep(["a", "b", "c"], 1.0)
AGENT = ep(["a", "x", "y"], 0.0, policy="bc")  # diverges at step 1 and loses


def test_the_config_offers_exactly_the_registry_kinds():
    for name in CONTRASTS:
        assert cpu_pairs(contrast=name).contrast == name
    with pytest.raises(ValidationError, match="contrast"):
        cpu_pairs(contrast="stepwise")


def test_every_kind_builds_from_at_least_one_source():
    for k in KINDS.values():
        assert k.trajectory or k.step or k.values or k.anchor, k.name
    assert contrast_kind("mixture").trajectory and contrast_kind("mixture").step and contrast_kind("mixture").mixed
    assert [n for n, k in KINDS.items() if k.expert_states] == ["step", "mixture", "step_value"]
    assert [n for n, k in KINDS.items() if k.sampled_states] == ["anchor"]


@pytest.mark.parametrize("name, kinds", [
    ("trajectory", {"trajectory": 1}),
    ("step", {"step": 1}),
    # one trajectory and one step pair: the step share 0.5 of the union keeps the one step pair
    ("mixture", {"trajectory": 1, "step": 1}),
])
def test_each_kind_builds_its_own_pairs_from_one_lost_episode(name, kinds):
    pairs, stats = build_pairs(cpu_pairs(contrast=name), {EXPERT.task_id: EXPERT}, [AGENT], [], seed=0)
    assert {k: v for k, v in stats["by_kind"].items() if v} == kinds
    step = [p for p in pairs if p.kind == "step"]
    assert all(p.step == 1 for p in step)  # the first divergence: "x" against the expert's "b"
